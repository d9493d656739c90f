"""`bisect-prefetch explain`: the first op whose output differs while its inputs matched, and
the prefetch edge it belongs to.

In order, each printed as it happens: the experiment, what is traced (the source and target
units of the few edges the mask enables, or every unit) and in which steps, the A/A group
under the mask (default all-on) with those ops traced (adapters/op_trace.py), run as `aa`
runs one (the golden run to the end, each further run stopped at its first differing step,
the journal), until two runs differ or every run agrees; then the two runs' traces side by
side (metrics/op_compare.py): per rank the first op that differs and its kind, and across
ranks the finding with its edge (commands/explain_words.py says it). What is traced, and
in which steps, is commands/explain_window.py's; what tracing cost, commands/explain_cost.py's.

Exit codes: 0 every run agreed ("consistent: nothing to explain"), 1 a finding (an op that
differs first, or the place where the runs' ops stopped lining up), 2 bad input, 3 the
tool failed inside a traced run (errors.ToolFailure, with the rank's log).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from bisect_prefetch.commands.common import (
    Given,
    check_outputs,
    resume_hint_on_interrupt,
    write_json,
)
from bisect_prefetch.commands.explain_cost import overhead, say_cost
from bisect_prefetch.commands.explain_window import PURPOSE, targeted_units, traced_steps
from bisect_prefetch.commands.explain_words import edge_note, explanation_lines
from bisect_prefetch.drivers.group import AAResult, stressed_groups
from bisect_prefetch.errors import BisectPrefetchError, ToolFailure
from bisect_prefetch.experiment import (
    Experiment,
    load_experiment,
    parse_steps_window,
    with_stress,
)
from bisect_prefetch.files import write_text_atomic
from bisect_prefetch.graph import PrefetchGraph
from bisect_prefetch.judge.tool_fault import tool_failure
from bisect_prefetch.metrics.op_compare import Explanation, compare_traces, neighbours
from bisect_prefetch.report.html import EXPLAIN_FILE, build_report
from bisect_prefetch.report.localization import describe as describe_localization
from bisect_prefetch.report.progress import RunProgress
from bisect_prefetch.runs.sessions import Scope
from bisect_prefetch.runs.state import OpenState, open_state
from bisect_prefetch.select import describe, resolve_mask
from bisect_prefetch.vocab import (
    CONSISTENT,
    DIVERGED,
    STRESS_AUTO,
    VERDICT_FOUND,
    VERDICT_NOT_PREFETCH,
    Mask,
    quote_edges,
)


def explain(
    experiment_path: Path,
    *,
    masks: Sequence[str] = (),
    stress: str | None = None,
    runs: int = 4,
    steps: str | None = None,
    all_units: bool = False,
    state_dir: Path,
    console: Console,
    json_out: Path | None = None,
    resume: bool = False,
) -> int:
    """Run (or, with resume, continue) the traced A/A group and explain its first divergence."""
    given = Given("explain", experiment_path, {
        "mask": list(masks), "stress": stress, "runs": runs, "steps": steps,
        "all_units": all_units, "state_dir": state_dir, "json": json_out, "resume": resume})
    with resume_hint_on_interrupt(console, given.follow_up(resume=True)):
        data = run_explain(experiment_path, masks=masks, stress=stress, runs=runs, steps=steps,
                           all_units=all_units, state_dir=state_dir, console=console,
                           outputs=(json_out,), given=given)
    if json_out is not None:
        write_json(json_out, data, console)
    return 0 if data["verdict"] == CONSISTENT else 1


def run_explain(
    experiment_path: Path,
    *,
    masks: Sequence[str],
    stress: str | None,
    runs: int,
    steps: str | None,
    state_dir: Path,
    console: Console,
    all_units: bool = False,
    outputs: Sequence[Path | None] = (),
    given: Given | None = None,
) -> dict[str, Any]:
    """The traced group, narrated; returns the JSON of docs/contract.md. given: the command
    as given (its printed commands carry its options)."""
    given = given or Given("explain", experiment_path, {
        "mask": list(masks), "stress": stress, "runs": runs, "steps": steps,
        "all_units": all_units, "state_dir": state_dir})
    experiment, window = _checked_input(experiment_path, stress=stress, runs=runs, steps=steps)
    check_outputs(*outputs, state_dir=state_dir, name=experiment.name)
    # (reuse: bisect --explain given --reuse; explain itself has no such option)
    scope = Scope("explain", resume=bool(given.values.get("resume")),
                  earlier=bool(given.values.get("reuse")))
    with open_state(experiment, state_dir, console=console, scope=scope) as opened:
        graph = opened.graph()  # discovered (or reused) without tracing
        edge_ids = graph.edge_ids()
        mask = resolve_mask(list(masks), edge_ids)
        name = describe(mask, edge_ids)
        # 1: what to trace, and in which steps; from here on the runner's runs are
        # traced runs (other keys, other runs in the journal)
        units = None if all_units else targeted_units(mask)
        first, last, run_steps = traced_steps(opened, experiment, window, mask, units, console)
        # 2: the traced A/A group, until two runs differ
        group = _traced_group(opened, mask, name=name, edges=len(edge_ids), runs=runs,
                              steps=run_steps, guard=experiment.guard, console=console)
        _tool_failed(opened, group)
        data: dict[str, Any] = {"verdict": group.verdict, "first": None, "ranks": [],
                                "mask": sorted(mask), "mask_name": name,
                                "steps": [first, last], "runs": len(group.runs),
                                "traced_units": units,
                                "first_diff_step": group.first_diff_step, "pair": None,
                                "overhead": overhead(group, opened.state.run_dir,
                                                     (first, last))}
        say_cost(data["overhead"], console)
        if group.verdict == CONSISTENT:
            console.print(f"-> consistent: nothing to explain ({group.runs_usable} runs, "
                          f"{group.identical} over {run_steps} steps)", markup=False)
            return data
        if group.verdict != DIVERGED:
            raise BisectPrefetchError(f"no verdict: {group.reason}{_log_of_failed(opened, group)}"
                                      " (finished runs are in the journal; a traced run that "
                                      "ran out of memory or time can be retried with a smaller "
                                      f"window: --steps A-B within 1-{last})")
        # 3: the two runs' traces side by side
        explanation = _compare_pair(opened, group, data, graph, last, console)
    # 4: the finding. Where the digests saw it first (metrics/localize.py): the first
    # differing tensor when no traced op read it before the run was stopped.
    data["localization"] = group.localization
    step = group.first_diff_step
    again = None if step is None else given.follow_up(steps=f"{step}-{step}", resume=None)
    for line in explanation_lines(explanation, first_diff_step=step, again=again,
                                  localization=group.localization, pair=data["pair"],
                                  mask=sorted(mask), describe_localization=describe_localization):
        console.print(line, markup=False, soft_wrap=True)
    return data


def _checked_input(experiment_path: Path, *, stress: str | None, runs: int,
                   steps: str | None) -> tuple[Experiment, tuple[int, int] | None]:
    """The experiment (with --stress) and the --steps window, once found sound."""
    if runs < 2:
        raise BisectPrefetchError(f"--runs must be at least 2 for an A/A comparison, got {runs}")
    if stress == STRESS_AUTO:
        raise BisectPrefetchError("--stress is on or off for explain (one group is traced)")
    experiment = with_stress(load_experiment(experiment_path), stress)
    if steps is None:
        return experiment, None
    try:
        return experiment, parse_steps_window(steps)
    except ValueError as e:
        raise BisectPrefetchError(f"--steps: {e}") from None


def _traced_group(opened: OpenState, mask: Mask, *, name: str, edges: int, runs: int,
                  steps: int, guard: str, console: Console) -> AAResult:
    """The A/A group of traced runs under the mask (per stress setting), with its progress."""
    progress = RunProgress(console)

    def before(on: bool) -> None:
        console.print(f"traced A/A under {name} ({len(mask)} of {edges} edges on), "
                      f"stress {'on' if on else 'off'}: up to {runs} runs, until two differ",
                      markup=False)

    with progress:
        return stressed_groups(opened.runner, mode=opened.runner.experiment.stress.mode,
                               before=before, mask=mask, runs=runs, steps=steps, guard=guard,
                               name=name, progress=progress, purpose=PURPOSE)


def _tool_failed(opened: OpenState, group: AAResult) -> None:
    """A traced run in which the tool itself failed: its trace cannot be compared, and
    the failure is the tool's (judge/tool_fault.py), never the input's."""
    for run in group.runs:
        failure = tool_failure(opened.state.run_dir(run.run_id))
        if failure is not None:
            rank = "" if failure["rank"] is None else f" on rank {failure['rank']}"
            raise ToolFailure(f"in traced run {run.run_id}{rank}: {failure['what']} (the "
                              f"rank's log: {failure['log']}); its trace is not compared")


def _log_of_failed(opened: OpenState, group: AAResult) -> str:
    """The log of the first failed run's rank that says why (its fault's line), said."""
    for run in group.runs:
        if run.usable:
            continue
        fault = run.fault or {}
        run_dir = opened.state.run_dir(run.run_id)
        if fault.get("file"):
            rank = "" if fault.get("rank") is None else f"rank {fault['rank']}'s "
            return f"; {rank}log: {run_dir / fault['file']}:{fault.get('line_no')}"
        return f"; its logs: {run_dir}"
    return ""


def _compare_pair(opened: OpenState, group: AAResult, data: dict[str, Any],
                  graph: PrefetchGraph, last: int, console: Console) -> Explanation:
    """The diverged pair's op traces compared, into data, and written beside the state
    dir's other results (the HTML report shows the op and its neighbours)."""
    run_dir = opened.state.run_dir
    reference, other = diverged_pair(group)
    data["pair"] = [reference, other]
    console.print(f"-> runs differ from step {group.first_diff_step} ({reference} vs "
                  f"{other}): comparing their op traces", markup=False)
    if data["overhead"]["granularity"] == "cell":
        console.print("granularity: MindSpore Cells (no op-level hook): the first Cell whose "
                      "output differed, forward, backward (Cell backward hooks) and optimizer",
                      markup=False)
    through = None if group.first_diff_step is None else min(group.first_diff_step, last)
    explanation = compare_traces(run_dir(reference), run_dir(other), through=through)
    data.update(explanation.to_json())
    if data["first"] is not None:
        data["first"]["unit"] = unit_of(data["first"]["module"], graph.nodes())
        data["first"]["edge_note"] = edge_note(explanation, data["mask"])
    data["neighbours"] = neighbours(run_dir(reference), run_dir(other), explanation.first)
    write_text_atomic(opened.path / EXPLAIN_FILE, json.dumps(data, indent=2) + "\n")
    build_report(opened.path)
    return explanation


def unit_of(module: str | None, units: list[str]) -> str | None:
    """The innermost unit (graph node) holding a module."""
    if not module:
        return None
    inside = [u for u in units if module == u or module.startswith(u + ".")]
    return max(inside, key=len) if inside else ("root" if "root" in units else None)


def diverged_pair(group: AAResult) -> tuple[str, str]:
    """The reference run and the run that differed from it first."""
    usable = [run for run in group.runs if run.usable]
    diverged = [run for run in usable if run.first_diff_step is not None]
    if diverged:
        run = min(diverged, key=lambda r: r.first_diff_step)
        return run.reference or usable[0].run_id, run.run_id
    if group.first_pair:  # only the full comparison of the metrics saw it
        return group.first_pair[0], group.first_pair[1]
    raise BisectPrefetchError("the runs differ, but no pair of runs was found to compare")


def explain_command(given: Given, verdict: str, minimal_set: Sequence[str], *,
                    stress: str | None = None) -> str | None:
    """The explain command for a bisection's answer (None where there is nothing to explain):
    the minimal set kept alone, or every edge off for drift that is not prefetch. given: the
    bisect command as given (its options the explain command accepts go along); stress: the
    setting the search ran under where it chose one (explain traces one: on or off)."""
    if verdict == VERDICT_FOUND and minimal_set:
        mask = "keep-only:" + quote_edges(minimal_set)
    elif verdict == VERDICT_NOT_PREFETCH:
        mask = "all-off"
    else:
        return None
    return given.follow_up("explain", mask=mask, resume=None,
                           **({"stress": stress} if stress is not None else {}))


__all__ = ["explain", "explain_command", "explanation_lines", "run_explain"]
