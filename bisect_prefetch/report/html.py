"""The self-contained HTML report of a state dir: the answer first, then its evidence.

`build_report(state_dir)` rebuilds it at any time from what the state dir holds:
the journal (every finished run), the run dirs (metrics for the plots, graph.json
for the picture) and the result JSON a command left next to the journal
(bisect.json, matrix.json) for what the journal cannot say. Images are embedded
as base64, so the one file can be mailed or attached to an issue; the PNGs are
also left in `report/` beside it.

A bisection's page opens on one screen that answers (report/verdict_block.py, the
same words as the terminal's verdict block): the verdict, every cause, the graph
with every cause drawn, the next steps and the one count of runs. Then the
timeline of its runs (numbered as the transcript's run lines), the evidence by
stage, the plots of each cause's keep-only divergence (heat maps folded away),
and apart, the runs of other commands (init's checks, aa groups, matrix cells).
"""

from __future__ import annotations

import base64
import html
import json
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.experiment import expectation_met
from bisect_prefetch.files import write_text_atomic
from bisect_prefetch.judge.faults import fault_lines
from bisect_prefetch.judge.signals import describe_signals
from bisect_prefetch.judge.step_time import compare_runs
from bisect_prefetch.report.figures import RunFigures, run_figures
from bisect_prefetch.report.run_view import (
    SEARCH,
    RunGroup,
    TimelineRow,
    command_of,
    journal_groups,
    mask_text,
    split_runs,
    timeline,
)
from bisect_prefetch.report.stress import stress_line
from bisect_prefetch.report.table import fmt_step, matrix_rows, matrix_summary
from bisect_prefetch.report.verdict_block import (
    STEP_GUARD,
    causes_of,
    chance_words,
    counts_line,
    guard_check,
    headline,
    keep_only_words,
    size_one_words,
    step_lines,
)
from bisect_prefetch.runs.reuse import MANIFEST_FIELD
from bisect_prefetch.runs.reuse import summary as manifest_summary
from bisect_prefetch.runs.store import JOURNAL, JOURNAL_VERSION, SUBMITTED
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
)

__all__ = ["BISECT_FILE", "EXPLAIN_FILE", "MATRIX_FILE", "REPORT_FILE", "RunGroup",
           "build_report", "journal_groups", "outcome_counts_text", "render_html"]

OPEN_CAUSE_PLOTS = 2  # causes whose keep-only divergence is drawn open; the rest are folded
MAX_OTHER_PLOTS = 6  # other diverged runs of the bisection, folded


def outcome_counts_text(records: list[dict[str, Any]]) -> str:
    """How the runs ended, every kind named even at zero: `run outcomes: 5 ok, 1 error, ...`."""
    counts = Counter(r.get("outcome") for r in records)
    known = [f"{counts.pop(name, 0)} {name}" for name in RUN_OUTCOMES]
    other = [f"{n} {name}" for name, n in counts.items()]  # a journal from another version
    return "run outcomes: " + ", ".join(known + other)


# -- reading the state dir ----------------------------------------------------
def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise BisectPrefetchError(f"cannot read {path}: {exc}") from None
    return data if isinstance(data, dict) else None


def read_records(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The journal's finished runs, and what could not be read (a torn or corrupt line):
    the report shows what is there and says what is not."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [], [f"no journal ({path.name}) in {path.parent}"]
    except OSError as exc:
        raise BisectPrefetchError(f"cannot read journal {path}: {exc.strerror or exc}") from None
    records, bad = [], []
    for number, line in enumerate(data.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line.decode("utf-8"))
        except ValueError:
            bad.append(number)
            continue
        if not isinstance(record, dict) or record.get("v") != JOURNAL_VERSION:
            bad.append(number)
        elif SUBMITTED not in record:  # a Slurm submission: a job, not a finished run
            records.append(record)
    problems = [f"journal {path}: line(s) {', '.join(map(str, bad[:5]))}"
                f"{' ...' if len(bad) > 5 else ''} unreadable (torn by a kill, or damaged): "
                "left out"] if bad else []
    return records, problems


def _find_graph(state_dir: Path, records: list[dict[str, Any]]):
    """The prefetch graph of the newest run dir that recorded one."""
    from bisect_prefetch.graph import PrefetchGraph

    for record in reversed(records):
        path = state_dir / RUNS_DIR / str(record.get("run_id")) / GRAPH_FILE
        if path.is_file():
            try:
                return PrefetchGraph.load(path)
            except (BisectPrefetchError, OSError, ValueError, KeyError, TypeError):
                continue
    return None


def _missing_run_dirs(state_dir: Path, records: list[dict[str, Any]]) -> list[str]:
    gone = [str(r.get("run_id")) for r in records
            if not (state_dir / RUNS_DIR / str(r.get("run_id"))).is_dir()]
    if not gone:
        return []
    shown = ", ".join(gone[:5]) + (f" and {len(gone) - 5} more" if len(gone) > 5 else "")
    return [f"{len(gone)} run dir(s) of the journal missing under {state_dir / RUNS_DIR} "
            f"(deleted by hand?): {shown}; their rows stay, their plots cannot be drawn"]


# -- rendering ------------------------------------------------------------------
STYLE = """
body { font-family: sans-serif; margin: 1em 2em; max-width: 1200px; line-height: 1.3; }
h1 { font-size: 1.1em; margin: 0.2em 0; color: #444; }
h2 { font-size: 1.15em; margin: 1.2em 0 0.4em; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: left; vertical-align: top; }
th { background: #f4f4f4; position: sticky; top: 0; }
td.num { text-align: right; font-family: monospace; }
tr.bad td { background: #fde2e2; }
.verdict { font-size: 1.35em; font-weight: bold; margin: 0.3em 0; }
.counts { margin: 0.3em 0; }
pre { background: #f4f4f4; padding: 0.3em 0.6em; margin: 0.15em 0 0.5em; overflow-x: auto;
      white-space: pre-wrap; word-break: break-all; font-size: 0.85em; }
ol.steps { margin: 0.3em 0; padding-left: 1.5em; } ol.steps li { margin: 0.2em 0; }
.result { font-size: 0.9em; color: #333; }
.timeline { max-height: 30em; overflow-y: auto; border: 1px solid #ddd; }
.timeline table { margin: 0; }
figure { margin: 0.5em 0; } img { max-width: 100%; }
details { margin: 0.4em 0; } summary { cursor: pointer; }
.causes td:nth-child(2) { white-space: pre; font-family: monospace; }
"""


def _esc(value: Any) -> str:
    return html.escape(str(value))


def _table(headers: list[str], rows: list[list[Any]], bad: list[bool] | None = None,
           ids: list[str | None] | None = None) -> str:
    out = ["<table>", "<tr>" + "".join(f"<th>{_esc(h)}</th>" for h in headers) + "</tr>"]
    for i, row in enumerate(rows):
        cls = ' class="bad"' if bad and bad[i] else ""
        anchor = f' id="{_esc(ids[i])}"' if ids and ids[i] else ""
        cells = "".join(
            f'<td class="num">{_esc(v)}</td>' if isinstance(v, int | float) else f"<td>{_esc(v)}</td>"
            for v in row
        )
        out.append(f"<tr{cls}{anchor}>{cells}</tr>")
    out.append("</table>")
    return "\n".join(out)


def _image(path: Path, alt: str) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return f'<img alt="{_esc(alt)}" src="data:image/png;base64,{data}">'


def _figure(path: Path, caption: str) -> str:
    return f"<figure>{_image(path, caption)}<figcaption>{_esc(caption)}</figcaption></figure>"


def _details(summary: str, body: str, *, open_: bool = False) -> str:
    return (f"<details{' open' if open_ else ''}><summary>{_esc(summary)}</summary>"
            f"{body}</details>")


def _page(title: str, parts: list[str]) -> str:
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_esc(title)}</title><style>{STYLE}</style></head><body>",
        *parts, "</body></html>"]) + "\n"


def _explain_part(explain: dict[str, Any] | None) -> list[str]:
    """The first op that differs and its neighbours (explain.json)."""
    if not explain or not explain.get("first"):
        return []
    first = explain["first"]
    near = explain.get("neighbours") or []
    return ["<h2>First differing op</h2>",
            f"<p>rank {_esc(first['rank'])}, step {_esc(first['step'])}, "
            f"{_esc(first['phase'])} of {_esc(first['module'])}: <code>"
            f"{_esc(first['op'])}</code> ({_esc(first['kind'])}); "
            f"{_esc(first.get('detail') or '')}</p>",
            (f"<p>edge: <code>{_esc(first['edge'])}</code> ({_esc(first.get('edge_how'))})</p>"
             if first.get("edge") else
             f"<p>edge: none ({_esc(first.get('edge_note') or 'not tied to a prefetch')})</p>"),
            _table(["step", "op #", "op", "phase", "module", "differs", "at"],
                   [[n["step"], n["seq"], n["op"], n["phase"], n["module"], n["differs"], n["at"]]
                    for n in near], [n["first"] for n in near])]


def _figures_part(figures: list[RunFigures], *, open_count: int) -> list[str]:
    """Curves open for the first `open_count` figures, the rest and every heat map folded."""
    parts = []
    for i, found in enumerate(figures):
        body = _figure(found.curves, found.caption) if found.curves is not None else (
            f"<p>{_esc(found.caption)}: no metric line to draw (the run stopped at its "
            "first differing digest before printing one)</p>")
        if found.heat_maps:
            body += _details(f"digest heat maps: {found.caption}",
                             "".join(_figure(path, caption) for caption, path in found.heat_maps))
        parts.append(body if i < open_count else _details(found.caption, body))
    return parts


def render_html(
    *,
    title: str,
    verdict: str,
    facts: list[str],
    graph_png: Path | None,
    culprits: list[str],
    evidence: tuple[list[str], list[list[Any]]],
    matrix: dict[str, Any] | None,
    figures: list[RunFigures] | list[tuple[str, Path]],
    reproduce: list[str],
    runs: list[list[Any]] | None = None,
    explain: dict[str, Any] | None = None,
) -> str:
    """The page of a state dir without a bisection (aa groups, a matrix, explain); every
    argument is plain data, images are PNG files to embed."""
    parts = [f"<h1>{_esc(title)}</h1>", f'<p class="verdict">verdict: {_esc(verdict)}</p>']
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
    parts += _explain_part(explain)
    headers, rows = evidence
    if rows:
        parts.append("<h2>Evidence</h2>")
        parts.append(_table(headers, rows, [r[headers.index("verdict")] == DIVERGED
                                            for r in rows] if "verdict" in headers else None))
    if figures:
        parts.append("<h2>Plots</h2>")
        parts += _figures_part([f if isinstance(f, RunFigures) else RunFigures(f[0], f[1])
                                for f in figures], open_count=OPEN_CAUSE_PLOTS)
    if reproduce:
        parts.append("<h2>Reproduce</h2>")
        parts.append("<pre>" + "\n".join(_esc(c) for c in reproduce) + "</pre>")
    if runs:
        parts.append(_details(f"what each run read ({len(runs)} runs)", _table(RUN_HEADERS, runs)))
    return _page(title, parts)


# -- a bisection's page -----------------------------------------------------------
def _causes_table(data: dict[str, Any]) -> str:
    causes = causes_of(data)
    if not causes:
        return ""
    rows, ids = [], []
    for number, cause in enumerate(causes, start=1):
        confidence = cause.get("confidence")
        chance = cause.get("per_run_chance")
        rows.append([f"cause {number}", "\n".join(cause["edges"]),
                     f"{confidence:.3f}" if confidence is not None else "-",
                     keep_only_words(data, cause),
                     f"drift in {chance_words(chance)}" if chance else "-",
                     size_one_words(cause).removeprefix("size-one: ")])
        ids.append(f"cause-{number}")
    return '<div class="causes">' + _table(["cause", "edges", "confidence", "keep-only evidence",
                                            "with it alone on", "size-one"], rows, ids=ids) + "</div>"


def _next_steps(data: dict[str, Any]) -> str:
    steps = step_lines(data)
    if not steps:
        return ""
    items = []
    for title, command, result in steps:
        said = f'<div class="result">-&gt; {_esc(result)}</div>' if result is not None else ""
        items.append(f"<li>{_esc(title)}:<pre>{_esc(command)}</pre>{said}</li>")
    return '<h2>Next steps</h2><ol class="steps">' + "".join(items) + "</ol>"


TIMELINE_HEADERS = ["run", "run id", "what", "segments (steps: mask)", "outcome",
                    "first differed", "why"]


def _timeline(rows: list[TimelineRow]) -> str:
    cells = []
    for row in rows:
        segments = "; ".join(f"{a}-{b}: {mask}" for a, b, mask in row.segments)
        cells.append(["-" if row.run is None else row.run,
                      row.run_id + (" (from the journal)" if row.reused else ""), row.what,
                      segments, row.outcome, fmt_step(row.first_diff_step), row.why])
    return ('<div class="timeline">' + _table(
        TIMELINE_HEADERS, cells, [r.first_diff_step is not None or r.outcome not in ("ok",
                                  "stopped-early") for r in rows],
        [f"run-{r.run}" if r.run is not None else None for r in rows]) + "</div>")


def _other_commands(groups: list[RunGroup], edge_ids: list[str] | None) -> list[str]:
    """Runs of other commands, apart: they are no part of the bisection's count."""
    if not groups:
        return []
    rows = [[command_of(g.purpose), g.purpose, mask_text(g.mask, edge_ids), g.guard, g.steps,
             len(g.records), len(g.diverged_runs), len(g.records) - len(g.usable),
             fmt_step(g.first_diff_step), g.verdict] for g in groups]
    records = [r for g in groups for r in g.records]
    return ["<h2>Runs of other commands</h2>",
            f"<p>{len(records)} run(s) in the same state dir, not this bisection's: "
            f"{_esc(outcome_counts_text(records))}</p>",
            _table(["command", "runs of", "mask", "guard", "steps", "runs", DIVERGED,
                    "failed", "first diff step", "verdict"], rows,
                   [g.verdict in (DIVERGED, "error") for g in groups]),
            *[f"<p>{_esc(line)}</p>" for line in fault_lines(records)]]


def _bisect_figures(state_dir: Path, data: dict[str, Any], mine: list[dict[str, Any]],
                    rows: list[TimelineRow], out_dir: Path) -> list[RunFigures]:
    """Each cause's first keep-only divergence, then the bisection's other diverged runs."""
    by_id = {r.get("run_id"): r for r in mine}
    chosen: list[tuple[str, TimelineRow]] = []
    for number, cause in enumerate(causes_of(data), start=1):
        runs = cause.get("keep_only_runs") or []
        row = next((r for r in rows if runs and r.run == runs[0]), None)
        if row is not None:
            chosen.append((f"cause {number}, keep-only", row))
    taken = {row.run_id for _, row in chosen}
    others = [r for r in rows if r.first_diff_step is not None and r.run_id not in taken]
    chosen += [("", r) for r in others[:MAX_OTHER_PLOTS]]
    figures = []
    for index, (why, row) in enumerate(chosen):
        record = by_id.get(row.run_id)
        if record is None:
            continue
        name = f"run {row.run} ({row.run_id})" if row.run is not None else row.run_id
        several = len(row.segments) > 1
        title = (f"{name}: {len(row.segments)} masks by step (segments marked, their masks below)"
                 if several else f"{name}: {row.segments[0][2]}")
        found = run_figures(state_dir, record | {"first_diff_step": row.first_diff_step},
                            name=(f"{why}: " if why else "") + name, title=title,
                            segments=row.segments, out_dir=out_dir, index=index)
        if found is not None:
            figures.append(found)
    return figures


def render_bisect_page(state_dir: Path, data: dict[str, Any], records: list[dict[str, Any]],
                       *, edge_ids: list[str] | None, graph_png: Path | None,
                       out_dir: Path, matrix: dict[str, Any] | None) -> str:
    """A bisection's page: the answer on the first screen, then its evidence, then the runs
    of other commands apart."""
    mine, others = split_runs(records, data)
    rows = timeline(data, mine, edge_ids)
    # The guard check may have run after the bisection: its result is read again here.
    guard = guard_check(journal_groups(others), edge_ids=edge_ids)
    for step in data.get("next_steps") or []:
        if step.get("step") == STEP_GUARD and guard is not None:
            step["result"] = guard
    name = data.get("experiment") or state_dir.name
    parts = [f"<h1>bisect-prefetch report: {_esc(name)}</h1>",
             f'<p class="verdict">{_esc(headline(data))}</p>', _causes_table(data)]
    if graph_png is not None:
        parts.append(f"<figure>{_image(graph_png, 'prefetch graph, every cause drawn')}</figure>")
    parts.append(_next_steps(data))
    parts.append(f'<p class="counts">{_esc(counts_line(data))}</p>')
    facts = list(data.get("facts") or [])
    signals = next((r["signals"] for r in mine if r.get("signals")), None)
    if signals is not None:
        facts.append(describe_signals(signals))
    if (data.get("stress") or {}).get("mode", "off") != "off":
        facts.append(stress_line(data["stress"]))
    facts += [outcome_counts_text(mine), *fault_lines(mine)]
    parts.append("<h2>Facts</h2><ul>" + "".join(f"<li>{_esc(f)}</li>" for f in facts) + "</ul>")
    parts.append(f"<h2>Timeline: {len(rows)} runs of the bisection</h2>")
    parts.append(_timeline(rows))
    headers, evidence = _bisect_evidence(data, journal_groups(mine), edge_ids)
    if evidence:
        parts.append(_details(f"evidence by stage ({len(evidence)} rows)", _table(
            headers, evidence, [r[headers.index("verdict")] == DIVERGED for r in evidence])))
    parts += _explain_part(_read_json(state_dir / EXPLAIN_FILE))
    figures = _bisect_figures(state_dir, data, mine, rows, out_dir)
    if figures:
        parts.append("<h2>Plots</h2>")
        parts += _figures_part(figures, open_count=min(OPEN_CAUSE_PLOTS, len(causes_of(data))))
    if matrix is not None:
        parts.append("<h2>Matrix</h2>")
        parts.append(f"<p>{_esc(matrix_summary(matrix))}</p>")
        headers, rows_ = matrix_rows(matrix)
        parts.append(_table(headers, rows_, [not c["expectation_met"] for c in matrix["cells"]]))
    parts += _other_commands(journal_groups([r for r in others
                                             if not str(r.get("variant", "")).startswith("matrix:")
                                             or matrix is None]), edge_ids)
    parts.append(_details(f"what each run read ({len(records)} runs)",
                          _table(RUN_HEADERS, run_rows(records))))
    return _page(f"bisect-prefetch report: {name}", parts)


# -- building -------------------------------------------------------------------
def _bisect_evidence(bisect: dict[str, Any], groups: list[RunGroup],
                     edge_ids: list[str] | None) -> tuple[list[str], list[list[Any]]]:
    headers = ["stage", "mask", "edges", "runs", "divergences", "errors", "first diff steps",
               "verdict", "step time vs all-on"]
    # Evidence rows name their mask (protocol.mask_name): the journal's runs of that mask.
    times: dict[str, list[Any]] = {}
    for g in groups:
        if g.purpose == SEARCH and g.mask is not None and edge_ids:
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
    with a group's over the steps they all ran (judge/step_time.compare_runs)."""
    every = set(edge_ids or [])
    return [r for g in groups for r in g.records
            if g.guard == "none" and (g.mask is None or set(g.mask) == every)]


def _first_diff_ranks(cell: dict[str, Any]) -> str:
    """The rank each metric differed on first (matrix statistics), e.g. `loss: 1`."""
    ranks = [f"{name}: {stats['first_diff_rank']}" for name, stats in (cell.get("metrics") or {}).items()
             if (stats or {}).get("first_diff_rank") is not None]
    return ", ".join(ranks) or "-"


def _group_evidence(groups: list[RunGroup], edge_ids: list[str] | None):
    headers = ["command", "runs of", "mask", "guard", "steps", "runs", "divergences", "errors",
               "first diff step", "verdict", "step time vs all-on"]
    base = _all_on_runs(groups, edge_ids)
    rows = [[command_of(g.purpose), g.purpose, mask_text(g.mask, edge_ids), g.guard, g.steps,
             len(g.records), len(g.diverged_runs), len(g.records) - len(g.usable),
             fmt_step(g.first_diff_step), g.verdict, _cost_text(compare_runs(base, g.records))]
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


def _commands_page(state_dir: Path, records: list[dict[str, Any]], groups: list[RunGroup],
                   edge_ids: list[str] | None, matrix: dict | None,
                   saved_matrix: dict | None, graph_png: Path | None, out_dir: Path) -> str:
    """A state dir without a bisection: its groups (aa, matrix cells, explain), as before."""
    facts = [f"{len(records)} runs in {len(groups)} groups, "
             f"{sum(len(g.diverged_runs) for g in groups)} diverged from their reference",
             outcome_counts_text(records), *fault_lines(records)]
    signals = next((r["signals"] for r in records if r.get("signals")), None)
    if signals is not None:
        facts.append(describe_signals(signals))
    if matrix is not None:
        verdict = matrix_summary(matrix)
    else:
        decided = [g for g in groups if g.verdict in (DIVERGED, CONSISTENT)]
        verdict = decided[-1].verdict if decided else "no group decided"
    figures = []
    for index, group in enumerate([g for g in groups if g.verdict == DIVERGED][:MAX_OTHER_PLOTS]):
        run = group.first_divergence()
        label = f"{command_of(group.purpose)} {group.purpose}, {mask_text(group.mask, edge_ids)}"
        if run is not None:
            found = run_figures(state_dir, run, name=f"{label}: {run['run_id']}", title=label,
                                segments=None, out_dir=out_dir, index=index)
            if found is not None:
                figures.append(found)
    reproduce = [saved_matrix["command"]] if saved_matrix and saved_matrix.get("command") else []
    return render_html(
        title=f"bisect-prefetch report: {state_dir.name}", verdict=verdict, facts=facts,
        graph_png=graph_png, culprits=[], evidence=_group_evidence(groups, edge_ids),
        matrix=matrix, figures=figures, reproduce=reproduce, runs=run_rows(records),
        explain=_read_json(state_dir / EXPLAIN_FILE))


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


def build_report(state_dir: str | Path, out: str | Path | None = None, *,
                 problems: list[str] | None = None) -> Path:
    """Write the HTML report of a state dir (default `<state_dir>/report.html`); return its path.

    A state dir this user cannot write (a colleague's, a CI artifact) is only read: the
    figures are drawn in a temporary dir (the page embeds them), the page goes to `out`.
    problems, when given, gets one line for each thing missing from the state dir (no
    bisection, unreadable journal lines, run dirs deleted by hand): the page shows what is
    there all the same.
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
                             state_dir / PLOTS_DIR if scratch is None else Path(scratch),
                             problems if problems is not None else [])
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _build_report(state_dir: Path, target: Path, out_dir: Path, problems: list[str]) -> Path:
    records, unread = read_records(state_dir / JOURNAL)
    bisect = _read_json(state_dir / BISECT_FILE)
    if not records and bisect is None:
        raise BisectPrefetchError(
            f"no finished runs in {state_dir / JOURNAL}: nothing to report"
        )
    problems += unread + _missing_run_dirs(state_dir, records)
    saved_matrix = _read_json(state_dir / MATRIX_FILE)
    if bisect is None and saved_matrix is None:
        problems.append(f"no bisection in {state_dir} ({BISECT_FILE} missing): the report shows "
                        f"the {len(records)} run(s) of other commands")
    mine = split_runs(records, bisect)[0]
    graph = _find_graph(state_dir, mine or records)
    if graph is None and (bisect or {}).get("graph"):  # a static graph: in bisect.json only
        from bisect_prefetch.graph import PrefetchGraph

        try:
            graph = PrefetchGraph.from_dict(bisect["graph"])
        except (BisectPrefetchError, KeyError, TypeError, ValueError, AttributeError):
            problems.append(f"{state_dir / BISECT_FILE}: its graph cannot be read")
    edge_ids = graph.edge_ids() if graph is not None else None
    groups = journal_groups(records)
    matrix = _matrix_from_journal(groups, saved_matrix, edge_ids)
    graph_png = None
    if graph is not None:
        from bisect_prefetch.graph import render_png

        graph_png = out_dir / "graph.png"
        try:
            causes = [list(c["edges"]) for c in causes_of(bisect or {})]
        except (KeyError, TypeError):
            causes = []
        render_png(graph, graph_png, causes=causes, height=2.6)
    page = None
    if bisect is not None:
        try:
            page = render_bisect_page(state_dir, bisect, records, edge_ids=edge_ids,
                                      graph_png=graph_png, out_dir=out_dir, matrix=matrix)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:  # edited by hand?
            problems.append(f"{state_dir / BISECT_FILE} is not one this version reads "
                            f"({type(exc).__name__}: {exc}): the report shows the journal's runs")
    if page is None:
        page = _commands_page(state_dir, records, groups, edge_ids, matrix, saved_matrix,
                              graph_png, out_dir)
    write_text_atomic(target, page)
    return target
