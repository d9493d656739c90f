"""What the runs so far show about a set of edges: counts, rates and error chances.

Read by the checks, the reduce stage, the budget and the verdict; computed from
the run log and the posterior, never stored. A set of one or two edges is the
posterior's (posterior.py); a set of three or more comes from the reduce stage,
outside the posterior's model, and is counted from the log's matrices.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.search.posterior import EdgePosterior
from bisect_prefetch.search.reduce import miss_chance as set_miss_chance
from bisect_prefetch.search.reduce import subset_odds
from bisect_prefetch.search.runlog import RunLog, clean_without
from bisect_prefetch.vocab import DROP_ONLY

# Prior chance that another set, disjoint from the answer, also causes drift: it is
# outside the posterior's one-cause model, so only drop-only(answer) runs rule it out.
DISJOINT_CAUSES = 0.1
# A set of three or more (reduce stage): its members' removals share this part of the
# error budget; the second-cause check (drop-only) the rest.
MEMBER_SHARE = 0.8


def rate(divergences: float, clean: float) -> float:
    """Posterior mean per-run chance of drift from these runs, under a Beta(1, 3) prior."""
    return (1 + divergences) / (4 + divergences + clean)


@dataclass(frozen=True)
class Settings:
    """What the user chose (and its defaults), fixed for one search."""

    confidence: float
    max_runs: int | None
    calibration_runs: int
    all_off_runs: int  # all-off runs right after the first divergence
    background_controls: bool  # all_off_runs="auto": rule out background drift as strong as the answer's
    # Divergences of keep-only of an answer before it is confirmed (causes.py: 2 for a cause
    # after the first, where one divergence may be background drift the first cause left).
    keep_only_divergences: int = 1
    # A later cause's search (causes.py): "no cause among these edges" settles it once it holds
    # the confidence, without an all-off divergence (the drift left is background drift).
    none_settles: bool = False
    # ... and only once all-on (every cause found off) stayed clean this many times.
    none_after: int = 0
    # The search for every cause (causes.py): not-prefetch once all-off is shown to diverge
    # about as often as the other runs (checks.py), since several causes, which the one-cause
    # model cannot hold, look like drift without prefetch to it.
    background_parity: bool = False

    @property
    def alpha(self) -> float:
        return 1.0 - self.confidence

    @classmethod
    def of(cls, *, confidence: float, max_runs: int | None, calibration_runs: int | None,
           all_off_runs: int | str) -> Settings:
        """The options of a search, checked, with their defaults."""
        if not 0.0 < confidence < 1.0:
            raise BisectPrefetchError(f"--confidence must be between 0 and 1, got {confidence}")
        if max_runs is not None and max_runs < 1:
            raise BisectPrefetchError(f"--max-runs must be at least 1, got {max_runs}")
        if all_off_runs != "auto" and not (isinstance(all_off_runs, int) and all_off_runs >= 1):
            raise BisectPrefetchError(f"all_off_runs must be a count >= 1 or auto, got {all_off_runs!r}")
        # auto (the default): one all-off run after the first divergence, and the
        # background controls of checks.py before culprit-found. A count: that many
        # all-off runs only (cheaper; background drift then passes for a culprit more often).
        return cls(
            confidence=confidence, max_runs=max_runs,
            # Default: a quarter of the budget, 50 without one (rules out chances above 0.06).
            calibration_runs=calibration_runs or (min(max_runs, max(10, max_runs // 4)) if max_runs else 50),
            all_off_runs=1 if all_off_runs == "auto" else all_off_runs,
            background_controls=all_off_runs == "auto")


class Evidence:
    def __init__(self, log: RunLog, model: EdgePosterior, settings: Settings) -> None:
        self.log = log
        self.model = model
        self.settings = settings
        self.alpha = settings.alpha

    def counts(self, edges: Sequence[int]) -> tuple[float, float]:
        """(divergences, clean runs) of the runs that enabled every edge of the set."""
        edges = tuple(edges)
        if len(edges) <= 2:
            return self.model.counts(edges)
        matrix, fractions = self.log.clean_matrix()
        return (float(self.log.diverged_enabling(edges)),
                float(fractions[matrix[:, list(edges)].all(axis=1)].sum()))

    def miss(self, edges: Sequence[int], runs):
        """Chance that `runs` clean runs all miss drift as strong as the set's (runs may be an array)."""
        edges = tuple(edges)
        if len(edges) <= 2:
            return self.model.miss_chance(edges, runs)
        return set_miss_chance(*self.counts(edges), runs)

    def clean_cover(self) -> int:
        """Clean runs that enabled every edge, counted for the edge enabled least."""
        return int(self.model.single_exposure.min() + 1e-9)

    def all_on_rate(self) -> float:
        """Posterior mean per-run chance of all-on runs (Beta(1, 3) prior)."""
        on = self.log.tally(self.log.all_on)
        return rate(on.divergences, on.clean)

    def strength(self, edges: tuple[int, ...]) -> float:
        """The answer's per-run chance for the background check: the lower of its
        posterior mean (which the runs that singled it out make lean high) and
        all-on's rate (Beta(1, 3) prior), which no choice of the search biases."""
        if len(edges) > 2:
            chance = rate(*self.counts(edges))
        else:
            chance = self.model.culprit_chance(edges)
        return min(chance, self.all_on_rate(), 0.999)

    # -- the answer's errors --------------------------------------------------------------
    def answer_error(self, edges: tuple[int, ...]) -> float:
        """Chance the answer is wrong inside the posterior's model (a set of three or more:
        that some member was not needed)."""
        if len(edges) > 2:
            return self.members_error(edges)
        return 1.0 - self.model.probability_of(edges)

    def members_error(self, edges: Sequence[int]) -> float:
        """A set from the reduce stage: the chance that some member was not needed after all.

        Per member: the runs without it that stayed clean all missed drift by chance,
        against the prior odds of the set without it. The odds matter: the core keeps
        whichever edges every diverged run happened to enable, so among many edges
        some unneeded one may have had a clean run of luck.
        """
        matrix, fractions = self.log.clean_matrix()
        odds = subset_odds(len(self.log.edge_ids), len(edges))
        return float(sum(min(1.0, odds * self.miss(edges, clean_without(edges, (i,), matrix, fractions)))
                         for i in edges))

    def member_alpha(self, edges: Sequence[int]) -> float:
        """The chance of each member's removal missing drift that fits its share of the error budget."""
        return self.alpha * MEMBER_SHARE / len(edges) / subset_odds(len(self.log.edge_ids), len(edges))

    def second_cause_error(self, edges: tuple[int, ...], extra: int = 0) -> float:
        """Chance another disjoint cause, as strong as the answer, hid from every clean run.

        A second cause is one more edge outside the answer; each clean run that enabled
        it (drop-only runs enable them all; `extra` more of those) is a chance missed.
        """
        outside = np.ones(len(self.log.edge_ids), dtype=bool)
        outside[list(edges)] = False
        if not outside.any():
            return 0.0
        clean = self.model.single_exposure[outside] + extra
        return DISJOINT_CAUSES * float(np.mean(self.miss(edges, clean)))

    def background_miss(self, edges: tuple[int, ...], extra: int = 0) -> float:
        """Chance that background drift as strong as all-on's hid from every clean run
        without the answer (`extra` more of them).

        The strength comes from the all-on runs alone (Beta(1, 3) prior), not from the
        runs that singled the answer out, which a search's own choices make lean high.
        """
        strength = self.all_on_rate()
        clean_without_answer = self.model.exposure - self.counts(edges)[1] + extra
        return (1 - strength) ** clean_without_answer

    # -- background controls ----------------------------------------------------------------
    def controls(self, edges: tuple[int, ...]) -> float:
        """Clean runs that could not have singled the answer out: all-off (the golden run's
        matched steps among them, in runs), and the drop-only runs of the double check.

        The search's other runs without the answer do not count: under background
        drift the answer is the set every diverged run happened to enable, so those
        runs are clean by selection.
        """
        checked = self.log.clean_runs_of(DROP_ONLY, self.log.drop_only(edges))
        return self.log.tally(self.log.all_off).clean + checked + self.log.golden_runs()

    def controls_at(self, chance: float, miss: float | None = None) -> int:
        """Clean control runs that show drift of this per-run chance with chance 1 - miss
        (default alpha/2)."""
        return math.ceil(math.log(miss or self.alpha / 2) / math.log(1 - chance))

    def controls_for(self, edges: tuple[int, ...]) -> int:
        """Clean control runs that show background drift as strong as the answer's
        with chance 1 - alpha/2, or more where the answer's other errors leave less of
        the error budget (the verdict's confidence counts all three, see verdict.found)."""
        spare = self.alpha - self.answer_error(edges) - self.second_cause_error(edges)
        return self.controls_at(self.strength(edges), min(self.alpha / 2, max(spare, self.alpha / 100)))
