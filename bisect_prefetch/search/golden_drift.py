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
drift is every run's own at that step (`GoldenWatch.heard`). Runs of several masks
(segments.py) are not read: their steps belong to several trials.

The replay (`start_again`): the search for every cause (causes.CauseSearch) starts again
from every run so far, each as a correct golden run would have judged it, and asks for
nothing until a new golden run is given.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

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


@dataclass
class GoldenWatch:
    """The golden run the search's runs are compared with, and those runs, read for its drift."""

    steps: int | None = None  # its length; None: not given yet
    matched: int = 0  # the most steps of it a run of several masks matched (segments.py)
    compared: list[tuple[Mask, RunResult]] = field(default_factory=list)  # the runs compared with it
    drifted: int | None = None  # the step it drifted at, until a new one is given
    segmented: bool = False  # a run of several masks was heard: those are not read

    def given(self, steps: int) -> None:
        """A new golden run, `steps` long."""
        self.steps, self.matched, self.compared, self.drifted = steps, 0, [], None

    def heard(self, mask: Mask, result: RunResult, matched: int | None, notices: Sequence[dict]) -> int | None:
        """A run compared with it (matched: its steps that matched, a run of several masks).
        The step at which the runs show it drifted, unless a golden run was already read as
        drifting there (drift at one step in every run, a new golden run's too, is the runs'
        own) or it is read so already."""
        if matched is not None:
            self.matched, self.segmented = max(self.matched, matched), True
        self.compared.append((mask, result))
        if self.segmented or self.drifted is not None:
            return None
        step = drift_step(self.compared)
        seen = [n["step"] for n in notices if n["event"] == "golden-drifted"]
        return None if step in seen else step


class Replayed(Protocol):
    """What `start_again` reads of the search and calls on it (causes.CauseSearch)."""

    notices: list[dict]
    history: list[tuple[int, Mask, RunResult]]
    earlier: list[tuple[Mask, RunResult]]
    watch: GoldenWatch

    def restart(self) -> None: ...
    def reuse(self, mask: Mask, result: RunResult) -> None: ...
    def record(self, mask: Mask, result: RunResult, *, hint: str | None = None, startup: bool = True) -> None: ...


def start_again(search: Replayed, step: int, mask: Mask, result: RunResult, *, hint: str | None,
                startup: bool) -> None:
    """The golden run drifted at `step`: the search starts again from every run so far, each
    as a correct golden run would have judged it, the golden run that drifted among them as
    an all-off run; it asks for nothing until a new golden run is given (its `golden`)."""
    earlier = [(m, rejudged(r, step)) for m, r in search.earlier]
    runs = [(m, rejudged(r, step)) for _, m, r in search.history] + [(mask, rejudged(result, step))]
    read_again = sum(bool(r.diverged) and r.first_diff_step == step for _, r in search.watch.compared)
    said = [*search.notices, {"event": "golden-drifted", "step": step, "runs": read_again}]
    search.restart()
    search.watch.drifted = step  # and the runs read again are not read for it again
    for m, r in [*earlier, (frozenset(), drifted_golden(step))]:
        search.reuse(m, r)
    for m, r in runs[:-1]:
        search.record(m, r)
    search.record(mask, runs[-1][1], hint=hint, startup=startup)
    search.notices = said + [n for n in search.notices if n not in said]  # what reading again added
