"""`bisect-prefetch aa`: an A/A group of K runs under one mask, narrated, with its verdict.

Steps, each printed as it happens: the experiment, the graph (discovered by
one short run, or a static policy), the mask, the runs, then the comparison
table (metric, first differing step, MAE, P95, max abs) and the verdict.
Finished runs are in the journal: the same command again reuses them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.experiment import Experiment, load_experiment, with_overrides
from bisect_prefetch.report.progress import RunProgress
from bisect_prefetch.report.table import group_table
from bisect_prefetch.runs.discover import discover_graph
from bisect_prefetch.runs.execute import Runner
from bisect_prefetch.runs.group import GroupResult, run_group
from bisect_prefetch.runs.store import StateDir
from bisect_prefetch.select import describe, resolve_mask


def _describe_experiment(experiment: Experiment, steps: int) -> str:
    w = experiment.workload
    if w is not None:
        what = f"{w.builtin} workload, {w.layers} layers, {w.world_size} rank(s)"
        if w.fault is not None:
            what += f", planted fault (hazard {w.fault.hazard:g})"
    else:
        what = f"command {experiment.command[0]}"
    return f"experiment {experiment.name}: {what}, {steps} steps, seed {experiment.seed}"


def verdict_line(result: GroupResult) -> str:
    # Runs that ended in error or timeout are in no verdict: say so, never count them.
    usable = sum(run.usable for run in result.runs)
    failed = len(result.runs) - usable
    not_counted = f"; {failed} failed run(s) not counted" if failed else ""
    if result.verdict == "consistent":
        steps = max((m.get("steps_compared", 0) for m in result.metrics.values()), default=0)
        return (f"-> consistent ({usable} runs, bitwise identical over {steps} steps"
                f"{not_counted})")
    if result.verdict == "diverged":
        pair = " vs ".join(result.first_pair or [])
        return (f"-> diverged at step {result.first_diff_step}"
                + (f" ({pair}{not_counted})" if pair else not_counted))
    return f"-> error: {result.reason}"


def run_aa(
    experiment_path: str | Path,
    *,
    masks: Sequence[str] = (),
    runs: int = 2,
    steps: int | None = None,
    guard: str | None = None,
    state_dir: str | Path,
    console: Console,
) -> GroupResult:
    """Run (or resume) the A/A group and print its narration, table and verdict."""
    if runs < 2:
        raise BisectPrefetchError(f"--runs must be at least 2 for an A/A comparison, got {runs}")
    experiment = load_experiment(experiment_path)
    if steps is not None:
        if steps < 1:
            raise BisectPrefetchError(f"--steps must be at least 1, got {steps}")
        experiment = with_overrides(experiment, {"steps": steps})
    guard = guard or experiment.guard
    console.print(_describe_experiment(experiment, experiment.steps), markup=False)
    with StateDir(state_dir, experiment.name) as state:
        if state.torn_line is not None:
            console.print("note: the journal's last line was torn by a kill and was dropped",
                          markup=False)
        runner = Runner(experiment, state)
        if runner.killed_leftovers:
            console.print(f"note: killed {len(runner.killed_leftovers)} process(es) left running "
                          "by an earlier orchestrator that was killed", markup=False, soft_wrap=True)
        graph = discover_graph(runner, console)
        edge_ids = graph.edge_ids()
        mask = resolve_mask(list(masks), edge_ids)
        name = describe(mask, edge_ids)
        console.print(f"A/A under {name} ({len(mask)} of {len(edge_ids)} edges on), "
                      f"guard {guard}: up to {runs} runs", markup=False)
        with RunProgress(console) as progress:
            result = run_group(runner, mask=mask, runs=runs, steps=experiment.steps, guard=guard,
                               name=name, progress=progress)
    if result.metrics:
        console.print(group_table(result.to_json()))
    for line in result.environment_drift:
        console.print(f"environment drift (not prefetch drift): {line}", markup=False,
                      soft_wrap=True)
    for line in result.graph_drift:
        console.print(f"graph drift: {line}", markup=False, soft_wrap=True)
    console.print(verdict_line(result), markup=False, soft_wrap=True)
    return result

