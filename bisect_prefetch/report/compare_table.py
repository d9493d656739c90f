"""Terminal tables for `bisect-prefetch compare`: the metrics, then the digest localization.

Takes the compare JSON (CompareResult.to_json()), like the other report tables, so a table
can be rebuilt from a saved --json file.
"""

from __future__ import annotations

from rich.table import Table

from bisect_prefetch.report.table import STAT_FIELDS, fmt_number, fmt_step

SPREAD_SHOWN = 6  # steps of the digest spread listed in the table


def _missing(stats: dict) -> str:
    parts = []
    for side in ("a", "b"):
        n = stats.get(f"missing_in_{side}", 0)
        if n:
            parts.append(f"{n} in {side} (from {fmt_step(stats.get(f'first_missing_in_{side}'))})")
    return ", ".join(parts) or "-"


def metrics_table(result: dict) -> Table:
    """One row a metric: first differing step, MAE, P95, max abs, counts, missing steps."""
    table = Table(title="metrics", title_justify="left")
    table.add_column("metric")
    table.add_column("first diff step", justify="right")
    for _, title in STAT_FIELDS:
        table.add_column(title, justify="right")
    table.add_column("differing", justify="right")
    table.add_column("missing steps")
    for name, stats in result["metrics"].items():
        first = fmt_step(stats.get("first_diff_step"))
        if stats.get("first_diff_rank") is not None and stats.get("first_diff_step") is not None:
            first += f" (rank {stats['first_diff_rank']})"
        table.add_row(
            name,
            first,
            *(fmt_number(stats.get(field)) for field, _ in STAT_FIELDS),
            f"{stats.get('steps_differing', 0)}/{stats.get('steps_compared', 0)}",
            _missing(stats),
        )
    return table


def ranks_table(result: dict) -> Table | None:
    """Every rank's statistics for the metrics that differ on more than one logged rank;
    the rank that diverged first is marked. None when there is nothing to add."""
    rows = []
    for name, stats in result["metrics"].items():
        per_rank = stats.get("per_rank") or {}
        if len(per_rank) < 2 or stats.get("first_diff_step") is None:
            continue
        for rank, rs in sorted(per_rank.items(), key=lambda kv: int(kv[0])):
            mark = " (first)" if str(stats.get("first_diff_rank")) == rank else ""
            rows.append((name, rank + mark, fmt_step(rs.get("first_diff_step")),
                         *(fmt_number(rs.get(field)) for field, _ in STAT_FIELDS),
                         f"{rs.get('steps_differing', 0)}/{rs.get('steps_compared', 0)}"))
    if not rows:
        return None
    table = Table(title="per rank", title_justify="left")
    for header in ("metric", "rank", "first diff step", *(t for _, t in STAT_FIELDS), "differing"):
        table.add_column(header, justify="left" if header in ("metric", "rank") else "right")
    for row in rows:
        table.add_row(*row)
    return table


def digests_table(digests: dict) -> Table:
    """Where the gradient digests first differ and how the difference spreads."""
    table = Table(title="gradient digests", title_justify="left", show_header=False)
    table.add_column("what")
    table.add_column("value")
    table.add_row("first diff step", fmt_step(digests.get("first_diff_step")))
    for problem in digests.get("problems") or []:  # why "no difference" would prove nothing
        table.add_row("problem", problem)
    at_first = [f"rank {r['rank']}: {r['param']}" for r in digests.get("at_first", [])]
    table.add_row("differing there", "\n".join(at_first) or "-")
    spread = list(digests.get("spread", {}).items())
    shown = ", ".join(f"step {s}: {n}" for s, n in spread[:SPREAD_SHOWN])
    if len(spread) > SPREAD_SHOWN:
        shown += f", ... ({len(spread)} steps, {digests.get('records_differing', 0)} records)"
    table.add_row("spread", shown or "-")
    table.add_row("metrics first differ", fmt_step(digests.get("metric_first_diff_step")))
    lead = digests.get("lead_steps")
    table.add_row("digests lead by", "-" if lead is None else f"{lead} step(s)")
    if digests.get("missing_in_a") or digests.get("missing_in_b"):
        table.add_row("missing records", f"{digests.get('missing_in_a', 0)} in a, {digests.get('missing_in_b', 0)} in b")
    return table


def compare_tables(result: dict) -> list[Table]:
    """The tables `compare` prints: metrics, every rank's when several differ, then digests
    when both runs had them."""
    tables = [metrics_table(result)]
    if (ranks := ranks_table(result)) is not None:
        tables.append(ranks)
    if result.get("digests"):
        tables.append(digests_table(result["digests"]))
    return tables
