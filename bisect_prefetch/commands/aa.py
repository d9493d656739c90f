"""`bisect-prefetch aa`: an A/A group of K runs under one mask, narrated, with its verdict.

In order, each printed as it happens: the experiment, the graph (discovered by
one short run, or a static policy), the mask, the runs, then the comparison
table (metric, first differing step, MAE, P95, max abs) and the verdict.
Finished runs are in the journal: the same command with --resume takes them again (with
--reuse, runs of earlier commands too), after the checks of runs/reuse.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from bisect_prefetch.commands.common import (
    Given,
    check_outputs,
    repeated_steps_note,
    resume_hint_on_interrupt,
    reuse_options,
    write_json,
)
from bisect_prefetch.drivers.group import AAResult, stressed_groups
from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.experiment import (
    Experiment,
    check_steps_settable,
    load_experiment,
    with_overrides,
    with_stress,
)
from bisect_prefetch.judge.signals import describe_stress, not_localized_wording
from bisect_prefetch.judge.step_time import WARMUP_STEPS, fix_cost_line, fix_costs
from bisect_prefetch.report.localization import describe as describe_localization
from bisect_prefetch.report.progress import RunProgress
from bisect_prefetch.report.table import group_table
from bisect_prefetch.runs.sessions import Scope
from bisect_prefetch.runs.state import open_state
from bisect_prefetch.select import describe, resolve_mask
from bisect_prefetch.vocab import CONSISTENT, DIVERGED, STRESS_AUTO


def aa(
    experiment_path: Path,
    *,
    masks: Sequence[str] = (),
    runs: int = 2,
    steps: int | None = None,
    guard: str | None = None,
    state_dir: Path,
    console: Console,
    json_out: Path | None = None,
    executor: str | None = None,
    slots: int | None = None,
    stress: str | None = None,
    reuse: bool | None = None,
    resume: bool = False,
) -> int:
    """Run (or resume) the A/A group; exit code 0 consistent, 1 diverged.

    reuse: --reuse (True) takes runs of earlier commands after the checks, --no-reuse
    (False) or neither (None) none; resume: --resume continues the latest aa of this
    experiment (runs/sessions.py)."""
    given = Given("aa", experiment_path, {
        "mask": list(masks), "runs": runs, "steps": steps, "guard": guard,
        "state_dir": state_dir, "executor": executor, "slots": slots, "stress": stress,
        "json": json_out, "resume": resume, **reuse_options(reuse)})
    with resume_hint_on_interrupt(console, given.follow_up(resume=True)):
        result = run_aa(experiment_path, masks=masks, runs=runs, steps=steps, guard=guard,
                        state_dir=state_dir, console=console, executor=executor, slots=slots,
                        stress=stress, outputs=(json_out,),
                        scope=Scope("aa", resume=resume, earlier=bool(reuse)))
    if json_out is not None:
        write_json(json_out, result.to_json() | {"stress_groups": [
            {"stress": "on" if g.stress else "off", "verdict": g.verdict, "runs": len(g.runs)}
            for g in result.stress_groups]}, console)
    if result.verdict == "error":
        raise BisectPrefetchError(f"no verdict: {result.reason}")
    return 0 if result.verdict == CONSISTENT else 1


def run_aa(
    experiment_path: Path,
    *,
    masks: Sequence[str],
    runs: int,
    steps: int | None,
    guard: str | None,
    state_dir: Path,
    console: Console,
    executor: str | None = None,
    slots: int | None = None,
    stress: str | None = None,
    outputs: Sequence[Path | None] = (),
    scope: Scope | None = None,
) -> AAResult:
    """The group with its narration, table and verdict line.

    Under ``stress: on`` the runs run under stress (adapters/stress.py). Under ``auto``
    the group runs without stress first and, if consistent, as many runs again under
    stress: stress can only add a finding, and a consistent verdict stands on runs
    without it too. ``result.stress_groups`` holds each group run.
    """
    if runs < 2:
        raise BisectPrefetchError(f"--runs must be at least 2 for an A/A comparison, got {runs}")
    experiment = load_experiment(experiment_path)
    if steps is not None:
        if steps < 1:
            raise BisectPrefetchError(f"--steps must be at least 1, got {steps}")
        check_steps_settable(experiment, steps, "--steps")
        experiment = with_overrides(experiment, {"steps": steps})
    check_outputs(*outputs, state_dir=state_dir, name=experiment.name)
    experiment = with_stress(experiment, stress)
    mode = experiment.stress.mode
    guard = guard or experiment.guard
    console.print(_describe_experiment(experiment), markup=False)
    with open_state(experiment, state_dir, console=console, executor=executor,
                    slots=slots, scope=scope or Scope("aa")) as opened:
        edge_ids = opened.graph().edge_ids()
        mask = resolve_mask(list(masks), edge_ids)
        name = describe(mask, edge_ids)
        progress = RunProgress(console)

        def before(on: bool) -> None:
            if on and mode == STRESS_AUTO:
                console.print(f"-> consistent without stress; stress auto: {runs} more runs "
                              "under stress, which can only add a finding", markup=False)
            console.print(f"A/A under {name} ({len(mask)} of {len(edge_ids)} edges on), "
                          f"guard {guard}, stress {'on' if on else 'off'}: up to {runs} runs",
                          markup=False)

        with progress:
            result = stressed_groups(opened.runner, mode=mode, before=before, mask=mask,
                                     runs=runs, steps=experiment.steps, guard=guard, name=name,
                                     progress=progress)
        # Against all-on runs of this experiment in the journal (from aa, bisect or matrix):
        # what dropping the edges this mask leaves out, or the guard, costs.
        against_all_on = fix_cost_line(
            fix_costs(opened.state.records(), edge_ids=edge_ids,
                      fix=set(edge_ids) - set(mask) if guard == "none" else (),
                      variant_suffix="@" + experiment.fingerprint()),
            set(edge_ids) - set(mask))
        repeated = sum(opened.runner.judge.trajectory(run.run_id).steps_repeated
                       for run in result.runs if run.usable)
    _say_group(result, console, repeated=repeated, against_all_on=against_all_on)
    return result


def _say_group(result: AAResult, console: Console, *, repeated: int,
               against_all_on: str | None) -> None:
    """The lines under the group's runs: repeated steps, stress, the table, drift, step
    time, what the mask would cost against all-on, and the verdict line."""
    if note := repeated_steps_note(repeated):  # said once for the group, never a difference
        console.print(note, markup=False, soft_wrap=True)
    for group in result.stress_groups:
        if group.stress:  # what the delays were (the signals line said the first run's)
            console.print(describe_stress((group.signals or {}).get("stress"))
                          or "stress: no run recorded its delays", markup=False, soft_wrap=True)
    if result.metrics:
        console.print(group_table(result.to_json()))
    for line in result.environment_drift:
        console.print(f"environment drift (not prefetch drift): {line}", markup=False,
                      soft_wrap=True)
    for line in result.graph_drift:
        console.print(f"graph drift: {line}", markup=False, soft_wrap=True)
    cost = result.to_json()["step_time"]
    if cost is not None:  # only runs with the adapter time their steps
        console.print(f"step time: {cost['median_ms']:.1f} ms (runs {cost['min_ms']:.1f}-"
                      f"{cost['max_ms']:.1f} ms, median after {WARMUP_STEPS} warm-up steps)",
                      markup=False)
    if against_all_on:
        console.print(against_all_on, markup=False, soft_wrap=True)
    console.print(verdict_line(result), markup=False, soft_wrap=True)


def _describe_experiment(experiment: Experiment) -> str:
    w = experiment.workload
    if w is not None:
        what = f"{w.builtin} workload, {w.layers} layers, {w.world_size} rank(s)"
        if w.fault is not None:
            what += (", planted fault (a race)" if w.fault.hazard is None
                     else f", planted fault (hazard {w.fault.hazard:g})")
    else:
        what = f"command {experiment.command[0]}"
    return f"experiment {experiment.name}: {what}, {experiment.steps} steps, seed {experiment.seed}"


def verdict_line(result: AAResult) -> str:
    # Runs that ended in error or timeout are in no verdict: say so, never count them.
    usable = sum(run.usable for run in result.runs)
    failed = len(result.runs) - usable
    not_counted = f"; {failed} failed run(s) not counted" if failed else ""
    stress = " under stress" if result.stress else ""
    if result.verdict == CONSISTENT:
        steps = max((m.get("steps_compared", 0) for m in result.metrics.values()), default=0)
        also = "".join(f"; and {group.runs_usable} runs without stress"
                       for group in result.stress_groups[:-1] if not group.stress)
        return (f"-> consistent ({usable} runs{stress}, {result.identical} over {steps} steps"
                f"{not_counted}){also}")
    if result.verdict == DIVERGED:
        pair = " vs ".join(result.first_pair or [])
        where = describe_localization(result.localization) or not_localized_wording(
            [run.signals for run in result.runs if run.usable])
        return (f"-> diverged at step {result.first_diff_step}{stress}"
                + (f" ({pair}{not_counted})" if pair else not_counted)
                + (f"; {where}" if where else ""))
    return f"-> error: {result.reason}"
