"""An A/A group: K runs of one experiment under one mask, and whether they agree.

The first usable run (A) goes to the end; each further run is compared with
A live and stopped at its first differing step, and once one run diverged
the group is decided (a divergence is conclusive). Then every pair of usable
runs is compared in full for the statistics. Runs that ended in error,
timeout or truncated never make a group consistent: with fewer than two
usable runs the verdict is "error", and so it is when the usable runs agree
but a failed run got part of the way (truncated, or a timeout after some
steps): the steps it never ran may be where the runs part. Environment drift (fingerprints that differ inside the
group) and graph drift (runs that discovered different graphs) are reported
apart from prefetch drift.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from bisect_prefetch.drivers.slots import RunRequest, keep_slots_busy
from bisect_prefetch.judge.merge import GRAPH_FILE
from bisect_prefetch.judge.signals import identical_wording
from bisect_prefetch.judge.step_time import group_cost
from bisect_prefetch.metrics.compare import compare_group
from bisect_prefetch.runs import envprint
from bisect_prefetch.runs.execute import Runner
from bisect_prefetch.runs.executors.base import LOST, LOST_RETRIES
from bisect_prefetch.runs.outcome import RunOutcome
from bisect_prefetch.vocab import (
    CLEAN,
    CONSISTENT,
    DIVERGED,
    ERROR,
    RUN_OUTCOMES,
    STRESS_AUTO,
    STRESS_ON,
    Mask,
)

STAT_FIELDS = ("first_diff_step", "mae", "p95", "max_abs", "steps_compared", "steps_differing")


class Progress(Protocol):
    """What the group tells a progress display (report.progress.RunProgress fits)."""

    def start_group(self, name: str, runs: int) -> None: ...
    def run_started(self, k: int) -> None: ...
    def run_finished(self, k: int, outcome: str, seconds: float, *, reused: bool = False) -> None: ...
    def end_group(self, verdict: str) -> None: ...


@dataclass
class AAResult:
    """What an A/A group concluded, with its runs (its `metrics` come from
    metrics.compare.GroupResult, the pairwise statistics of the runs)."""

    verdict: str  # consistent | diverged | error
    mask: list[str] | None
    guard: str
    steps: int
    runs_requested: int
    runs: list[RunOutcome]
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    first_diff_step: int | None = None
    first_pair: list[str] | None = None
    environment_drift: list[str] = field(default_factory=list)
    graph_drift: list[str] = field(default_factory=list)
    reason: str = ""
    experiment: str = ""
    mask_name: str = ""
    # The earliest divergence read back to a unit (metrics.localize.Localization's JSON).
    localization: dict[str, Any] | None = None
    stress: bool = False  # the runs ran under stress (adapters/stress.py)
    # aa --stress auto: the groups run, without stress and then with it (the last decides)
    stress_groups: list[AAResult] = field(default_factory=list)

    @property
    def signals(self) -> dict[str, Any] | None:
        """What the group's first usable run measured (judge/signals.py)."""
        return next((run.signals for run in self.runs if run.usable and run.signals), None)

    @property
    def runs_usable(self) -> int:
        return sum(run.usable for run in self.runs)

    @property
    def identical(self) -> str:
        """How far "identical" goes for these runs: bitwise only where digests or
        full-precision metrics back it."""
        usable = [run for run in self.runs if run.usable]
        world = max((int((run.environment or {}).get("world_size") or 0) for run in usable),
                    default=0)
        return identical_wording([run.signals for run in usable], steps=self.steps,
                                 world_size=world or None)

    def outcome_counts(self) -> dict[str, int]:
        counts = Counter(run.outcome for run in self.runs)
        return {name: counts.get(name, 0) for name in RUN_OUTCOMES}

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "experiment": self.experiment,
            "mask": self.mask,
            "mask_name": self.mask_name,
            "guard": self.guard,
            "stress": "on" if self.stress else "off",
            "steps": self.steps,
            "runs": len(self.runs),
            "runs_requested": self.runs_requested,
            "outcomes": self.outcome_counts(),
            "metrics": self.metrics,
            "first_diff_step": self.first_diff_step,
            "first_pair": self.first_pair,
            "localization": self.localization,
            "signals": self.signals,
            "identical": self.identical,
            "environment_drift": self.environment_drift,
            "graph_drift": self.graph_drift,
            "reason": self.reason,
            "run_details": [run.to_record() | {"reused": run.reused} for run in self.runs],
            # median and range of the runs' step times (judge/step_time.py); ratio: see matrix/bisect
            "step_time": group_cost((run.step_time_ms for run in self.runs), None),
        }


def _label(outcome: RunOutcome) -> str:
    """A run's word for the progress display: a divergence is what it is counting."""
    if outcome.usable:
        return DIVERGED if outcome.diverged else CLEAN
    return f"{outcome.outcome} ({outcome.why()})"


def run_group(
    runner: Runner,
    *,
    mask: Mask | None,
    runs: int,
    steps: int,
    guard: str,
    purpose: str = "aa",
    name: str = "",
    progress: Progress | None = None,
    stop_at_divergence: bool = True,
) -> AAResult:
    """Run (or reuse from the journal) up to `runs` runs under one mask and judge them."""
    if progress is not None:
        progress.start_group(name or purpose, runs)
    # With several slots the runs go at once: a run started before A finished has
    # nothing to follow live and is compared in full by judge() afterwards.
    finished: dict[tuple[int, int], RunOutcome] = {}  # by (index, attempt)
    retries: list[RunRequest] = []
    reference: str | None = None
    proposed = 0
    stopped = False

    def propose() -> RunRequest | None:
        nonlocal proposed
        if retries:
            return retries.pop(0)
        if stopped or proposed >= runs:
            return None
        index, proposed = proposed, proposed + 1
        key = runner.key(purpose, mask=mask, guard=guard, steps=steps, index=index)
        return RunRequest(key, label=f"{purpose}-k{index}", reference=reference, tag=index)

    def started(request: RunRequest) -> None:
        if progress is not None:
            progress.run_started(request.tag + 1)

    def arrived(request: RunRequest, outcome: RunOutcome) -> None:
        nonlocal reference, stopped
        finished[request.tag, request.key.attempt] = outcome
        if f"{LOST}: " in outcome.reason and request.key.attempt < LOST_RETRIES:
            # The scheduler took the job away (cancelled, preempted, a node lost): run it again.
            key = runner.key(purpose, mask=mask, guard=guard, steps=steps, index=request.tag,
                             attempt=request.key.attempt + 1)
            retries.append(RunRequest(key, label=f"{purpose}-k{request.tag}-a{key.attempt}",
                                      reference=reference, tag=request.tag))
        if progress is not None:
            progress.run_finished(request.tag + 1, _label(outcome), outcome.wall_s or 0.0,
                                  reused=outcome.reused)
        if reference is None and outcome.usable:
            reference = outcome.run_id
        elif stop_at_divergence and outcome.usable and outcome.diverged:
            stopped = True

    refused_before = len(runner.refused)
    keep_slots_busy(runner, propose, arrived, on_start=started)
    done = [finished[at] for at in sorted(finished)]
    if progress is not None:  # what came from the journal, and why the rest did not
        progress.reuse(sum(run.reused for run in done), runner.refused[refused_before:])
    result = judge(runner, done, mask=mask, guard=guard, steps=steps, runs_requested=runs)
    result.mask_name = name
    if progress is not None:
        progress.end_group(result.verdict)
    return result


def judge(runner: Runner, done: list[RunOutcome], *, mask: Mask | None, guard: str,
          steps: int, runs_requested: int) -> AAResult:
    """The verdict and statistics of finished runs."""
    result = AAResult(
        verdict=ERROR, mask=None if mask is None else sorted(mask), guard=guard, steps=steps,
        runs_requested=runs_requested, runs=done, experiment=runner.experiment.name,
        stress=runner.stress,
    )
    usable = [run for run in done if run.usable]
    result.environment_drift = envprint.drift(
        {run.run_id: p for run in done if (p := envprint.read_env(runner.state.run_dir(run.run_id)))}
    )
    result.graph_drift = _graph_drift(runner, usable)
    if len(usable) < 2:
        failed = [f"{run.run_id}: {run.outcome} ({run.why()})" for run in done if not run.usable]
        result.reason = (f"only {len(usable)} usable run(s) of {len(done)}; "
                         + ("; ".join(failed) or "nothing ran"))
        return result
    trajectories = [runner.judge.trajectory(run.run_id) for run in usable]
    group = compare_group(trajectories, runner.judge.names)
    for metric in runner.judge.names:
        pairs = [(p.metrics[metric], p) for p in group.pairs if metric in p.metrics]
        if not pairs:
            continue
        diff, pair = min(pairs, key=lambda dp: (dp[0].first_diff_step is None,
                                                 dp[0].first_diff_step or 0))
        stats = diff.to_json()
        result.metrics[metric] = {
            **{f: stats[f] for f in STAT_FIELDS},
            "pair": [usable[pair.a].run_id, usable[pair.b].run_id],
            # which rank differed first, and every rank's statistics (metrics/compare.py)
            "first_diff_rank": stats["first_diff_rank"],
            "rank": stats["rank"],
            "per_rank": stats["per_rank"],
        }
    digest_problems = _digests_against_first(runner, usable)
    first = group.first
    live = [run.first_diff_step for run in usable if run.first_diff_step is not None]
    steps_found = live + ([first[0]] if first else [])
    result.first_diff_step = min(steps_found, default=None)
    if first:
        result.first_pair = [usable[first[1].a].run_id, usable[first[1].b].run_id]
    if result.first_diff_step is not None:
        result.verdict = DIVERGED
        result.localization = _earliest_localization(usable)
        return result
    if digest_problems:
        result.reason = "gradient digests cannot vouch for these runs: " + "; ".join(digest_problems)
        return result
    # A failed run that got part of the way (truncated, or a timeout after some steps)
    # may have stopped just before the step where the runs part: no clean verdict.
    # (A run whose job the scheduler took away says nothing: it was run again.)
    short = [f"{run.run_id}: {run.outcome}, {run.why()}" for run in done
             if not run.usable and 0 < run.steps_done < steps
             and not run.reason.startswith(f"{LOST}: ")]
    if short:
        result.reason = (f"{len(short)} run(s) stopped short of the {steps} steps asked "
                         f"({'; '.join(short)}): consistent needs every run to complete them")
        return result
    result.verdict = CONSISTENT
    return result


def _digests_against_first(runner: Runner, usable: list[RunOutcome]) -> list[str]:
    """Digests of runs that had no reference (started alongside the first) against the first's.

    Returns the digest problems found; a run's divergence lands in its first_diff_step.
    """
    problems = []
    for run in usable[1:]:
        if run.reference is None:
            problems += runner.judge.digests(run, usable[0].run_id)
    return problems


def _earliest_localization(usable: list[RunOutcome]) -> dict[str, Any] | None:
    """The localization of the run whose digests differed first."""
    located = [run.localization for run in usable if run.localization is not None]
    return min(located, key=lambda where: where["step"], default=None)


def _graph_drift(runner: Runner, usable: list[RunOutcome]) -> list[str]:
    graphs = {}
    for run in usable:
        path = runner.state.run_dir(run.run_id) / GRAPH_FILE
        try:
            graphs[run.run_id] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    if not graphs:
        return []
    first_id, first = next(iter(graphs.items()))
    return [f"run {run_id} discovered a different prefetch graph than run {first_id}"
            for run_id, graph in graphs.items() if graph != first]


__all__ = ["AAResult", "judge", "run_group"]


def stressed_groups(runner: Runner, *, mode: str, before: Callable[[bool], None] | None = None,
                    **group: Any) -> AAResult:
    """The A/A group under a stress mode (adapters/stress.py); ``group``: run_group's arguments.

    on: the runs run under stress. auto: without stress first and, when that group is
    consistent, as many runs again under stress: stress can only add a finding, and a
    consistent verdict stands on runs without it too. The result is the last group run,
    with every group run in ``stress_groups``. before(stress) is called before each group.
    """
    groups: list[AAResult] = []
    for on in {STRESS_ON: [True], STRESS_AUTO: [False, True]}.get(mode, [False]):
        if groups and groups[-1].verdict != CONSISTENT:
            break  # a divergence (or an error) without stress decides
        runner.stress = on
        if before is not None:
            before(on)
        groups.append(run_group(runner, **group))
    result = groups[-1]
    result.stress_groups = groups
    return result
