"""The self-contained HTML report of a state dir: verdict, graph, evidence, plots, reproduction.

`build_report(state_dir)` rebuilds it at any time from what the state dir
holds: the journal (every finished run, grouped here by protocol, mask,
guard and step count), the run dirs (metrics for the plots, graph.json for
the picture), and the result JSON a command left next to the journal
(bisect.json, matrix.json) for what the journal cannot say (the expectation of
a matrix cell, the bisection's confidence). Images are embedded as base64, so
the one file can be mailed or attached to an issue; the PNGs are also left in
`report/` beside it.
"""

from __future__ import annotations

import base64
import html
import json
import os
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.experiment import expectation_met
from bisect_prefetch.files import write_text_atomic
from bisect_prefetch.report import plots
from bisect_prefetch.report.stress import stress_line
from bisect_prefetch.report.table import fmt_step, matrix_rows, matrix_summary
from bisect_prefetch.runs.faults import fault_lines
from bisect_prefetch.runs.reuse import MANIFEST_FIELD
from bisect_prefetch.runs.reuse import summary as manifest_summary
from bisect_prefetch.runs.signals import describe_signals
from bisect_prefetch.runs.step_time import compare_runs
from bisect_prefetch.runs.store import JOURNAL, SUBMITTED, read_journal
from bisect_prefetch.search.protocol import mask_name
from bisect_prefetch.vocab import (
    BISECT_FILE,
    CONSISTENT,
    DIVERGED,
    EXPLAIN_FILE,
    GRAPH_FILE,
    MATRIX_FILE,
    PLOTS_DIR,
    REPORT_FILE,
    RUN_OUTCOMES,
    RUNS_DIR,
    USABLE_OUTCOMES,
)

MAX_PLOTTED_GROUPS = 12  # a long bisection has many groups; the diverged ones tell the story


@dataclass
class RunGroup:
    """Journal records of one protocol step's runs: same purpose, mask, guard and steps."""

    purpose: str
    mask: list[str] | None
    guard: str
    steps: int
    records: list[dict[str, Any]] = field(default_factory=list)

    @property
    def usable(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("outcome") in USABLE_OUTCOMES]

    @property
    def diverged_runs(self) -> list[dict[str, Any]]:
        return [r for r in self.usable if r.get("first_diff_step") is not None]

    @property
    def first_diff_step(self) -> int | None:
        return min((r["first_diff_step"] for r in self.diverged_runs), default=None)

    @property
    def verdict(self) -> str:
        """diverged, consistent, error (no usable run), or reference: runs compared with
        nothing (a golden trajectory, a graph discovery), which decide nothing alone."""
        if self.diverged_runs:
            return "diverged"  # a divergence is conclusive, even in a group of one run
        if not self.usable:
            return "error"
        if any(r.get("reference") is not None for r in self.usable):
            return "consistent"
        return "reference"

    def first_divergence(self) -> dict[str, Any] | None:
        runs = sorted(self.diverged_runs, key=lambda r: r["first_diff_step"])
        return runs[0] if runs else None


def outcome_counts_text(records: list[dict[str, Any]]) -> str:
    """How the runs ended, every kind named even at zero: `run outcomes: 5 ok, 1 error, ...`."""
    counts = Counter(r.get("outcome") for r in records)
    known = [f"{counts.pop(name, 0)} {name}" for name in RUN_OUTCOMES]
    other = [f"{n} {name}" for name, n in counts.items()]  # a journal from another version
    return "run outcomes: " + ", ".join(known + other)


def journal_groups(records: list[dict[str, Any]]) -> list[RunGroup]:
    """Group journal records, in the order their first run finished."""
    groups: dict[tuple, RunGroup] = {}
    for record in records:
        # The variant is `purpose@fingerprint`: an edited experiment starts new groups.
        variant = str(record.get("variant", "?"))
        mask = record.get("mask")
        key = (variant, None if mask is None else tuple(mask), record.get("guard", "none"),
               record.get("steps", 0))
        if key not in groups:
            groups[key] = RunGroup(variant.split("@", 1)[0], None if mask is None else list(mask),
                                   key[2], key[3])
        groups[key].records.append(record)
    return list(groups.values())


# -- reading the state dir ----------------------------------------------------
def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise BisectPrefetchError(f"cannot read {path}: {exc}") from None
    return data if isinstance(data, dict) else None


def _find_graph(state_dir: Path, records: list[dict[str, Any]]):
    """The prefetch graph of the newest run dir that recorded one."""
    from bisect_prefetch.graph import PrefetchGraph

    for record in reversed(records):
        path = state_dir / RUNS_DIR / str(record.get("run_id")) / GRAPH_FILE
        if path.is_file():
            return PrefetchGraph.load(path)
    return None


def _mask_label(mask: list[str] | None, edge_ids: list[str] | None) -> str:
    if mask is None:
        return "unchanged (recording only)"
    if edge_ids:
        from bisect_prefetch.select import describe

        return describe(frozenset(mask), edge_ids)
    return f"{len(mask)} edges on"


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


def _plot_group(state_dir: Path, group: RunGroup, title: str, out_dir: Path,
                index: int) -> list[tuple[str, Path]]:
    """The diverged group's first divergence against its reference, and its digests."""
    from bisect_prefetch.metrics.digest_files import digest_files, read_run_digests
    from bisect_prefetch.metrics.loading import load_run

    run = group.first_divergence()
    if run is None or not run.get("reference"):
        return []
    dir_a = state_dir / "runs" / run["reference"]
    dir_b = state_dir / "runs" / run["run_id"]
    found = []
    try:
        a, b = load_run(dir_a), load_run(dir_b)
    except BisectPrefetchError:
        pass  # cleaned away, or stopped at its first differing digest before a metric line
    else:
        series_a, series_b = _earliest_differing_ranks(a, b)
        path = plots.plot_group(
            series_a, series_b, out_dir / f"group-{index:02d}.png",
            title=title, labels=(run["reference"], run["run_id"]),
        )
        found.append((f"{title}: {run['reference']} vs {run['run_id']}", path))
    if digest_files(dir_a).found and digest_files(dir_b).found:
        heat = plots.plot_digest_heatmap(read_run_digests(dir_a), read_run_digests(dir_b),
                                         out_dir / f"digests-{index:02d}.png")
        found.append((f"{title}: gradient digests", heat))
        found.append(_unit_heatmap(dir_a, dir_b, run, out_dir / f"units-{index:02d}.png", title))
    return found


def _unit_heatmap(dir_a: Path, dir_b: Path, run: dict, path: Path,
                  title: str) -> tuple[str, Path]:
    """Units x steps around the first divergence: differing digests, the first one boxed."""
    from bisect_prefetch.metrics.localize import unit_step_differences, units_in_graph
    from bisect_prefetch.report.localization import describe

    units = units_in_graph(dir_b / GRAPH_FILE) or units_in_graph(dir_a / GRAPH_FILE)
    rows, steps, counts = unit_step_differences(dir_a, dir_b, units,
                                                around=run.get("first_diff_step"))
    where = run.get("localization")
    first = (where["unit"], where["step"]) if where else None
    heat = plots.plot_unit_heatmap(rows, steps, counts, path, first=first)
    return f"{title}: gradient digests per unit" + (f"; {describe(where)}" if where else ""), heat


# -- rendering ------------------------------------------------------------------
STYLE = """
body { font-family: sans-serif; margin: 2em; max-width: 1200px; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: left; }
td.num { text-align: right; font-family: monospace; }
tr.bad td { background: #fde2e2; }
.verdict { font-size: 1.4em; font-weight: bold; }
pre { background: #f4f4f4; padding: 0.8em; overflow-x: auto; }
figure { margin: 1em 0; } img { max-width: 100%; }
"""


def _esc(value: Any) -> str:
    return html.escape(str(value))


def _table(headers: list[str], rows: list[list[Any]], bad: list[bool] | None = None) -> str:
    out = ["<table>", "<tr>" + "".join(f"<th>{_esc(h)}</th>" for h in headers) + "</tr>"]
    for i, row in enumerate(rows):
        cls = ' class="bad"' if bad and bad[i] else ""
        cells = "".join(
            f'<td class="num">{_esc(v)}</td>' if isinstance(v, int | float) else f"<td>{_esc(v)}</td>"
            for v in row
        )
        out.append(f"<tr{cls}>{cells}</tr>")
    out.append("</table>")
    return "\n".join(out)


def _image(path: Path, alt: str) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return f'<img alt="{_esc(alt)}" src="data:image/png;base64,{data}">'


def render_html(
    *,
    title: str,
    verdict: str,
    facts: list[str],
    graph_png: Path | None,
    culprits: list[str],
    evidence: tuple[list[str], list[list[Any]]],
    matrix: dict[str, Any] | None,
    figures: list[tuple[str, Path]],
    reproduce: list[str],
    runs: list[list[Any]] | None = None,
    explain: dict[str, Any] | None = None,
    explained: list[dict[str, Any]] | None = None,
) -> str:
    """The report page; every argument is plain data, images are PNG files to embed."""
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_esc(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{_esc(title)}</h1>",
        f'<p class="verdict">verdict: {_esc(verdict)}</p>',
    ]
    if facts:
        parts.append("<ul>" + "".join(f"<li>{_esc(f)}</li>" for f in facts) + "</ul>")
    if graph_png is not None or culprits:
        parts.append("<h2>Prefetch graph</h2>")
        if culprits:
            parts.append("<p>culprit edges: " + ", ".join(
                f"<code>{_esc(e)}</code>" for e in culprits) + "</p>")
        if graph_png is not None:
            parts.append(f"<figure>{_image(graph_png, 'prefetch graph')}</figure>")
    if matrix is not None:
        headers, rows = matrix_rows(matrix)
        headers = [*headers, "first diff rank", "step time vs all-on"]
        rows = [[*row, _first_diff_ranks(cell), _cost_text(cell.get("step_time"))]
                for row, cell in zip(rows, matrix["cells"], strict=True)]
        parts.append("<h2>Matrix</h2>")
        parts.append(f"<p>{_esc(matrix_summary(matrix))}</p>")
        parts.append(_table(headers, rows, [not c["expectation_met"] for c in matrix["cells"]]))
    if explain and explain.get("first"):  # the first op that differs and its neighbours
        first = explain["first"]
        parts.append("<h2>First differing op</h2>")
        parts.append(f"<p>rank {_esc(first['rank'])}, step {_esc(first['step'])}, "
                     f"{_esc(first['phase'])} of {_esc(first['module'])}: <code>"
                     f"{_esc(first['op'])}</code> ({_esc(first['kind'])}); "
                     f"{_esc(first.get('detail') or '')}</p>")
        parts.append(f"<p>edge: <code>{_esc(first['edge'])}</code> ({_esc(first.get('edge_how'))})"
                     "</p>" if first.get("edge") else
                     f"<p>edge: none ({_esc(first.get('edge_note') or 'not tied to a prefetch')})</p>")
        near = explain.get("neighbours") or []
        parts.append(_table(["step", "op #", "op", "phase", "module", "differs", "at"],
                            [[n["step"], n["seq"], n["op"], n["phase"], n["module"],
                              n["differs"], n["at"]] for n in near],
                            [n["first"] for n in near]))
    if explained:  # bisect --explain: each cause's first divergence
        parts.append("<h2>First divergence of each cause</h2>")
        parts.append(_table(["cause", "first divergence", "kind", "edge"], [
            [", ".join(e["edges"]) or "every edge off",
             e.get("error") or (f"step {e['first']['step']}, rank {e['first']['rank']}, "
                                f"{e['first']['phase']} of {e['first']['module']}: "
                                f"{e['first']['op']}" if e.get("first") else e.get("verdict")),
             (e.get("first") or {}).get("kind") or "", e.get("edge") or "none"]
            for e in explained]))
    headers, rows = evidence
    if rows:
        parts.append("<h2>Evidence</h2>")
        parts.append(_table(headers, rows, [r[headers.index("verdict")] == "diverged"
                                            for r in rows] if "verdict" in headers else None))
    if figures:
        parts.append("<h2>Plots</h2>")
        for caption, path in figures:
            parts.append(f"<figure>{_image(path, caption)}"
                         f"<figcaption>{_esc(caption)}</figcaption></figure>")
    if reproduce:
        parts.append("<h2>Reproduce</h2>")
        parts.append("<pre>" + "\n".join(_esc(c) for c in reproduce) + "</pre>")
    if runs:
        parts.append("<h2>Runs</h2>")
        parts.append(_table(RUN_HEADERS, runs))
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


# -- building -------------------------------------------------------------------
def _bisect_evidence(bisect: dict[str, Any], groups: list[RunGroup],
                     edge_ids: list[str] | None) -> tuple[list[str], list[list[Any]]]:
    headers = ["step", "mask", "edges", "runs", "divergences", "errors", "first diff steps",
               "verdict", "step time vs all-on"]
    # Evidence rows name their mask (protocol.mask_name): the journal's runs of that mask.
    times: dict[str, list[Any]] = {}
    for g in groups:
        if g.purpose == "search" and g.mask is not None and edge_ids:
            name = mask_name(frozenset(g.mask), edge_ids)
            times.setdefault(name, []).extend(g.records)
    base = _all_on_runs(groups, edge_ids)
    rows = [[e.get("step", ""), e.get("mask", ""), e.get("edges", ""), e.get("runs", 0),
             e.get("divergences", 0), e.get("errors", 0),
             ", ".join(str(s) for s in e.get("first_diff_steps", [])) or "-",
             e.get("verdict", ""), _cost_text(compare_runs(base, times.get(e.get("mask"), [])))]
            for e in bisect.get("evidence", [])]
    return headers, rows


def _all_on_runs(groups: list[RunGroup], edge_ids: list[str] | None) -> list[Any]:
    """The baseline: every run with every edge on and no guard, its step times compared
    with a group's over the steps they all ran (runs/step_time.compare_runs)."""
    every = set(edge_ids or [])
    return [r for g in groups for r in g.records
            if g.guard == "none" and (g.mask is None or set(g.mask) == every)]


def _first_diff_ranks(cell: dict[str, Any]) -> str:
    """The rank each metric differed on first (matrix statistics), e.g. `loss: 1`."""
    ranks = [f"{name}: {stats['first_diff_rank']}" for name, stats in (cell.get("metrics") or {}).items()
             if (stats or {}).get("first_diff_rank") is not None]
    return ", ".join(ranks) or "-"


def _group_evidence(groups: list[RunGroup], edge_ids: list[str] | None):
    headers = ["runs of", "mask", "guard", "steps", "runs", "divergences", "errors",
               "first diff step", "verdict", "step time vs all-on"]
    base = _all_on_runs(groups, edge_ids)
    rows = [[g.purpose, _mask_label(g.mask, edge_ids), g.guard, g.steps, len(g.records),
             len(g.diverged_runs), len(g.records) - len(g.usable), fmt_step(g.first_diff_step),
             g.verdict, _cost_text(compare_runs(base, g.records))]
            for g in groups]
    return headers, rows


def _cost_text(cost: dict[str, Any] | None) -> str:
    if cost is None:
        return "-"
    if cost.get("meaningful") is False:
        return f"no figure: {cost['why']}" if cost["ratio"] is None else (
            f"{cost['ratio']:.3f}x, within the spread ({cost['why']})")
    if cost["ratio"] is None:
        return f"{cost['median_ms']:.1f} ms"
    return (f"{cost['ratio']:.3f}x ({cost['median_ms']:.1f} ms; "
            f"{cost['ratio_min']:.2f}-{cost['ratio_max']:.2f}x)")


def _matrix_from_journal(groups: list[RunGroup], saved: dict[str, Any] | None,
                         edge_ids: list[str] | None) -> dict | None:
    """Matrix cells rebuilt from the journal; expectations from matrix.json when it is there."""
    latest = {g.purpose.removeprefix("matrix:"): g for g in groups
              if g.purpose.startswith("matrix:")}  # a cell run again: its newest group
    if not latest:
        return None
    saved_cells = {c["name"]: c for c in (saved or {}).get("cells", [])}
    # The matrix file's order where it is known, then any other cells the journal has.
    names = [n for n in saved_cells if n in latest] + [n for n in latest if n not in saved_cells]
    base = _all_on_runs(groups, edge_ids)
    out = []
    for name in names:
        group = latest[name]
        before = saved_cells.get(name, {})
        expect = before.get("expect", "any")
        verdict = group.verdict if group.verdict != "reference" else "error"
        out.append({
            "name": name, "verdict": verdict, "expect": expect,
            "expectation_met": expectation_met(expect, verdict),
            "first_diff_step": group.first_diff_step,
            # Statistics need every pair of runs compared: the matrix run computed them.
            "metrics": before.get("metrics", {}) if before.get("verdict") == verdict else {},
            "runs": len(group.records), "divergences": len(group.diverged_runs),
            "mask": group.mask or [], "seconds": sum(r.get("wall_s") or 0 for r in group.records),
            "step_time": compare_runs(base, group.records),
        })
    return {"matrix": (saved or {}).get("matrix", "matrix"), "cells": out}


def _summary(records, groups, edge_ids, bisect, matrix):
    """The headline verdict, the facts under it, the evidence table, reproduction commands."""
    facts = [f"{len(records)} runs in {len(groups)} groups, "
             f"{sum(len(g.diverged_runs) for g in groups)} diverged from their reference",
             outcome_counts_text(records), *fault_lines(records)]
    # What the runs measured (runs/signals.py), as the commands said it when they started.
    signals = next((r["signals"] for r in records if r.get("signals")), None)
    if signals is not None:
        facts.append(describe_signals(signals))
    if bisect:
        culprits = list(bisect.get("minimal_set", []))
        if culprits:
            facts.append("minimal set: " + ", ".join(culprits))
        if bisect.get("confidence") is not None:
            facts.append(f"confidence {bisect['confidence']:.3f}")
        facts += list(bisect.get("facts", []))
        if (bisect.get("stress") or {}).get("mode", "off") != "off":
            facts.append(stress_line(bisect["stress"]))
        reproduce = [bisect["reproduce"]] if bisect.get("reproduce") else []
        return (bisect.get("verdict", "?"), facts, _bisect_evidence(bisect, groups, edge_ids),
                reproduce)
    if matrix is not None:
        verdict = matrix_summary(matrix)
    else:
        decided = [g for g in groups if g.verdict in (DIVERGED, CONSISTENT)]
        verdict = decided[-1].verdict if decided else "no group decided"
    return verdict, facts, _group_evidence(groups, edge_ids), []


def _figures(state_dir: Path, groups: list[RunGroup], edge_ids: list[str] | None,
             out_dir: Path) -> list[tuple[str, Path]]:
    """Curves (and digest heat maps) of the first MAX_PLOTTED_GROUPS diverged groups."""
    figures: list[tuple[str, Path]] = []
    diverged = [g for g in groups if g.verdict == "diverged"][:MAX_PLOTTED_GROUPS]
    for index, group in enumerate(diverged):
        title = f"{group.purpose}, {_mask_label(group.mask, edge_ids)}"
        figures += _plot_group(state_dir, group, title, out_dir, index)
    return figures


RUN_HEADERS = ["run", "outcome", "what its job read (reused while unchanged)"]


def run_rows(records: list[dict[str, Any]]) -> list[list[Any]]:
    """One row a run: its id, outcome and manifest summary (runs/reuse.py)."""
    return [[r.get("run_id"), r.get("outcome"), manifest_summary(r.get(MANIFEST_FIELD))]
            for r in records]


def _writable(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(path, os.W_OK | os.X_OK)


def build_report(state_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write the HTML report of a state dir (default `<state_dir>/report.html`); return its path.

    A state dir this user cannot write (a colleague's, a CI artifact) is only read: the
    figures are drawn in a temporary dir (the page embeds them), the page goes to `out`.
    """
    state_dir = Path(state_dir)
    target = Path(out) if out is not None else state_dir / REPORT_FILE
    if out is None and not os.access(state_dir, os.W_OK | os.X_OK):
        raise BisectPrefetchError(f"cannot write {target}: the state dir is not writable by "
                                  "this user; give --html FILE elsewhere")
    scratch = None if _writable(state_dir / PLOTS_DIR) else tempfile.mkdtemp(
        prefix="bisect-prefetch-plots-")
    try:
        return _build_report(state_dir, target,
                             state_dir / PLOTS_DIR if scratch is None else Path(scratch))
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _build_report(state_dir: Path, target: Path, out_dir: Path) -> Path:
    journal = read_journal(state_dir / JOURNAL)
    journal.records = [r for r in journal.records if SUBMITTED not in r]  # jobs, not runs
    if not journal.records:
        raise BisectPrefetchError(
            f"no finished runs in {state_dir / JOURNAL}: nothing to report"
        )
    records = journal.records
    groups = journal_groups(records)
    graph = _find_graph(state_dir, records)
    edge_ids = graph.edge_ids() if graph is not None else None
    bisect = _read_json(state_dir / BISECT_FILE)
    saved_matrix = _read_json(state_dir / MATRIX_FILE)
    matrix = _matrix_from_journal(groups, saved_matrix, edge_ids)

    culprits = list(bisect.get("minimal_set", [])) if bisect else []
    graph_png = None
    if graph is not None:
        from bisect_prefetch.graph import render_png

        graph_png = out_dir / "graph.png"
        render_png(graph, graph_png, highlight=culprits)

    verdict, facts, evidence, reproduce = _summary(records, groups, edge_ids, bisect, matrix)
    if saved_matrix and saved_matrix.get("command"):
        reproduce.append(saved_matrix["command"])
    figures = _figures(state_dir, groups, edge_ids, out_dir)

    page = render_html(
        title=f"bisect-prefetch report: {state_dir.name}", verdict=verdict, facts=facts,
        graph_png=graph_png, culprits=culprits, evidence=evidence, matrix=matrix,
        figures=figures, reproduce=reproduce, runs=run_rows(records),
        explain=_read_json(state_dir / EXPLAIN_FILE),
        explained=(bisect or {}).get("explained"),
    )
    write_text_atomic(target, page)
    return target

