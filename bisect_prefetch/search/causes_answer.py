"""The answer of the search for every cause (causes.py): the causes found, how sure the
whole answer is, and the verdict that names them.

The whole answer's confidence: each cause's probability from the runs that enabled no
other cause found (with the others off the one-cause model holds), times the last
round's own check that none is missing (`Found.confidence`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from bisect_prefetch.search import verdict as v
from bisect_prefetch.search.background import weakest
from bisect_prefetch.search.evidence import DISJOINT_CAUSES
from bisect_prefetch.search.oracle import RunResult
from bisect_prefetch.search.posterior import EdgePosterior
from bisect_prefetch.search.rounds import Numbered
from bisect_prefetch.search.verdict import SearchResult
from bisect_prefetch.vocab import (
    VERDICT_FOUND,
    VERDICT_INCONCLUSIVE,
    VERDICT_NO_DRIFT,
    VERDICT_NOT_PREFETCH,
    Mask,
)


@dataclass(frozen=True)
class Cause:
    """A set found by a round: the round's result says how it was checked."""

    edges: tuple[str, ...]
    result: SearchResult
    strength: float  # its per-run chance for the checks (Evidence.strength)


@dataclass(frozen=True)
class Found:
    """The causes found so far and every run that showed them."""

    edge_ids: Sequence[str]
    causes: Sequence[Cause]
    history: Sequence[Numbered]
    earlier: Sequence[tuple[Mask, RunResult]]
    confidence: float
    steps_per_run: int | None

    def named(self) -> frozenset[str]:
        return frozenset(e for c in self.causes for e in c.edges)

    def conclude(self, last: SearchResult, *, rounds: int, totals: dict) -> SearchResult:
        """The whole answer, from the last round's verdict and the causes peeled before it;
        totals: the evidence, runs_used, steps_used and startups of the whole search."""
        causes = self.causes
        if not causes or rounds == 1:  # one round: its own verdict, as it said it
            return replace(last, **totals, culprit_sets=[self.set_json(c) for c in causes])
        alone = {c.edges: self._alone_probability(c) for c in causes}
        if last.verdict == VERDICT_INCONCLUSIVE:
            verdict, confidence = VERDICT_INCONCLUSIVE, last.confidence
        else:
            verdict, confidence = VERDICT_FOUND, self._confidence(last, alone)
        first = causes[0].result
        first_keep = [next(f for f in c.result.facts if f.kind == "keep-only-diverged") for c in causes]
        facts: list[v.Fact] = [v.Causes(
            tuple(c.edges for c in causes), tuple((f.run, f.step) for f in first_keep),
            *self.union_checked(), remains=verdict == VERDICT_INCONCLUSIVE,
            background=last.confidence if last.verdict == VERDICT_NOT_PREFETCH else None)]
        facts += [f for f in last.facts if f.kind in ("background", "stopped")]
        return replace(
            first, verdict=verdict, confidence=confidence, facts=facts, **totals,
            culprit_sets=[self.set_json(c, alone) for c in causes], top_hypotheses=last.top_hypotheses,
            drop_only_diverges=len(causes) > 1 or first.drop_only_diverges)

    def _confidence(self, last: SearchResult, alone: dict[tuple[str, ...], float]) -> float:
        """The chance the whole answer is right: each cause is one (with the others off), and
        none is missing: the last round's own check (its answer's drop-only; or "no cause
        there" at its probability), or, a last round without drift, that no further cause as
        strong as the weakest found hid from its clean runs of drop-only of the union."""
        each = [alone[c.edges] for c in self.causes]
        if last.verdict == VERDICT_FOUND:  # the last cause: its round's confidence says it all
            return math.prod(each[:-1]) * last.confidence
        if last.verdict == VERDICT_NO_DRIFT:
            clean = self.union_checked()[0]
            strength = weakest([c.strength for c in self.causes])
            return math.prod(each) * (1 - DISJOINT_CAUSES * (1 - strength) ** clean)
        return math.prod(each) * last.confidence  # not-prefetch: the drift left is background

    def _alone_probability(self, cause: Cause) -> float:
        """The set's posterior probability from the runs that enabled no other cause found:
        with the others off, the one-cause model holds (a cause peeled while another was on
        had its drop-only runs, which the other made diverge, counted against it)."""
        others = self.named() - set(cause.edges)
        ids = [e for e in self.edge_ids if e not in others]
        index = {e: i for i, e in enumerate(ids)}
        model = EdgePosterior(len(ids))
        steps = self.steps_per_run
        for mask, result in [*self.earlier, *((m, r) for _, m, r in self.history)]:
            if result.completed and not mask & others:
                enabled = np.zeros(len(ids), dtype=bool)
                enabled[[index[e] for e in mask]] = True
                share = 1.0 if result.diverged or not steps else min(1.0, result.steps / steps)
                model.observe(enabled, bool(result.diverged), share)
        return model.probability_of(tuple(index[e] for e in cause.edges))

    def union_checked(self) -> tuple[int, int]:
        """(clean, diverged) runs of drop-only of the union of every cause found."""
        union = frozenset(self.edge_ids) - self.named()
        runs = [r for _, m, r in self.history if m == union and r.completed]
        return sum(not r.diverged for r in runs), sum(bool(r.diverged) for r in runs)

    def set_json(self, cause: Cause, alone: dict[tuple[str, ...], float] | None = None) -> dict:
        """A cause as bisect.json's culprit_sets holds it (docs/contract.md); alone: each
        cause's probability with the others off, once the whole answer is concluded."""
        keep = frozenset(cause.edges)
        confidence = (alone or {}).get(cause.edges, cause.result.confidence)
        return {"edges": list(cause.edges), "confidence": confidence,
                "per_run_chance": cause.result.calibration["per_run_chance"],
                "keep_only_runs": [n for n, m, r in self.history if m == keep and r.diverged]}
