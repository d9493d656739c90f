"""`bisect-prefetch explain`: the first op whose output differs while its inputs matched.

Steps, each printed as it happens: the experiment and the traced steps, the A/A group under
the mask (default all-on) with every op of those steps traced (adapters/op_trace.py), run
as `aa` runs one (the golden run to the end, each further run stopped at its first
differing step, the journal), until two runs differ or every run agrees; then the two runs'
traces side by side (metrics/op_compare.py): per rank the first op that differs and its
kind, and across ranks the finding.

Exit codes: 0 every run agreed ("consistent: nothing to explain"), 1 a finding (an op that
differs first, or the place where the runs' ops stopped lining up), 2 bad input.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from bisect_prefetch.commands.common import (
    check_outputs,
    command_line,
    options,
    resume_hint_on_interrupt,
    write_json,
)
from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.experiment import (
    Experiment,
    load_experiment,
    parse_steps_window,
    with_overrides,
    with_stress,
)
from bisect_prefetch.files import write_text_atomic
from bisect_prefetch.metrics.op_compare import (
    ALIGNMENT_BROKEN,
    EXPLAINED,
    Explanation,
    RankFinding,
    compare_traces,
    neighbours,
)
from bisect_prefetch.report.html import EXPLAIN_FILE, build_report
from bisect_prefetch.report.localization import describe as describe_localization
from bisect_prefetch.report.progress import RunProgress
from bisect_prefetch.runs.group import AAResult, stressed_groups
from bisect_prefetch.runs.state import OpenState, open_state
from bisect_prefetch.select import describe, resolve_mask
from bisect_prefetch.vocab import (
    CONSISTENT,
    DIVERGED,
    STRESS_AUTO,
    VERDICT_FOUND,
    VERDICT_NOT_PREFETCH,
    Mask,
    probe_rank_file,
)

PURPOSE = "explain"
TIMEOUT_FACTOR = 4  # traced runs get the experiment's timeouts times this
KIND_WORDS = {
    "origin": "origin: inputs matched, output differed",
    "receiver": "receiver: the difference came from another rank",
    "changed-behind": "changed-behind: a buffer was written outside the traced ops",
    "untraced-input": "untraced-input: an input no traced op wrote differed",
    "alignment": "alignment broke: the runs ran different ops",
}


def explain(
    experiment_path: Path,
    *,
    masks: Sequence[str] = (),
    stress: str | None = None,
    runs: int = 4,
    steps: str | None = None,
    state_dir: Path,
    console: Console,
    json_out: Path | None = None,
) -> int:
    """Run (or resume) the traced A/A group and explain its first divergence."""
    resume = command_line("explain", str(experiment_path), *options(
        mask=list(masks), stress=stress, runs=runs, steps=steps, state_dir=state_dir))
    with resume_hint_on_interrupt(console, resume):
        data = run_explain(experiment_path, masks=masks, stress=stress, runs=runs, steps=steps,
                           state_dir=state_dir, console=console, outputs=(json_out,))
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
    outputs: Sequence[Path | None] = (),
) -> dict[str, Any]:
    """The traced group, narrated; returns the JSON of docs/contract.md."""
    experiment, window = _checked_input(experiment_path, stress=stress, runs=runs, steps=steps)
    check_outputs(*outputs, state_dir=state_dir, name=experiment.name)
    with open_state(experiment, state_dir, console=console) as opened:
        edge_ids = opened.graph().edge_ids()  # discovered (or reused) without tracing
        # stage 1: the steps to trace; from here on the runner's runs are traced runs
        # (other keys, other runs in the journal)
        first, last = _traced_steps(opened, experiment, window, console)
        mask = resolve_mask(list(masks), edge_ids)
        name = describe(mask, edge_ids)
        # stage 2: the traced A/A group, until two runs differ
        group = _traced_group(opened, mask, name=name, edges=len(edge_ids), runs=runs, last=last,
                              guard=experiment.guard, console=console)
        data: dict[str, Any] = {"verdict": group.verdict, "first": None, "ranks": [],
                                "mask": sorted(mask), "mask_name": name,
                                "steps": [first, last], "runs": len(group.runs),
                                "first_diff_step": group.first_diff_step, "pair": None,
                                "overhead": overhead(group, opened.state.run_dir,
                                                     opened.state.records())}
        if group.verdict == CONSISTENT:
            console.print(f"-> consistent: nothing to explain ({group.runs_usable} runs, "
                          f"{group.identical} over {last} steps)", markup=False)
            return data
        if group.verdict != DIVERGED:
            raise BisectPrefetchError(
                f"no verdict: {group.reason} (finished runs are in the journal; a traced run "
                "that ran out of memory or time can be retried with a smaller window: "
                f"--steps A-B within 1-{last})")
        # stage 3: the two runs' traces side by side
        explanation = _compare_pair(opened, group, data, console)
    # stage 4: the finding. Where the digests saw it first (metrics/localize.py): the first
    # differing tensor when no traced op read it before the run was stopped.
    data["localization"] = group.localization
    step = group.first_diff_step
    again = None if step is None else command_line("explain", str(experiment_path), *options(
        mask=list(masks), stress=stress, runs=runs, steps=f"{step}-{step}"))
    for line in explanation_lines(explanation, first_diff_step=step, again=again,
                                  localization=group.localization):
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


def _traced_steps(opened: OpenState, experiment: Experiment, window: tuple[int, int] | None,
                  console: Console) -> tuple[int, int]:
    """The window to trace (asked, or where earlier runs differed), said; the runner's
    experiment becomes the traced one."""
    why = "asked"
    if window is None:
        window, why = default_window(opened.state.records(), experiment.steps)
    first, last = window
    console.print(f"every op of steps {first}-{last} traced on every rank ({why}), runs of "
                  f"{last} steps", markup=False)
    opened.runner.experiment = traced_experiment(experiment, first, last)
    return first, last


def _traced_group(opened: OpenState, mask: Mask, *, name: str, edges: int, runs: int, last: int,
                  guard: str, console: Console) -> AAResult:
    """The A/A group of traced runs under the mask (per stress setting), with its progress."""
    progress = RunProgress(console)

    def before(on: bool) -> None:
        console.print(f"traced A/A under {name} ({len(mask)} of {edges} edges on), "
                      f"stress {'on' if on else 'off'}: up to {runs} runs, until two differ",
                      markup=False)

    with progress:
        return stressed_groups(opened.runner, mode=opened.runner.experiment.stress.mode,
                               before=before, mask=mask, runs=runs, steps=last, guard=guard,
                               name=name, progress=progress, purpose=PURPOSE)


def _compare_pair(opened: OpenState, group: AAResult, data: dict[str, Any],
                  console: Console) -> Explanation:
    """The diverged pair's op traces compared, into data, and written beside the state
    dir's other results (the HTML report shows the op and its neighbours)."""
    run_dir = opened.state.run_dir
    reference, other = diverged_pair(group)
    data["pair"] = [reference, other]
    console.print(f"-> runs differ from step {group.first_diff_step} ({reference} vs "
                  f"{other}): comparing their op traces", markup=False)
    if data["overhead"]["granularity"] == "cell":
        console.print("granularity: MindSpore Cells (no op-level hook): the first Cell whose "
                      "output differed, forward and optimizer only", markup=False)
    explanation = compare_traces(run_dir(reference), run_dir(other))
    data.update(explanation.to_json())
    data["neighbours"] = neighbours(run_dir(reference), run_dir(other), explanation.first)
    write_text_atomic(opened.path / EXPLAIN_FILE, json.dumps(data, indent=2) + "\n")
    build_report(opened.path)
    return explanation


def default_window(records: list[dict[str, Any]], steps: int) -> tuple[tuple[int, int], str]:
    """The steps to trace when --steps is not given: those where earlier runs of this
    experiment (aa, bisect, matrix: not explain's own, so a resumed explain keeps its window)
    first differed, else every step."""
    seen = sorted({r["first_diff_step"] for r in records
                   if isinstance(r.get("first_diff_step"), int)
                   and not str(r.get("variant", "")).startswith(PURPOSE + "+")
                   and 1 <= r["first_diff_step"] <= steps})
    if seen:
        return (seen[0], seen[-1]), "where earlier runs of this experiment first differed"
    return (1, steps), "every step: no earlier run of this experiment differed"


def traced_experiment(experiment: Experiment, first: int, last: int) -> Experiment:
    """The experiment whose runs trace steps first-last and end at last.

    A step after the window cannot explain a step in it. A traced step costs several
    untraced ones (docs/explain.md): the timeouts grow alike."""
    overrides: dict[str, Any] = {"record.trace": f"{first}-{last}", "steps": last,
                                 "timeout_s": experiment.timeout_s * TIMEOUT_FACTOR}
    if experiment.no_progress_timeout_s is not None:
        overrides["no_progress_timeout_s"] = experiment.no_progress_timeout_s * TIMEOUT_FACTOR
    return with_overrides(experiment, overrides)


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


def overhead(group: AAResult, run_dir: Any,
             records: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """What tracing cost, from the ranks' probes: ops and bytes per traced step, flush time,
    the traced runs' step times, and beside them the untraced runs' of this experiment in
    the journal (other machine load, other steps: an indication, not a measurement;
    bench_explain measures side by side)."""
    ops, written, flush, steps, granularity = [], [], [], [], set()
    for run in group.runs:
        for probe in Path(run_dir(run.run_id)).glob(probe_rank_file("*")):
            try:
                trace = json.loads(probe.read_text()).get("op_trace")
            except (OSError, ValueError):
                continue
            if trace:
                granularity.add(trace.get("granularity", "op"))
                count = max(trace["steps"][1] - trace["steps"][0] + 1, 1)
                ops.append(trace["ops"] / count)
                written.append(trace["bytes"] / count)
                flush.append(trace["flush_s"] / count * 1000)
                steps.append(count)
    times = [run.step_time_ms for run in group.runs if run.step_time_ms is not None]

    def median(values: list[float]) -> float | None:
        return round(statistics.median(values), 1) if values else None

    untraced = [r["step_time_ms"] for r in records
                if isinstance(r.get("step_time_ms"), (int, float))
                and not str(r.get("variant", "")).startswith(PURPOSE + "+")]
    traced_ms, untraced_ms = median(times), median(untraced)
    return {"ops_per_step": median(ops), "bytes_per_step": median(written),
            "flush_ms_per_step": median(flush), "step_time_ms": traced_ms,
            "untraced_step_time_ms": untraced_ms,
            "ratio": round(traced_ms / untraced_ms, 2) if traced_ms and untraced_ms else None,
            "rank_records": len(ops),
            # op: torch's dispatcher ops; cell: MindSpore Cell calls (adapters/cell_trace.py)
            "granularity": "cell" if "cell" in granularity else "op"}


def where(finding: RankFinding) -> str:
    place = f"{finding.phase} of {finding.module}" if finding.module else (finding.phase or "")
    return f"rank {finding.rank}, step {finding.step}, {place}"


def explanation_lines(explanation: Explanation, *, first_diff_step: int | None,
                      again: str | None = None,
                      localization: dict[str, Any] | None = None) -> list[str]:
    """The terminal lines of a comparison (the finding, each rank, what to do next)."""
    first = explanation.first
    traced = explanation.steps_traced
    if first is None:
        window = f"{traced[0]}-{traced[-1]}" if traced else "none"
        lines = [f"no traced op differs (steps traced: {window}; the runs first differ at step "
                 f"{first_diff_step}): no op the dispatcher ran read the difference before the "
                 "run was stopped, or it arose outside the traced steps"]
        if where_digests := describe_localization(localization):
            lines.append(f"first differing tensor, from the digests: {where_digests}")
        if again and first_diff_step is not None and first_diff_step not in traced:
            lines.append(f"trace that step: {again}")
        return lines
    lines = []
    if explanation.verdict == ALIGNMENT_BROKEN:
        lines.append(f"alignment broke: {where(first)}, {first.seq} ops after the step began: "
                     f"{first.op} in one run, {first.other_op} in the other (the runs' control "
                     "flow differs before any fingerprint did)")
    elif explanation.verdict == EXPLAINED:
        lines.append(f"first divergence: {where(first)}: {first.op} "
                     f"({KIND_WORDS.get(first.kind, first.kind)}), {first.seq} ops after the "
                     "step began")
    if first.stack:
        lines.append(f"  at {first.stack}")
    if first.detail and explanation.verdict == EXPLAINED and first.kind != "origin":
        lines.append(f"  {first.detail}")
    for finding in explanation.ranks:
        if finding is first:
            continue
        if finding.kind is None:
            lines.append(f"rank {finding.rank}: every one of its {finding.ops_compared} ops "
                         "compared agrees")
        elif (finding.step, finding.seq, finding.op, finding.kind) == (
                first.step, first.seq, first.op, first.kind):
            lines.append(f"rank {finding.rank}: the same op")
        else:
            lines.append(f"{where(finding)}: {finding.op} ({finding.kind}), {finding.seq} ops "
                         "after the step began")
    return lines


def explain_command(experiment_path: Path, verdict: str, minimal_set: Sequence[str], *,
                    state_dir: Path | None = None) -> str | None:
    """The explain command for a bisection's answer (None where there is nothing to explain):
    the minimal set kept alone, or every edge off for drift that is not prefetch; with the
    state dir given, explain reuses its graph discovery instead of tracing a new one."""
    if verdict == VERDICT_FOUND and minimal_set:
        mask = "keep-only:" + ",".join(minimal_set)
    elif verdict == VERDICT_NOT_PREFETCH:
        mask = "all-off"
    else:
        return None
    return command_line("explain", str(experiment_path), *options(mask=mask, state_dir=state_dir))
