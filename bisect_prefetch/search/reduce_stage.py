"""The reduce stage: three or more edges needed together (reduce.py's noise-aware ddmin).

It begins once "a set of three or more inside the core" (the edges every
diverged run enabled) explains the runs better than the posterior's model
does, and holds while all-off never diverged (background drift breaks the
core: a diverged run need not enable the set). keep-only(core) must diverge
first (in a later cause's search twice, as its answers must, and until then the
stage holds only while the core leads: causes.py); then each chunk of the core is
dropped until it diverges (the core shrinks) or stays clean often enough. A
1-minimal core goes to the double check.
"""

from __future__ import annotations

import math
from functools import lru_cache
from itertools import combinations

import numpy as np

from bisect_prefetch.search.evidence import Evidence
from bisect_prefetch.search.reduce import (
    COARSE_MISS,
    Drop,
    levels,
    next_test,
    runs_to_miss,
    set_log_odds,
)
from bisect_prefetch.search.runlog import Ask, clean_without
from bisect_prefetch.search.verdict import Inconclusive
from bisect_prefetch.vocab import STAGE_REDUCE

# Runs of one check mask in flight at once, at most (calibration, keep-only).
CHECK_IN_FLIGHT = 2


@lru_cache(maxsize=8)
def _triples(m: int) -> np.ndarray:
    """Every set of three of m items, as three index columns."""
    return np.array(list(combinations(range(m), 3))).reshape(-1, 3).T


class ReduceStage:
    def __init__(self, ev: Evidence) -> None:
        self.ev = ev
        self.log = ev.log
        self.reducing = False
        self.began: tuple[int, int] | None = None  # (runs, core size) when it first began

    def update(self) -> None:
        """After a completed run: does the reduce stage run now?"""
        self.reducing = self._set_leads()
        if self.reducing and self.began is None:
            self.began = (math.ceil(self.log.used - 1e-9), int(self.log.core.sum()))

    def _set_leads(self) -> bool:
        model, log = self.ev.model, self.log
        if not model.divergences or log.tally(log.all_off).divergences or log.core.sum() < 3:
            return False  # a core of one or two edges: the posterior's model takes over again
        core = log.core_edges()
        needed = self.ev.settings.keep_only_divergences
        if self.reducing and (needed == 1 or log.tally(log.keep_only(core)).divergences >= needed):
            # Once begun it holds: the model cannot see the sets it tests. In a later cause's
            # search, where background drift alone can make a core, only once keep-only of the
            # core diverged as often as an answer's must; until then while the core leads.
            return True
        divergences, clean = self.ev.counts(core)
        evidence = model.log_evidence()
        if set_log_odds(len(core), len(log.edge_ids), divergences, clean, evidence) <= 0:
            return False  # not even the bound: the core itself fits no better than that
        return set_log_odds(len(core), len(log.edge_ids), divergences, self._triple_clean(core), evidence) > 0

    def _triple_clean(self, core: tuple[int, ...]) -> np.ndarray:
        """Clean runs (as shares of a run) that enabled each set of three edges of the core."""
        matrix, fractions = self.log.clean_matrix()
        inside = matrix[:, list(core)].astype(float)
        m = len(core)
        pairs = (inside[:, :, None] * inside[:, None, :]).reshape(len(inside), m * m)
        cube = ((inside * fractions[:, None]).T @ pairs).reshape(m, m, m)
        a, b, c = _triples(m)
        return cube[a, b, c]

    def reduced(self) -> tuple[int, ...] | None:
        """The core once it is 1-minimal (its keep-only diverged, every removal stayed clean)."""
        core = self.log.core_edges()
        return core if self.next_drop(core) is None else None

    def next(self) -> Ask | Inconclusive | tuple[int, ...] | None:
        """The next run of the reduce stage; the 1-minimal core (for the double check); None: wait."""
        log = self.log
        core = log.core_edges()
        keep = log.keep_only(core)
        if log.tally(keep).divergences < self.ev.settings.keep_only_divergences:
            # The set itself must diverge (as often as an answer's must): the verdict rests on it.
            if log.unresolved(keep):
                return Inconclusive("keep-only-never-completed")
            if log.in_flight_of(keep) < CHECK_IN_FLIGHT:
                return log.ask(keep, STAGE_REDUCE, core)
            return None
        test = self.next_drop(core)
        if test is None:
            return core
        if test.chunk is None:
            return None  # the runs in flight finish the level
        mask = log.keep_only([i for i in core if i not in test.chunk])
        if log.unresolved(mask):
            return Inconclusive("all-unresolved")
        return log.ask(mask, STAGE_REDUCE, core)

    def next_drop(self, core: tuple[int, ...]) -> Drop | None:
        """The chunk of the core to drop next (reduce.next_test); None: the core is 1-minimal."""
        log = self.log
        if log.tally(log.keep_only(core)).divergences < self.ev.settings.keep_only_divergences:
            return Drop(None, 0, 0)  # keep-only(core) must diverge first
        divergences, clean = self.ev.counts(core)
        coarse = runs_to_miss(divergences, clean, COARSE_MISS)
        final = runs_to_miss(divergences, clean, self.ev.member_alpha(core))
        needed_at = {g: final if g == len(core) else coarse for g in levels(len(core))}
        matrix, fractions = log.clean_matrix()

        def without(chunk: tuple[int, ...]) -> float:
            return clean_without(core, chunk, matrix, fractions)

        def in_flight(chunk: tuple[int, ...]) -> int:
            return log.in_flight_of(log.keep_only([i for i in core if i not in chunk]))

        return next_test(core, without, in_flight, needed_at)
