"""`bisect --explain`: each cause's first divergence, traced after the verdict; and what
traced runs found, given back to the search as its hint where digests could not tell.

After the verdict, ``explain_causes`` runs `explain` (commands/explain.py) for each of
bisect.json's explain steps (``next_steps``, commands/bisect_record.py: each cause's
keep-only; all-off for drift that is not prefetch's), in the bisection's own state dir and
journal, under the stress the search ran with. Each explain is a session of its own
(runs/sessions.py): a resumed bisect --explain continues the latest explain session, and
runs of earlier commands (the bisection's graph discovery) are taken only where bisect was
given --reuse. What it found becomes that step's
``result``, so the verdict block says each cause's first divergence and edge under its
command, in the terminal and the report alike (report/verdict_block.py words it). A cause
whose traced runs gave no verdict (or in which the tool failed) is said with why; the
bisection's verdict stands either way.

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
from pathlib import Path
from typing import Any

from rich.console import Console

from bisect_prefetch.commands.bisect_setup import OracleFor
from bisect_prefetch.commands.common import Given
from bisect_prefetch.commands.explain import run_explain
from bisect_prefetch.errors import BisectPrefetchError, ToolFailure
from bisect_prefetch.report.html import BISECT_FILE, EXPLAIN_FILE
from bisect_prefetch.report.verdict_block import STEP_EXPLAIN
from bisect_prefetch.search.oracle import Finished, RunResult
from bisect_prefetch.vocab import STRESS_OFF, STRESS_ON, parse_edge_id, quote_edges

TRACED_RUNS = 4  # explain's --runs default


def explain_causes(experiment_path: Path, next_steps: list[dict[str, Any]], *, stressed: bool,
                   state_dir: Path, console: Console, resume: bool = False,
                   reuse: bool | None = None) -> None:
    """`explain` for each explain step of ``next_steps``; its ``result`` set (module
    docstring): ``{"verdict", "first", "edge", "first_diff_step", "overhead_ratio"}``, or
    ``{"error"}`` where the traced runs gave no verdict or the tool failed in them."""
    stress = STRESS_ON if stressed else STRESS_OFF
    for step in next_steps:
        if step.get("step") != STEP_EXPLAIN:
            continue
        edges = list(step.get("edges") or [])
        mask = f"keep-only:{quote_edges(edges)}" if edges else "all-off"
        cause = f"cause {step['cause']}" if step.get("cause") else "the drift without prefetch"
        console.print(f"explaining {cause} ({step['command']})...", markup=False,
                      soft_wrap=True)
        given = Given("explain", experiment_path, {
            "mask": [mask], "stress": stress, "runs": TRACED_RUNS, "state_dir": state_dir,
            "resume": resume, "reuse": reuse})
        try:
            data = run_explain(experiment_path, masks=[mask], stress=stress, runs=TRACED_RUNS,
                               steps=None, state_dir=state_dir, console=console, given=given)
        except (BisectPrefetchError, ToolFailure) as e:
            step["result"] = {"error": str(e)}
            console.print(f"  -> not explained: {e}", markup=False, soft_wrap=True)
            continue
        first = data.get("first")
        step["result"] = {"verdict": data["verdict"], "first": first,
                          "edge": first.get("edge") if first else None,
                          "first_diff_step": data.get("first_diff_step"),
                          "overhead_ratio": data["overhead"].get("ratio")}


# -- traced findings as the search's hint -------------------------------------------------
def traced_findings(state_path: Path) -> list[tuple[frozenset[str], str]]:
    """(edges the traced runs had on, the unit they point at) of each traced finding kept in
    the state dir (module docstring)."""
    found = []
    explain = _read(state_path / EXPLAIN_FILE)
    bisect = _read(state_path / BISECT_FILE)
    entries = [(explain, explain.get("mask"))] + [
        (step.get("result"), step.get("edges")) for step in bisect.get("next_steps") or []
        if isinstance(step, dict) and step.get("step") == STEP_EXPLAIN]
    for entry, edges in entries:
        first = entry.get("first") if isinstance(entry, dict) else None
        if not isinstance(first, dict):
            continue
        unit = first.get("unit")
        if first.get("edge"):
            try:
                unit = parse_edge_id(first["edge"])[2]  # the unit its prefetch writes into
            except ValueError:
                pass
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

    def make(opened: Any, **kwargs: Any) -> Any:
        oracle = oracle_for(opened, **kwargs)
        findings = traced_findings(opened.path)
        return TracedHints(oracle, findings) if findings else oracle

    return make
