"""The report's figures of one diverged run against its reference, drawn from the run dirs.

Curves of every metric (report/plots.plot_group: a run of several masks with its
segments, a run stopped at a digest before its metrics moved said so), and the digest
heat maps (parameters: only the differing ones and the rest of their units; units x
steps around the first difference), which the page folds away.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.report import plots
from bisect_prefetch.report.plots import Segment
from bisect_prefetch.vocab import GRAPH_FILE, RUNS_DIR


@dataclass
class RunFigures:
    """A run's curves (None: no metric line to draw) and its digest heat maps."""

    caption: str
    curves: Path | None = None
    heat_maps: list[tuple[str, Path]] = field(default_factory=list)


def _earliest_differing_ranks(a, b) -> tuple[dict[str, Any], dict[str, Any]]:
    """Per metric, both runs' series on the rank where they differ first.

    A rank-local metric (each rank's own loss) can differ on one rank steps
    before the metrics rank shows it, and a run stopped at its first
    difference may never show it on the metrics rank at all.
    """
    out_a, out_b = {}, {}
    for name in a:
        if name not in b:
            continue
        best = None  # (first differing step or None, rank)
        for rank in sorted(set(a.per_rank) & set(b.per_rank)):
            sa, sb = a.per_rank[rank].get(name), b.per_rank[rank].get(name)
            if sa is None or sb is None:
                continue
            step = plots.first_differing_step(sa, sb)
            if best is None or (step is not None and (best[0] is None or step < best[0])):
                best = (step, rank)
        if best is None:
            continue
        rank = best[1]
        label = name if len(a.per_rank) == 1 else f"{name} (rank {rank})"
        out_a[label], out_b[label] = a.per_rank[rank][name], b.per_rank[rank][name]
    return out_a, out_b


def run_figures(state_dir: Path, run: dict[str, Any], *, name: str, title: str,
                segments: list[Segment] | None, out_dir: Path, index: int,
                heat_maps: bool = True) -> RunFigures | None:
    """A diverged run (a journal record) against its reference; None when it has none.

    name: how the page names the run (`run 7 (0011-search-k0)`); title: the figure's
    (never one mask for a run of several: the segments are drawn and named instead).
    """
    from bisect_prefetch.metrics.digest_files import digest_files, read_run_digests
    from bisect_prefetch.metrics.loading import load_run
    from bisect_prefetch.metrics.localize import units_in_graph

    reference = run.get("reference")
    if not reference or run.get("first_diff_step") is None:
        return None
    dir_a, dir_b = state_dir / RUNS_DIR / reference, state_dir / RUNS_DIR / str(run["run_id"])
    found = RunFigures(f"{name} against {reference}")
    try:
        a, b = load_run(dir_a), load_run(dir_b)
    except BisectPrefetchError:
        pass  # cleaned away, or stopped at its first differing digest before a metric line
    else:
        series_a, series_b = _earliest_differing_ranks(a, b)
        found.curves = plots.plot_group(
            series_a, series_b, out_dir / f"run-{index:02d}.png", title=title,
            labels=(reference, str(run["run_id"])), segments=segments,
            stopped_at=run["first_diff_step"] if run.get("outcome") == "stopped-early" else None)
    if heat_maps and digest_files(dir_a).found and digest_files(dir_b).found:
        units = units_in_graph(dir_b / GRAPH_FILE) or units_in_graph(dir_a / GRAPH_FILE)
        heat = plots.plot_digest_heatmap(
            read_run_digests(dir_a), read_run_digests(dir_b), out_dir / f"digests-{index:02d}.png",
            units=units or None,
            title="digests of the differing parameters and the rest of their units: red "
                  "differs, amber in one run only, grey equal")
        found.heat_maps.append((f"{name}: digests per parameter", heat))
        found.heat_maps.append(_unit_heatmap(dir_a, dir_b, run, units,
                                             out_dir / f"units-{index:02d}.png", name))
    return found


def _unit_heatmap(dir_a: Path, dir_b: Path, run: dict, units: list[str], path: Path,
                  name: str) -> tuple[str, Path]:
    """Units x steps around the first divergence: differing digests, the first one boxed."""
    from bisect_prefetch.metrics.localize import unit_step_differences
    from bisect_prefetch.report.localization import describe

    rows, steps, counts = unit_step_differences(dir_a, dir_b, units,
                                                around=run.get("first_diff_step"))
    where = run.get("localization")
    first = (where["unit"], where["step"]) if where else None
    heat = plots.plot_unit_heatmap(rows, steps, counts, path, first=first)
    return f"{name}: digests per unit" + (f"; {describe(where)}" if where else ""), heat
