"""The golden run drifted: telling it from the runs, and what those runs still show.

Every run is compared with one golden all-off run and stopped at its first difference.
Background drift can hit the golden run itself: drifted at step g, it differs from every
later run by step g. Every run that gets that far then "diverges" at g, all-off runs too,
and the search would read drift without prefetch (simulated, one culprit at q = 0.3 beside
background drift at 0.02 on 67 edges: 8 of 300 searches said not-prefetch, each at
confidence 0.973, after 4 runs that all differed at the golden run's step).

The runs tell it (`drift_step`): no run matched the golden run past step g - 1, and two or
more first differed at exactly g, an all-off run among them. An all-off run is the golden
run's own configuration, so it cannot differ from it by design; one that differs at the
very step where another run did is the golden run's drift (or two drifts at one step: the
cost of mistaking them is a new golden run and two divergences read as clean runs).

What the runs still show (`rejudged`): a run that first differed at g matched the golden
run through g - 1, so it is a clean run of g - 1 steps (any drift of its own came later,
unseen); the golden run itself is an all-off run that drifted at g (`drifted_golden`).
Once a step: when the runs show a new golden run drifting at the same step again, the
drift is every run's own at that step (causes.CauseSearch reads it so). Runs of several
masks (segments.py) are not read: their steps belong to several trials.
"""

from __future__ import annotations

from collections.abc import Sequence

from bisect_prefetch.search.oracle import RunResult
from bisect_prefetch.search.runlog import matched_steps
from bisect_prefetch.vocab import STOPPED_EARLY, Mask

# Runs that first differed at the golden run's step before it counts as drifted.
AT_ONE_STEP = 2


def drift_step(runs: Sequence[tuple[Mask, RunResult]]) -> int | None:
    """The step at which the golden run drifted, if the runs compared with it show it."""
    done = [(mask, result) for mask, result in runs if result.completed]
    if not done:
        return None
    step = max(matched_steps(result) for _, result in done) + 1
    at_step = [mask for mask, result in done if result.diverged and result.first_diff_step == step]
    if len(at_step) >= AT_ONE_STEP and any(not mask for mask in at_step):
        return step
    return None


def rejudged(result: RunResult, step: int) -> RunResult:
    """A run as a correct golden run would have judged it, the golden run having drifted at
    `step`: first differing there, it is clean through step - 1; otherwise unchanged."""
    if result.completed and result.diverged and result.first_diff_step == step:
        return RunResult(STOPPED_EARLY, False, None, step - 1)
    return result


def drifted_golden(step: int) -> RunResult:
    """The golden run that drifted at `step`, as an all-off run of the search."""
    return RunResult(STOPPED_EARLY, True, step, step)
