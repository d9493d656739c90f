"""Whether stress pays: the per-step hazard of drift with and without it, and the choice.

Stress (adapters/stress.py) changes only timing, so it may raise the chance that a
race shows, leave it, or lower it (a delay in the wrong place hides a race). The
`bisect --stress auto` calibration (`Calibration`, driven by the bisect command's one
loop) asks for all-on without and with stress, a pair at a time, and weighs each
setting's runs so far here. Pure: no I/O, no English.

Model: a run of T steps at per-step hazard h diverges at step k with chance
(1-h)^(k-1) h; a run that first differs at step k was at risk for k steps, a
clean run for T. With Jeffreys' Beta(1/2, 1/2) prior on h (a run's steps are many
trials, so the search's Beta(1, 3) on a per-run rate would claim a hazard of 1/4 a
step), the posterior is Beta(1/2 + d, 1/2 + at_risk - d). Stress is used
only when the posterior chance that it raises the hazard is above one half: a
setting that lowers the hazard (or is not shown to raise it) is never used.

When to stop (`CalibrationRule.decide`, after each pair): with P the posterior chance
that stress raises the per-step hazard, stop once P >= 0.95 (use stress) or
P <= 0.05 (do not), after at least one pair; stop too once drift shows in most runs
either way (each setting's per-run chance above 1/2 at the lower end of its 95%
interval: a search at either setting needs few runs, so more pairs cannot pay for
themselves), and at 4 pairs whatever P says; at those two stops stress is used only
where P > 1/2. A pair is all the evidence needs where stress opens a
race the unstressed run does not show: a stressed run that diverges at step 3 beside
an unstressed one clean for 20 steps gives P = 0.98. Two settings with equal hazards
keep P near 1/2 and run to the cap, as the fixed calibration (`FIXED_PAIRS`: always 4
pairs) did for every job. A wrong early stop costs little: the chosen setting's runs
are the search's evidence either way, and a stress that hides the race is caught by
the search without stress that a no-drift verdict under stress starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.search.oracle import RunResult
from bisect_prefetch.search.stats import log_beta, per_run_chance
from bisect_prefetch.vocab import Mask

PRIOR = (0.5, 0.5)  # Beta(a, b) on the per-step hazard (Jeffreys)
_GRID = np.linspace(0.0, 1.0, 20_001)[1:-1]  # open interval: the densities are finite there


@dataclass(frozen=True)
class Hazard:
    """What a setting's calibration runs show: counts and the Beta posterior of h."""

    runs: int
    divergences: int
    steps_at_risk: int
    steps: int  # steps a run asks for (T)

    @classmethod
    def of(cls, first_diff_steps: Sequence[int | None], *, steps: int) -> Hazard:
        """From each usable run's first differing step (None: clean over all steps)."""
        diverged = [min(max(int(k), 1), steps) for k in first_diff_steps if k is not None]
        clean = sum(1 for k in first_diff_steps if k is None)
        return cls(runs=len(first_diff_steps), divergences=len(diverged),
                   steps_at_risk=sum(diverged) + clean * steps, steps=steps)

    @property
    def a(self) -> float:
        return PRIOR[0] + self.divergences

    @property
    def b(self) -> float:
        return PRIOR[1] + self.steps_at_risk - self.divergences

    def density(self) -> np.ndarray:
        """The posterior density of h on the grid (normalised to sum to 1)."""
        log_pdf = ((self.a - 1) * np.log(_GRID) + (self.b - 1) * np.log1p(-_GRID)
                   - log_beta(self.a, self.b))
        weights = np.exp(log_pdf - log_pdf.max())
        return weights / weights.sum()

    @property
    def mean(self) -> float:
        return self.a / (self.a + self.b)

    def interval(self, confidence: float = 0.95) -> tuple[float, float]:
        """Central posterior interval of h."""
        cdf = np.cumsum(self.density())
        tail = (1 - confidence) / 2
        low = _GRID[min(int(np.searchsorted(cdf, tail)), len(_GRID) - 1)]
        high = _GRID[min(int(np.searchsorted(cdf, 1 - tail)), len(_GRID) - 1)]
        return float(low), float(high)

    def per_run_chance(self) -> float:
        """The per-run chance at the posterior mean hazard."""
        return per_run_chance(self.mean, self.steps)

    def per_run_interval(self, confidence: float = 0.95) -> tuple[float, float]:
        low, high = self.interval(confidence)
        return per_run_chance(low, self.steps), per_run_chance(high, self.steps)

    def to_json(self, confidence: float = 0.95) -> dict:
        low, high = self.per_run_interval(confidence)
        h_low, h_high = self.interval(confidence)
        return {"runs": self.runs, "divergences": self.divergences,
                "steps_at_risk": self.steps_at_risk, "hazard_per_step": self.mean,
                "hazard_interval": [h_low, h_high], "per_run_chance": self.per_run_chance(),
                "interval": [low, high], "interval_confidence": confidence}


# Why a calibration stopped (StressChoice.stop).
STOP_RAISED = "raised"  # stress settled to raise the hazard
STOP_NOT_RAISED = "not-raised"  # settled not to
STOP_BOTH = "both-drift"  # drift shows in most runs either way: the more likely side
STOP_CAP = "cap"  # the pairs ran out first: the more likely side is taken


@dataclass(frozen=True)
class StressChoice:
    """The calibration's answer: use stress or not, and why."""

    use: bool
    chance_raised: float  # posterior P(h with stress > h without)
    without: Hazard
    with_stress: Hazard
    pairs: int = 0  # pairs of runs (one without stress, one with) it took
    stop: str = STOP_CAP


def chance_higher(x: Hazard, y: Hazard) -> float:
    """Posterior P(h_x > h_y), the two posteriors independent."""
    cdf_y = np.cumsum(y.density())
    return float(np.sum(x.density() * (cdf_y - y.density() / 2)))


def choose_stress(without: Hazard, with_stress: Hazard, *, pairs: int = 0,
                  stop: str = STOP_CAP) -> StressChoice:
    """Stress only where it more likely raises the hazard than not (module docstring)."""
    raised = chance_higher(with_stress, without)
    # (the tolerance: two equal posteriors are a tie, whatever the float rounding says)
    return StressChoice(use=raised > 0.5 + 1e-9, chance_raised=raised, without=without,
                        with_stress=with_stress, pairs=pairs, stop=stop)


@dataclass(frozen=True)
class CalibrationRule:
    """When the all-on pairs of `--stress auto` have settled the choice (module docstring)."""

    settled: float = 0.95  # stop once P(raised) >= settled or <= 1 - settled
    min_pairs: int = 1
    max_pairs: int = 4
    most_runs: float = 0.5  # stop once both settings' per-run chance is above it (95% low end)

    def decide(self, without: Hazard, with_stress: Hazard, pairs: int) -> StressChoice | None:
        """The choice once `pairs` pairs have run, or None: run another pair."""
        if pairs < self.min_pairs:
            return None
        choice = choose_stress(without, with_stress, pairs=pairs)
        if choice.chance_raised >= self.settled:
            return replace(choice, stop=STOP_RAISED)
        if choice.chance_raised <= 1 - self.settled:
            return replace(choice, stop=STOP_NOT_RAISED)
        if min(h.per_run_interval()[0] for h in (without, with_stress)) > self.most_runs:
            return replace(choice, stop=STOP_BOTH)
        return choice if pairs >= self.max_pairs else None


SEQUENTIAL = CalibrationRule()
# The calibration before it stopped early: 4 pairs whatever they show (kept for bench_race).
FIXED_PAIRS = CalibrationRule(min_pairs=4, max_pairs=4)


@dataclass(frozen=True)
class StressAsk:
    """A run the calibration asks for: all-on, without or with stress."""

    mask: Mask
    stress: bool


class Calibration:
    """`--stress auto`'s all-on pairs as a search the bisect command's loop drives: it asks
    for all-on without stress, then with it, a pair at a time, until `rule` decides.

    One run at a time (`pending`, then `record` of its result), so that both runs of a pair
    meet the same machine load. `result()` is the choice; `runs` each setting's results in
    the order recorded, and `settings` the setting of each recorded run in that order.
    """

    def __init__(self, all_on: Mask, *, steps: int, rule: CalibrationRule = SEQUENTIAL) -> None:
        self.all_on = all_on
        self.steps = steps  # a run's steps (T)
        self.rule = rule
        self.runs: dict[bool, list[RunResult]] = {False: [], True: []}
        self.settings: list[bool] = []
        self.choice: StressChoice | None = None
        self.golden_drifted = None  # no golden run is compared with here

    @property
    def done(self) -> bool:
        return self.choice is not None

    @property
    def runs_used(self) -> int:
        return len(self.settings)

    @property
    def pending(self) -> StressAsk | None:
        """The next run: without stress first in each pair (None once decided)."""
        if self.done:
            return None
        return StressAsk(self.all_on, stress=len(self.runs[False]) > len(self.runs[True]))

    def record(self, mask: Mask, result: RunResult) -> None:
        """The result of the pending run; after each pair, the rule decides."""
        ask = self.pending
        if ask is None or mask != ask.mask:
            raise BisectPrefetchError("the stress calibration records the run it asked for")
        self.runs[ask.stress].append(result)
        self.settings.append(ask.stress)
        if ask.stress:
            self.choice = self.rule.decide(self.hazard(False), self.hazard(True),
                                           pairs=len(self.runs[True]))

    def hazard(self, stress: bool) -> Hazard:
        """What one setting's completed runs show."""
        return Hazard.of([r.first_diff_step if r.diverged else None
                          for r in self.runs[stress] if r.completed], steps=self.steps)

    def result(self) -> StressChoice | None:
        return self.choice
