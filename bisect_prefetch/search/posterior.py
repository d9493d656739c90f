"""Posterior over which prefetch edges cause drift, and the information each test would give.

Noise model. Exactly one hypothesis holds:
  - none:   drift needs no prefetch edge (background drift: every mask, all-off too, can diverge);
  - single: one edge e; a run can diverge only if e is enabled;
  - pair:   two edges needed together; a run can diverge only if both are enabled.
Under the true hypothesis h, a run of a mask that enables every edge of h diverges
with a per-run chance q (the same for every such mask), any other run never
diverges, and runs are independent. So a divergence rules out every hypothesis its
mask does not enable; a clean run weighs only against those it enables, by (1 - q).
One softening: a divergence of a mask that enables an edge already ruled out may
come from a second cause there (several disjoint sets can cause drift), so it
strikes the hypotheses it does not enable (odds times SECOND_CAUSE) instead of
ruling them out.

q is unknown. It gets a Beta(1, 3) prior (most drift seen in practice is rarer
than one run in two) and is integrated out per hypothesis: with D divergences
of masks enabling h and E clean runs enabling h, P(data | h) = B(1 + D, 3 + E) / B(1, 3).
The prior's light upper tail matters: a flat one would let a pair that fewer
clean runs enabled claim a high q and outweigh its single edge far beyond what
the runs show. A clean run cut short counts as the fraction of a run it
completed (a constant per-step hazard).

Prior mass: none 0.02, single 0.93, pair 0.05, each spread evenly. Sets of three
or more edges needed together are outside the model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bisect_prefetch.search.stats import binary_entropy, log_beta

PRIOR = {"none": 0.02, "single": 0.93, "pair": 0.05}
Q_PRIOR = (1.0, 3.0)
# The odds factor for a hypothesis that a divergence did not enable, when the mask
# enabled an edge already ruled out: about the prior chance of a second, disjoint
# cause times its chance to diverge in that run.
SECOND_CAUSE = 0.03


@dataclass(frozen=True)
class Probabilities:
    none: float
    single: np.ndarray  # per edge
    pair: np.ndarray  # upper triangle [a, b], a < b


@dataclass(frozen=True)
class Hypothesis:
    kind: str  # "none" | "single" | "pair"
    edges: tuple[int, ...]  # edge indices; () for none
    probability: float


class EdgePosterior:
    def __init__(self, n_edges: int) -> None:
        n = n_edges
        self.n = n
        # Per hypothesis: divergences and clean runs of masks enabling it, strikes.
        self.divergences = 0
        self.none_exposure = 0.0
        self.single_divergences = np.zeros(n)
        self.single_exposure = np.zeros(n)
        self.single_strikes = np.zeros(n)
        self.single_dead = np.zeros(n, dtype=bool)
        self.pair_divergences = np.zeros((n, n))
        self.pair_exposure = np.zeros((n, n))
        self.pair_strikes = np.zeros((n, n))
        # Only a < b are hypotheses; the rest stay dead for good.
        self.pair_dead = ~np.triu(np.ones((n, n), dtype=bool), k=1)
        self._cached: Probabilities | None = None
        self._cached_terms: tuple | None = None

    # -- evidence ---------------------------------------------------------
    def observe(self, enabled: np.ndarray, diverged: bool, fraction: float = 1.0) -> None:
        """One completed run of the mask `enabled` (bool per edge)."""
        both = np.outer(enabled, enabled)
        if diverged:
            self.divergences += 1
            self.single_divergences += enabled
            self.pair_divergences += both
            if (enabled & self.single_dead).any():
                self.single_strikes += ~enabled
                self.pair_strikes += ~both
            else:
                self.single_dead |= ~enabled
                self.pair_dead |= ~both
        else:
            self.none_exposure += fraction
            self.single_exposure += fraction * enabled
            self.pair_exposure += fraction * both
        self._cached = None
        self._cached_terms = None

    @property
    def alive(self) -> np.ndarray:
        """Edges no divergence has ruled out (each diverging mask enabled them all)."""
        return ~self.single_dead

    # -- the per-run chance -----------------------------------------------------
    def counts(self, edges: tuple[int, ...]) -> tuple[float, float]:
        """(divergences, clean runs) of the masks that enabled every edge of the set."""
        if not edges:
            return self.divergences, self.none_exposure
        if len(edges) == 1:
            return self.single_divergences[edges[0]], self.single_exposure[edges[0]]
        a, b = min(edges), max(edges)
        return self.pair_divergences[a, b], self.pair_exposure[a, b]

    @staticmethod
    def predictive(divergences, exposure) -> np.ndarray:
        """Posterior mean per-run chance given the runs that enabled a hypothesis."""
        a, b = Q_PRIOR
        d = np.asarray(divergences, dtype=float)
        return (a + d) / (a + b + d + np.asarray(exposure, dtype=float))

    def miss_chance(self, edges: tuple[int, ...], clean_runs: float) -> float:
        """Chance that clean_runs runs all miss a cause as strong as this set: E[(1-q)^n].

        The expectation is over the set's posterior per-run chance, not a point estimate.
        """
        a, b = Q_PRIOR
        d, e = self.counts(edges)
        return float(np.exp(log_beta(a + d, b + e + clean_runs) - log_beta(a + d, b + e)))

    # -- posterior ----------------------------------------------------------
    def probabilities(self) -> Probabilities:
        if self._cached is not None:
            return self._cached
        n = self.n
        a, b = Q_PRIOR
        log_strike = np.log(SECOND_CAUSE)

        def log_likelihood(divergences, exposure, strikes):
            return log_beta(a + divergences, b + exposure) + strikes * log_strike

        log_none = np.log(PRIOR["none"]) + log_likelihood(self.divergences, self.none_exposure, 0.0)
        log_single = np.full(n, -np.inf)
        live = self.alive
        log_single[live] = np.log(PRIOR["single"] / n) + log_likelihood(
            self.single_divergences[live], self.single_exposure[live], self.single_strikes[live]
        )
        log_pair = np.full((n, n), -np.inf)
        n_pairs = n * (n - 1) // 2
        if n_pairs:
            live = ~self.pair_dead
            log_pair[live] = np.log(PRIOR["pair"] / n_pairs) + log_likelihood(
                self.pair_divergences[live], self.pair_exposure[live], self.pair_strikes[live]
            )
        top = max(float(log_none), float(log_single.max()), float(log_pair.max()))
        none = float(np.exp(log_none - top))
        single = np.exp(log_single - top)
        pair = np.exp(log_pair - top)
        total = none + single.sum() + pair.sum()
        self._cached = Probabilities(none / total, single / total, pair / total)
        return self._cached

    def conditional(self, *, pairs: bool) -> Probabilities:
        """The posterior, or (pairs=False) the posterior given that no pair is needed together."""
        p = self.probabilities()
        if pairs:
            return p
        total = p.none + float(p.single.sum())
        return Probabilities(p.none / total, p.single / total, np.zeros_like(p.pair))

    def top(self, *, pairs: bool = True) -> Hypothesis:
        """The most probable hypothesis (pairs=False: given that no pair is needed together)."""
        p = self.conditional(pairs=pairs)
        best = Hypothesis("none", (), p.none)
        i = int(np.argmax(p.single))
        if p.single[i] > best.probability:
            best = Hypothesis("single", (i,), float(p.single[i]))
        if pairs and self.n > 1:
            a, b = np.unravel_index(int(np.argmax(p.pair)), p.pair.shape)
            if p.pair[a, b] > best.probability:
                best = Hypothesis("pair", (int(a), int(b)), float(p.pair[a, b]))
        return best

    def ranked(self, limit: int = 5) -> list[Hypothesis]:
        """The most probable hypotheses, best first (for reports)."""
        p = self.probabilities()
        out = [Hypothesis("none", (), p.none)]
        out += [Hypothesis("single", (int(i),), float(p.single[i])) for i in np.flatnonzero(p.single)]
        a_idx, b_idx = np.nonzero(p.pair)
        out += [
            Hypothesis("pair", (int(a), int(b)), float(p.pair[a, b]))
            for a, b in zip(a_idx, b_idx, strict=True)
        ]
        out.sort(key=lambda h: -h.probability)
        return out[:limit]

    def probability_of(self, edges: tuple[int, ...]) -> float:
        p = self.probabilities()
        if not edges:
            return p.none
        if len(edges) == 1:
            return float(p.single[edges[0]])
        if len(edges) == 2:
            return float(p.pair[min(edges), max(edges)])
        return 0.0

    @property
    def pairs_likely(self) -> bool:
        """Whether the pairs needed together hold at least half the posterior."""
        return float(self.probabilities().pair.sum()) >= 0.5

    # -- choosing a test -------------------------------------------------------
    def information(self, enabled: np.ndarray, *, pairs: bool = True) -> float:
        """Expected information (bits) one run of this mask gives about the hypothesis.

        I = H(outcome) - E_h[H(outcome | h)], the run diverging with chance
        sum of p_h q_h over the hypotheses h it enables (q_h their predictive
        chances). With pairs=False the pairs count as one hypothesis, "some pair":
        a run is worth something for telling a pair from a single edge, nothing
        for telling pairs apart while they are unlikely.
        """
        sums = self._sums(
            lambda single: np.array([single[enabled].sum()]),
            lambda pair: np.array([pair[np.outer(enabled, enabled)].sum()]),
        )
        return float(self._score(*sums, pairs=pairs)[0])

    def _terms(self):
        """Per hypothesis p_h q_h and p_h H(q_h), each as (none, singles, pairs)."""
        if self._cached_terms is not None:
            return self._cached_terms
        p = self.probabilities()
        probs = (p.none, p.single, p.pair)
        counts = (
            (self.divergences, self.none_exposure),
            (self.single_divergences, self.single_exposure),
            (self.pair_divergences, self.pair_exposure),
        )
        chance = tuple(pr * self.predictive(d, e) for pr, (d, e) in zip(probs, counts, strict=True))
        spread = tuple(
            pr * binary_entropy(self.predictive(d, e)) for pr, (d, e) in zip(probs, counts, strict=True)
        )
        self._cached_terms = (chance, spread)
        return self._cached_terms

    def _sums(self, over_singles, over_pairs):
        """Sums of the terms over the hypotheses each candidate mask enables.

        Returns (chance without pairs, spread without pairs, pair chance, pair spread),
        each an array over candidates.
        """
        (none_c, single_c, pair_c), (none_s, single_s, pair_s) = self._terms()
        return (
            none_c + over_singles(single_c),
            none_s + over_singles(single_s),
            over_pairs(pair_c),
            over_pairs(pair_s),
        )

    def _score(self, chance, spread, pair_chance, pair_spread, *, pairs: bool) -> np.ndarray:
        if pairs:
            conditional = pair_spread
        else:
            # "Some pair" as one hypothesis: its chance is the pairs' average chance.
            mass = float(self.probabilities().pair.sum())
            conditional = mass * binary_entropy(pair_chance / mass) if mass > 0 else 0.0
        return binary_entropy(chance + pair_chance) - spread - conditional

    def ranked_tests(self, limit: int = 8, *, pairs: bool = True) -> list[tuple[float, np.ndarray]]:
        """The most informative masks of one family, best first, as (bits, enabled).

        The family: enable a contiguous run of the surviving edges (in graph order),
        or every surviving edge but such a run. Edges already ruled out stay off.
        Sums over runs come from prefix sums, so all of them are scored at once.
        """
        alive_idx = np.flatnonzero(self.alive)
        k = len(alive_idx)
        if k == 0:
            return []
        starts, ends = np.triu_indices(k + 1, k=1)  # runs [start, end) of surviving edges
        zero_pairs = np.zeros((k, k))
        sub = np.ix_(alive_idx, alive_idx)

        def over_singles(single):
            return np.concatenate(_run_sums(single[alive_idx], zero_pairs, starts, ends))

        def over_pairs(pair):
            return np.concatenate(_run_sums(np.zeros(k), pair[sub], starts, ends))

        scores = self._score(*self._sums(over_singles, over_pairs), pairs=pairs)
        limit = min(limit, len(scores))
        best = np.argpartition(-scores, limit - 1)[:limit]
        order = best[np.argsort(-scores[best], kind="stable")]
        out = []
        for o in order:
            r = o % len(starts)
            run = np.zeros(k, dtype=bool)
            run[starts[r]:ends[r]] = True
            chosen = run if o < len(starts) else ~run
            enabled = np.zeros(self.n, dtype=bool)
            enabled[alive_idx[chosen]] = True
            out.append((float(scores[o]), enabled))
        return out


def _run_sums(single: np.ndarray, pair: np.ndarray, starts: np.ndarray, ends: np.ndarray):
    """Probability inside each run [start, end) and outside it: singles, and pairs wholly there."""
    k = len(single)
    line = np.concatenate([[0.0], np.cumsum(single)])
    table = np.zeros((k + 1, k + 1))
    table[1:, 1:] = np.cumsum(np.cumsum(pair, axis=0), axis=1)

    def rect(r0, r1, c0, c1):
        return table[r1, c1] - table[r0, c1] - table[r1, c0] + table[r0, c0]

    inside = line[ends] - line[starts] + rect(starts, ends, starts, ends)
    # pair[a, b] is nonzero only for a < b, so the corner block before x after counts once.
    outside_pairs = rect(0, starts, 0, starts) + rect(ends, k, ends, k) + rect(0, starts, ends, k)
    outside = line[k] - (line[ends] - line[starts]) + outside_pairs
    return inside, outside
