"""A simulated oracle with a known answer: it runs nothing and answers at once.

Culprit rule: one edge; several causes any of which is enough (`together=False`),
each one edge or edges joined by "+" that are needed together (`A+B`); or several
edges needed together (`together=True`). While the rule holds for a
mask, each step of a run diverges with chance `hazard`; optional background
drift does so whatever the mask, and in the golden run too: drifted at step g, it
differs from every run by step g (until the search sees it and asks for a new golden
run, search/golden_drift.py). A diverging run stops at its first difference.

Random streams: each culprit edge (or the set needed together), the background
and run failures draw from their own generator, seeded from (seed, trial, name),
and a stream draws only in runs where it is in play. So another search policy
meets the same noise: the k-th run that enables a culprit first differs at the
same step whatever ran before it.

It answers the slot operations of search/oracle.py (AnswersAtOnce), so the bisect
loop and the whole-transcript tests drive it as they drive real runs; the simulated
searches scored against it (the `simulate` command, the benchmarks) live in
bisect_prefetch/simulation/.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.search.oracle import AnswersAtOnce, RunResult
from bisect_prefetch.search.segments import Schedule
from bisect_prefetch.vocab import ERROR, OK, STOPPED_EARLY, Mask

# Joins the edges of one cause needed together, in a culprit (`--culprit A+B`).
TOGETHER = "+"


def stream(seed: int, trial: int, name: str) -> np.random.Generator:
    """The random stream `name` of one trial."""
    # crc32, not hash(): the same name must give the same stream in every process.
    return np.random.default_rng([seed, trial, zlib.crc32(name.encode())])


class SimulatedOracle(AnswersAtOnce):
    """Runs nothing: draws each run's first differing step from the culprit rule, and
    answers the slot operations of search/oracle.py at once (AnswersAtOnce)."""

    def __init__(
        self,
        culprits: Sequence[str],
        *,
        together: bool = False,
        hazard: float,
        steps: int,
        background: float = 0.0,
        error_rate: float = 0.0,
        seed: int = 0,
        trial: int = 0,
    ) -> None:
        if steps < 1:
            raise BisectPrefetchError(f"--steps must be at least 1, got {steps}")
        for name, value in (("--hazard", hazard), ("background hazard", background)):
            if not 0.0 <= value < 1.0:
                raise BisectPrefetchError(f"{name} must be in [0, 1), got {value}")
        self.culprits = list(culprits)
        self.together = together
        self.hazard = hazard
        self.steps = steps
        self.background = background
        self.error_rate = error_rate
        # One stream per culprit edge, or one for the set when it acts only as a whole.
        rules = ([tuple(self.culprits)] if together and self.culprits
                 else [tuple(c.split(TOGETHER)) for c in self.culprits])
        self._rules = [(set(rule), stream(seed, trial, "culprit:" + ",".join(rule))) for rule in rules]
        self._background = stream(seed, trial, "background")
        self._errors = stream(seed, trial, "errors")
        self._golden = stream(seed, trial, "golden")
        self.golden_diff: int | None = None  # the golden run's own background drift (run_golden)
        self.golden_steps = steps
        self.runs = 0

    def run_golden(self, steps: int) -> None:
        """The golden run, `steps` long. Background drift hits it too: drifted at step g, it
        differs from every run by step g (what makes its matched steps a control; the search
        tells it from the runs, search/golden_drift.py)."""
        self.golden_steps = steps
        self.golden_diff = self._first_diff(self._golden, self.background, steps)

    def replace_golden(self) -> None:
        """A new golden run, as long: the search found that the last one drifted."""
        self.run_golden(self.golden_steps)

    def _first_diff(self, rng: np.random.Generator, hazard: float, steps: int | None = None) -> int | None:
        if hazard <= 0.0:
            return None
        step = int(rng.geometric(hazard))
        return step if step <= (steps or self.steps) else None

    def run(self, mask: Mask) -> RunResult:
        self.runs += 1
        if self.error_rate and self._errors.random() < self.error_rate:
            return RunResult(ERROR, None, None, 0)
        draws = [self._first_diff(rng, self.hazard) for rule, rng in self._rules if rule <= mask]
        if self.background:
            draws.append(self._first_diff(self._background, self.background))
        draws.append(self.golden_diff)  # the golden run is as long as a run
        diffs = [d for d in draws if d is not None]
        if diffs:
            first = min(diffs)
            return RunResult(STOPPED_EARLY, True, first, first)
        return RunResult(OK, False, None, self.steps)

    def run_schedule(self, schedule: Schedule) -> RunResult:
        """One run of several masks by step: each segment draws its own first difference
        (a constant per-step hazard is memoryless), and the run stops at the first."""
        self.runs += 1
        if self.error_rate and self._errors.random() < self.error_rate:
            return RunResult(ERROR, None, None, 0)
        for segment in schedule.segments:
            mask, steps = segment.ask.mask, segment.steps
            draws = [self._first_diff(rng, self.hazard, steps) for rule, rng in self._rules if rule <= mask]
            if self.background:
                draws.append(self._first_diff(self._background, self.background, steps))
            if self.golden_diff is not None and segment.first_step <= self.golden_diff <= segment.last_step:
                draws.append(self.golden_diff - segment.first_step + 1)
            diffs = [d for d in draws if d is not None]
            if diffs:
                first = segment.first_step + min(diffs) - 1
                return RunResult(STOPPED_EARLY, True, first, first)
        return RunResult(OK, False, None, schedule.steps)
