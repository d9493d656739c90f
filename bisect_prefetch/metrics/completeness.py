"""Whether a run logged everything a verdict needs: every configured metric, every step up
to the steps asked, on every rank that logs it, and the same ranks and metrics as the run
it is compared with. A run that lacks any of it is never clean (issue 26): the steps it
never logged may be where the runs part.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bisect_prefetch.metrics.trajectory import Trajectory

SHOWN = 3  # problems named in full; the rest are counted
# Why a whole log is one step short: the job numbers its steps from 0, the tool from 1.
ZERO_BASED_HINT = ("the job's steps start at 0, the tool's at 1: log step + 1, or, for a job "
                   "that runs a fixed number of steps, ask for one step less")


def step_ranges(steps: Sequence[int]) -> str:
    """`2-4, 7` for [2, 3, 4, 7]."""
    parts: list[str] = []
    start = prev = None
    for step in steps:
        if prev is not None and step == prev + 1:
            prev = step
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = step
    if start is not None:
        parts.append(str(start) if start == prev else f"{start}-{prev}")
    return ", ".join(parts)


def _summary(problems: list[str]) -> str:
    more = len(problems) - SHOWN
    return "; ".join(problems[:SHOWN]) + (f"; and {more} more" if more > 0 else "")


def short_series(trajectory: Trajectory, names: Sequence[str], steps: int) -> str | None:
    """The ranks and metrics whose log stops before step `steps` (a truncated run), or None."""
    problems = []
    for rank, metrics in trajectory.per_rank.items():
        for name in names:
            series = metrics.get(name)
            if series is not None and len(series) and int(series.steps[-1]) < steps:
                last = int(series.steps[-1])
                hint = (f" ({ZERO_BASED_HINT})"
                        if int(series.steps[0]) == 0 and last == steps - 1 else "")
                problems.append(f"rank {rank} {name} stops at step {last} of {steps}{hint}")
    return _summary(problems) if problems else None


def missing_data(trajectory: Trajectory, names: Sequence[str], steps: int) -> str | None:
    """What a run that should have logged steps 1..`steps` of `names` lacks, or None."""
    problems = []
    wanted = np.arange(1, steps + 1, dtype=np.int64)
    for name in names:
        ranks = trajectory.ranks_with(name)
        if not ranks:
            problems.append(f"{name} never logged")
        for rank in ranks:
            missing = np.setdiff1d(wanted, trajectory.per_rank[rank][name].steps)
            if len(missing):
                problems.append(f"rank {rank} {name} lacks step(s) {step_ranges(missing.tolist())}")
    return _summary(problems) if problems else None


def unlike_ranks(reference: Trajectory, run: Trajectory, names: Sequence[str]) -> str | None:
    """Ranks and metrics one run logs and the other does not (None when both log the same)."""
    problems = []
    for name in names:
        ref_ranks, run_ranks = set(reference.ranks_with(name)), set(run.ranks_with(name))
        for rank in sorted(ref_ranks - run_ranks):
            problems.append(f"rank {rank} logs no {name}, the reference does")
        for rank in sorted(run_ranks - ref_ranks):
            problems.append(f"rank {rank} logs {name}, the reference does not")
    return _summary(problems) if problems else None
