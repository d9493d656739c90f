"""An A/A group: K runs of one experiment under one mask, and whether they agree.

The first usable run (A) goes to the end; each further run is compared with
A live and stopped at its first differing step, and once one run diverged
the group is decided (a divergence is conclusive). Then every pair of usable
runs is compared in full for the statistics. Runs that ended in error or
timeout never make a group consistent: with fewer than two usable runs the
verdict is "error". Environment drift (fingerprints that differ inside the
group) and graph drift (runs that discovered different graphs) are reported
apart from prefetch drift.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

from bisect_prefetch.metrics.compare import compare_group
from bisect_prefetch.runs import envprint
from bisect_prefetch.runs.execute import Runner, RunOutcome
from bisect_prefetch.runs.launcher import OUTCOMES
from bisect_prefetch.runs.merge import GRAPH_FILE

STAT_FIELDS = ("first_diff_step", "mae", "p95", "max_abs", "steps_compared", "steps_differing")


class Progress(Protocol):
    """What the group tells a progress display (report.progress.RunProgress fits)."""

    def start_group(self, name: str, runs: int) -> None: ...
    def run_started(self, k: int) -> None: ...
    def run_finished(self, k: int, outcome: str, seconds: float, *, reused: bool = False) -> None: ...
    def end_group(self, verdict: str) -> None: ...


@dataclass
class GroupResult:
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

    def outcome_counts(self) -> dict[str, int]:
        counts = Counter(run.outcome for run in self.runs)
        return {name: counts.get(name, 0) for name in OUTCOMES}

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "experiment": self.experiment,
            "mask": self.mask,
            "mask_name": self.mask_name,
            "guard": self.guard,
            "steps": self.steps,
            "runs": len(self.runs),
            "runs_requested": self.runs_requested,
            "outcomes": self.outcome_counts(),
            "metrics": self.metrics,
            "first_diff_step": self.first_diff_step,
            "first_pair": self.first_pair,
            "environment_drift": self.environment_drift,
            "graph_drift": self.graph_drift,
            "reason": self.reason,
            "run_details": [run.to_record() | {"reused": run.reused} for run in self.runs],
        }


def _label(outcome: RunOutcome) -> str:
    """A run's word for the progress display: a divergence is what it is counting."""
    if outcome.usable:
        return "diverged" if outcome.diverged else "same"
    return f"{outcome.outcome} ({outcome.reason})"


def run_group(
    runner: Runner,
    *,
    mask: frozenset[str] | None,
    runs: int,
    steps: int,
    guard: str,
    purpose: str = "aa",
    name: str = "",
    progress: Progress | None = None,
    stop_at_divergence: bool = True,
) -> GroupResult:
    """Run (or reuse from the journal) up to `runs` runs under one mask and judge them."""
    if progress is not None:
        progress.start_group(name or purpose, runs)
    done: list[RunOutcome] = []
    reference: str | None = None
    for index in range(runs):
        key = runner.key(purpose, mask=mask, guard=guard, steps=steps, index=index)
        if progress is not None:
            progress.run_started(index + 1)
        outcome = runner.run(key, label=f"{purpose}-k{index}", reference=reference)
        done.append(outcome)
        if progress is not None:
            progress.run_finished(index + 1, _label(outcome), outcome.wall_s or 0.0,
                                  reused=outcome.reused)
        if reference is None and outcome.usable:
            reference = outcome.run_id
        elif stop_at_divergence and outcome.usable and outcome.diverged:
            break
    result = judge(runner, done, mask=mask, guard=guard, steps=steps, runs_requested=runs)
    result.mask_name = name
    if progress is not None:
        progress.end_group(result.verdict)
    return result


def judge(runner: Runner, done: list[RunOutcome], *, mask: frozenset[str] | None, guard: str,
          steps: int, runs_requested: int) -> GroupResult:
    """The verdict and statistics of finished runs."""
    result = GroupResult(
        verdict="error", mask=None if mask is None else sorted(mask), guard=guard, steps=steps,
        runs_requested=runs_requested, runs=done, experiment=runner.experiment.name,
    )
    usable = [run for run in done if run.usable]
    result.environment_drift = envprint.drift(
        {run.run_id: p for run in done if (p := envprint.read_env(runner.state.run_dir(run.run_id)))}
    )
    result.graph_drift = _graph_drift(runner, usable)
    if len(usable) < 2:
        failed = [f"{run.run_id}: {run.outcome} ({run.reason})" for run in done if not run.usable]
        result.reason = (f"only {len(usable)} usable run(s) of {len(done)}; "
                         + ("; ".join(failed) or "nothing ran"))
        return result
    trajectories = [runner.trajectory(run.run_id) for run in usable]
    group = compare_group(trajectories, runner.names)
    for metric in runner.names:
        pairs = [(p.metrics[metric], p) for p in group.pairs if metric in p.metrics]
        if not pairs:
            continue
        diff, pair = min(pairs, key=lambda dp: (dp[0].first_diff_step is None,
                                                 dp[0].first_diff_step or 0))
        stats = diff.to_json()
        result.metrics[metric] = {
            **{f: stats[f] for f in STAT_FIELDS},
            "pair": [usable[pair.a].run_id, usable[pair.b].run_id],
        }
    first = group.first
    live = [run.first_diff_step for run in usable if run.first_diff_step is not None]
    steps_found = live + ([first[0]] if first else [])
    result.first_diff_step = min(steps_found, default=None)
    if first:
        result.first_pair = [usable[first[1].a].run_id, usable[first[1].b].run_id]
    result.verdict = "diverged" if result.first_diff_step is not None else "consistent"
    return result


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


__all__ = ["GroupResult", "judge", "run_group"]
