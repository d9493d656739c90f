"""`bisect --explain`: each cause's first divergence, traced after the verdict; and what
traced runs found, given back to the search as its hint where digests could not tell.

After the verdict, ``explain_causes`` runs `explain` (commands/explain.py) on each cause's
keep-only, in the bisection's own state dir and journal (its runs stay there, and a
resumed bisect --explain reuses them), under the stress the search ran with; for drift
that is not prefetch's, on all-off. Each cause's first divergence and its edge are then
said in the verdict block (``explained_lines``), kept in bisect.json's ``explained`` and
shown in the report. A cause whose traced runs gave no verdict (or in which the tool
failed) is said with why; the bisection's verdict stands either way.

The hint: a traced run names the first unit that computed differently (for an op tied to
an edge, the edge's target: the unit a bad prefetch writes into). ``with_traced_hints``
wraps the search's oracle: a diverged run whose digests localized nothing takes that unit
as its hint (search/hints.py) when the traced mask's edges were all on in it. The findings
come from the state dir's explain.json and bisect.json, so they serve a later bisection
of the same experiment, or its resume.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from bisect_prefetch.commands.bisect_setup import OracleFor
from bisect_prefetch.commands.common import command_line, options
from bisect_prefetch.commands.explain import run_explain
from bisect_prefetch.commands.explain_words import KIND_WORDS
from bisect_prefetch.errors import BisectPrefetchError, ToolFailure
from bisect_prefetch.files import write_text_atomic
from bisect_prefetch.report.html import BISECT_FILE, EXPLAIN_FILE, build_report
from bisect_prefetch.search.oracle import Finished, RunResult
from bisect_prefetch.search.verdict import SearchResult
from bisect_prefetch.vocab import (
    STRESS_OFF,
    STRESS_ON,
    VERDICT_FOUND,
    VERDICT_INCONCLUSIVE,
    VERDICT_NOT_PREFETCH,
    Mask,
    parse_edge_id,
)

EXPLAINED_KEY = "explained"  # bisect.json's list, one entry a cause


def masks_to_explain(result: SearchResult) -> list[list[str]]:
    """The edge sets whose keep-only is traced: every cause found ([] : all-off, for drift
    that is not prefetch's)."""
    if result.verdict == VERDICT_NOT_PREFETCH:
        return [[]]
    if result.verdict not in (VERDICT_FOUND, VERDICT_INCONCLUSIVE):
        return []
    sets = [list(c["edges"]) for c in result.culprit_sets if c.get("edges")]
    return sets or ([list(result.minimal_set)] if result.minimal_set else [])


def explain_causes(experiment_path: Path, result: SearchResult, *, stressed: bool,
                   state_dir: Path, console: Console) -> list[dict[str, Any]]:
    """`explain` on each cause's keep-only (module docstring); one entry a cause."""
    entries = []
    for edges in masks_to_explain(result):
        mask = f"keep-only:{','.join(edges)}" if edges else "all-off"
        stress = STRESS_ON if stressed else STRESS_OFF
        command = command_line("explain", str(experiment_path), *options(
            mask=mask, stress=stress, state_dir=state_dir))
        console.print(f"explaining {'the cause ' + ', '.join(edges) if edges else 'the drift'}"
                      f" ({command})...", markup=False, soft_wrap=True)
        entry: dict[str, Any] = {"edges": edges, "mask": mask, "command": command}
        try:
            data = run_explain(experiment_path, masks=[mask], stress=stress, runs=4,
                               steps=None, state_dir=state_dir, console=console)
        except (BisectPrefetchError, ToolFailure) as e:
            entry["error"] = str(e)
            console.print(f"  -> not explained: {e}", markup=False, soft_wrap=True)
        else:
            first = data.get("first")
            entry |= {"verdict": data["verdict"], "first": first,
                      "edge": first.get("edge") if first else None,
                      "first_diff_step": data.get("first_diff_step"),
                      "overhead_ratio": data["overhead"].get("ratio")}
        entries.append(entry)
    return entries


def explained_lines(entries: Sequence[dict[str, Any]]) -> list[str]:
    """Each cause's first divergence and edge, for the verdict block."""
    lines = []
    for entry in entries:
        cause = ", ".join(entry["edges"]) or "every edge off"
        first = entry.get("first")
        if entry.get("error"):
            lines.append(f"  {cause}: not explained ({entry['error']})")
        elif first is None:
            lines.append(f"  {cause}: {entry.get('verdict')}, no first differing op "
                         f"(explain: {entry['command']})")
        else:
            edge = f"edge {first['edge']}" if first.get("edge") else "no edge"
            lines.append(f"  {cause}: first divergence at step {first['step']}, rank "
                         f"{first['rank']}, {first['phase']} of {first['module']}: "
                         f"{first['op']} ({KIND_WORDS.get(first['kind'], first['kind'])}); "
                         f"{edge}")
    return lines


def keep_explained(state_path: Path, entries: list[dict[str, Any]]) -> None:
    """bisect.json's ``explained`` (the report shows it), and the report rebuilt."""
    path = state_path / BISECT_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    data[EXPLAINED_KEY] = entries
    write_text_atomic(path, json.dumps(data, indent=2) + "\n")
    build_report(state_path)


# -- traced findings as the search's hint -------------------------------------------------
def traced_findings(state_path: Path) -> list[tuple[frozenset[str], str]]:
    """(edges the traced runs had on, the unit they point at) of each traced finding kept in
    the state dir (module docstring)."""
    found = []
    explain = _read(state_path / EXPLAIN_FILE)
    bisect = _read(state_path / BISECT_FILE)
    entries = [explain] + list(bisect.get(EXPLAINED_KEY) or [])
    for entry in entries:
        first = entry.get("first") if isinstance(entry, dict) else None
        if not isinstance(first, dict):
            continue
        unit = first.get("unit")
        if first.get("edge"):
            try:
                unit = parse_edge_id(first["edge"])[2]  # the unit its prefetch writes into
            except ValueError:
                pass
        edges = entry.get("edges", entry.get("mask"))
        if unit and isinstance(edges, list):
            found.append((frozenset(edges), unit))
    return found


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


class TracedHints:
    """The search's oracle, with a traced finding's unit as a diverged run's hint where the
    run's digests localized nothing (everything else is the oracle's)."""

    def __init__(self, oracle: Any, findings: list[tuple[frozenset[str], str]]) -> None:
        self._oracle = oracle
        self._findings = findings

    def __getattr__(self, name: str) -> Any:
        return getattr(self._oracle, name)

    def run(self, mask: Mask) -> RunResult:
        return self._hinted(mask, self._oracle.run(mask))

    def finished(self) -> Finished | None:
        heard = self._oracle.finished()
        if heard is None:
            return None
        return dataclasses.replace(heard, result=self._hinted(heard.planned, heard.result))

    def _hinted(self, planned: Any, result: RunResult) -> RunResult:
        if not result.diverged or result.unit is not None:
            return result
        mask = planned
        if not isinstance(planned, frozenset) and hasattr(planned, "segments"):
            segment = planned.segments[planned.holding(result.first_diff_step or 1)]
            mask = segment.ask.mask
        for edges, unit in self._findings:
            if edges and edges <= set(mask):
                return dataclasses.replace(result, unit=unit)
        return result


def with_traced_hints(oracle_for: OracleFor) -> OracleFor:
    """oracle_for whose oracles take traced findings as hints (TracedHints), where the
    state dir holds any."""

    def make(opened: Any, on_run: Any, **kwargs: Any) -> Any:
        oracle = oracle_for(opened, on_run, **kwargs)
        findings = traced_findings(opened.path)
        return TracedHints(oracle, findings) if findings else oracle

    return make
