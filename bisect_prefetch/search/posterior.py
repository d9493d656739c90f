"""Posterior over which prefetch edges cause drift, and the information each test would give.

Noise model. Exactly one hypothesis holds:
  - none:   drift needs no prefetch edge (background drift: every mask, all-off too,
            diverges with the same per-run chance p0 > 0);
  - single: one edge e causes drift;
  - pair:   two edges needed together cause drift.
Under a single or a pair h, with the culprit's per-run chance q and the background
p0 (zero unless background drift exists too), a run of a mask that enables every
edge of h diverges with chance 1 - (1-q)(1-p0), any other run with chance p0, and
runs are independent. With p0 = 0 a divergence rules out every set its mask did not
enable; with p0 > 0 it only weighs against them, by p0.

q and p0 are unknown and integrated out on a grid, per hypothesis: q over quantiles
of a Beta(1, 3) prior (most drift seen in practice is rarer than one run in two;
the light upper tail keeps a pair that fewer clean runs enabled from claiming a
high q), p0 = 0 with prior 1 - BACKGROUND, else log-spaced. A clean run cut short
counts as the fraction of a run it completed (a constant per-step hazard).

"Clearly above the background": a set is a culprit only where its q exceeds
CLEARLY_ABOVE times p0; the grid cells of a set with a smaller q describe drift
that prefetch does not explain, and once an all-off run has diverged (drift seen
without prefetch) their mass counts towards `none` (verdict not-prefetch).

Prior mass: none 0.02, single 0.93, pair 0.05, each spread evenly unless a prior
factor (hints.py: localization hints and audit suspects) reweights the sets. Sets
of three or more edges needed together are outside the model (reduce.py reduces
them with noise-aware ddmin).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bisect_prefetch.search.stats import binary_entropy

PRIOR = {"none": 0.02, "single": 0.93, "pair": 0.05}
Q_PRIOR = (1.0, 3.0)
# Prior chance that background drift (p0 > 0) exists beside a culprit set. Smallish: each
# divergence then weighs strongly against the sets its mask left out (0.3 cost about 2
# runs a search in simulation), yet one divergence of background drift does not rule the
# culprit out for good (p0 = 0.02 beside a culprit at q = 0.3, 300 simulated searches:
# accuracy 0.93 at 0.05, 0.97 at 0.15, at the same median runs).
BACKGROUND = 0.15
# q grid: equal-mass quantiles of Beta(1, 3) (its quantile is 1 - (1-u)^(1/3)).
_U = (np.arange(16) + 0.5) / 16
Q_GRID = 1.0 - (1.0 - _U) ** (1.0 / Q_PRIOR[1])
# p0 grid: 0, then log-spaced (a factor 1.37 apart), fine enough that no set fits
# background drift much better than `none` does merely because the grid misses the true
# p0. Both grids are small because every decision sums over them for each distinct count.
_P0_POINTS = 20
P0_GRID = np.concatenate([[0.0], np.geomspace(0.002, 0.8, _P0_POINTS)])
_LOG_P0_PRIOR = np.log(np.concatenate([[1.0 - BACKGROUND], np.full(_P0_POINTS, BACKGROUND / _P0_POINTS)]))
_LOG_P0_NONE = np.concatenate([[-np.inf], np.full(_P0_POINTS, -np.log(_P0_POINTS))])
# A set is a culprit only where its own per-run chance is this many times the background's.
CLEARLY_ABOVE = 2.0
# Edges whose posterior falls below this share of the leader's are left out of test masks.
ALIVE_SHARE = 1e-3


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


def sub_prior(edges: int, of: int, share: float = 1.0) -> dict[str, float]:
    """The prior of a search over `edges` of a graph of `of` edges (causes.py): each set keeps
    the prior it has in the whole graph, times `share` (the prior chance of one more cause);
    the rest is none's (no cause among those edges)."""
    pairs = max(of * (of - 1) // 2, 1)
    single = PRIOR["single"] * share * edges / of
    pair = PRIOR["pair"] * share * (edges * (edges - 1) // 2) / pairs
    return {"none": 1.0 - single - pair, "single": single, "pair": pair}


def _safe_mul(count, log_value):
    """count * log_value with 0 * -inf = 0 (no runs of that kind, nothing ruled out)."""
    with np.errstate(invalid="ignore"):
        return np.where(count > 0, count * log_value, 0.0)


class EdgePosterior:
    def __init__(self, n_edges: int, prior: dict[str, float] | None = None) -> None:
        n = n_edges
        self.n = n
        self.prior = dict(prior or PRIOR)  # causes.py gives a later round its own (sub_prior)
        self.divergences = 0
        self.exposure = 0.0  # clean runs, as fractions of a run
        self.single_divergences = np.zeros(n)
        self.single_exposure = np.zeros(n)
        self.pair_divergences = np.zeros((n, n))
        self.pair_exposure = np.zeros((n, n))
        self.off_divergences = 0
        self.off_exposure = 0.0
        self._upper = np.triu(np.ones((n, n), dtype=bool), k=1)
        self.log_prior_single = np.zeros(n)
        self.log_prior_pair = np.zeros((n, n))
        self._cache: dict = {}

    # -- evidence ---------------------------------------------------------
    def observe(self, enabled: np.ndarray, diverged: bool, fraction: float = 1.0) -> None:
        """One completed run of the mask `enabled` (bool per edge)."""
        enabled = np.asarray(enabled, dtype=bool)
        both = np.outer(enabled, enabled)
        if diverged:
            self.divergences += 1
            self.single_divergences += enabled
            self.pair_divergences += both
            self.off_divergences += not enabled.any()
        else:
            self.exposure += fraction
            self.single_exposure += fraction * enabled
            self.pair_exposure += fraction * both
            self.off_exposure += fraction * (not enabled.any())
        self._cache = {}

    def set_prior_factor(self, log_single: np.ndarray, log_pair: np.ndarray) -> None:
        """Reweight the sets' prior (log factors, per edge and per pair; hints.py)."""
        self.log_prior_single = np.asarray(log_single, dtype=float)
        self.log_prior_pair = np.asarray(log_pair, dtype=float)
        self._cache = {}

    # -- the grid ---------------------------------------------------------------
    def _grid(self, d_in: np.ndarray, e_in: np.ndarray):
        """Per set with these counts: log marginal likelihood of its material and
        immaterial cells (q > p0, q <= p0), and the normalized cell weights."""
        q = Q_GRID[:, None]
        p = P0_GRID[None, :]
        with np.errstate(divide="ignore"):
            log_hit = np.log1p(-(1 - q) * (1 - p))
            log_q_miss = np.log1p(-q)
            log_p = np.log(p)
            log_p_miss = np.log1p(-p)
        d_in = np.asarray(d_in, dtype=float)[:, None, None]
        e_in = np.asarray(e_in, dtype=float)[:, None, None]
        d_out = self.divergences - d_in
        log_cell = (
            d_in * log_hit + e_in * log_q_miss + _safe_mul(d_out, log_p)
            + self.exposure * log_p_miss + _LOG_P0_PRIOR[None, None, :] - np.log(len(Q_GRID))
        )
        material = (q > CLEARLY_ABOVE * p)[None]
        top = log_cell.max(axis=(1, 2), keepdims=True)
        weight = np.exp(log_cell - top)
        mat = (weight * material).sum(axis=(1, 2))
        imm = (weight * ~material).sum(axis=(1, 2))
        with np.errstate(divide="ignore"):
            log_mat = np.log(mat) + top[:, 0, 0]
            log_imm = np.log(imm) + top[:, 0, 0]
        weight /= weight.sum(axis=(1, 2), keepdims=True)
        return log_mat, log_imm, weight

    def _unique_grid(self, d_in: np.ndarray, e_in: np.ndarray):
        """_grid over the distinct (divergences, exposure) pairs only, mapped back."""
        keys = np.asarray(d_in, float).ravel() + 1j * np.round(np.asarray(e_in, float).ravel(), 9)
        uniq, inverse = np.unique(keys, return_inverse=True)
        log_mat, log_imm, weight = self._grid(uniq.real, uniq.imag)
        return log_mat, log_imm, weight, inverse.ravel()

    def _state(self) -> dict:
        if self._cache:
            return self._cache
        n = self.n
        q = Q_GRID[:, None]
        p = P0_GRID[None, :]
        chance_on = 1 - (1 - q) * (1 - p)  # a run enabling the set
        chance_off = np.broadcast_to(p, chance_on.shape)
        out = {}
        # none: every run at p0 > 0.
        with np.errstate(divide="ignore"):
            log_none_cells = (
                _safe_mul(np.array(self.divergences, float), np.log(P0_GRID))
                + self.exposure * np.log1p(-P0_GRID) + _LOG_P0_NONE
            )
        top = log_none_cells.max()
        w_none = np.exp(log_none_cells - top)
        log_none = np.log(self.prior["none"]) + np.log(w_none.sum()) + top
        w_none /= w_none.sum()
        out["none_chance"] = float((w_none * P0_GRID).sum())
        out["w_none"] = w_none
        kinds = {}
        for kind, d, e, log_prior, count in (
            ("single", self.single_divergences, self.single_exposure, self.log_prior_single, n),
            ("pair", self.pair_divergences[self._upper], self.pair_exposure[self._upper],
             self.log_prior_pair[self._upper], n * (n - 1) // 2),
        ):
            if count == 0:
                kinds[kind] = None
                continue
            log_mat, log_imm, weight, inv = self._unique_grid(d, e)
            base = np.log(self.prior[kind] / count) + log_prior
            kinds[kind] = {
                "log_mat": base + log_mat[inv],
                "log_imm": base + log_imm[inv],
                "c_on": (weight * chance_on).sum(axis=(1, 2))[inv],
                "c_off": (weight * chance_off).sum(axis=(1, 2))[inv],
                "weight": weight, "inv": inv,  # for the chances of a shorter trial (_chances)
                "q_weight": weight.sum(axis=2)[inv],  # marginal over p0, per set
            }
        parts = [np.atleast_1d(log_none)]
        for k in kinds.values():
            if k is not None:
                parts += [k["log_mat"], k["log_imm"]]
        top = max(float(np.max(x)) for x in parts)
        total = sum(float(np.exp(x - top).sum()) for x in parts)
        none = float(np.exp(log_none - top)) / total
        out["log_evidence"] = top + float(np.log(total)) - np.log(self._prior_mass())
        single = np.exp(kinds["single"]["log_mat"] - top) / total
        single_imm = np.exp(kinds["single"]["log_imm"] - top) / total
        pair = np.zeros((n, n))
        pair_imm = np.zeros((n, n))
        if kinds["pair"] is not None:
            pair[self._upper] = np.exp(kinds["pair"]["log_mat"] - top) / total
            pair_imm[self._upper] = np.exp(kinds["pair"]["log_imm"] - top) / total
        out["probabilities"] = Probabilities(
            none + float(single_imm.sum()) + float(pair_imm.sum()), single, pair
        )
        # Whatever the set's rate next to the background (while all-off never diverged,
        # nothing shows drift without prefetch: a second cause looks like background).
        out["any_rate"] = Probabilities(none, single + single_imm, pair + pair_imm)
        # For choosing tests a set keeps all its cells (immaterial ones too).
        out["none_only"] = none
        out["single_all"] = single + single_imm
        out["pair_all"] = pair + pair_imm
        out["kinds"] = kinds
        self._cache = out
        return out

    # -- posterior ----------------------------------------------------------
    def probabilities(self) -> Probabilities:
        return self._state()["probabilities"]

    def log_evidence(self) -> float:
        """log of the chance of the runs so far under the model (its prior over sets, q and p0;
        a prior that hints reweighted is normalized first)."""
        return self._state()["log_evidence"]

    def _prior_mass(self) -> float:
        """Total prior mass once the prior factors (hints.py) reweighted the sets."""
        mass = self.prior["none"] + self.prior["single"] * float(np.mean(np.exp(self.log_prior_single)))
        if self.n > 1:
            mass += self.prior["pair"] * float(np.mean(np.exp(self.log_prior_pair[self._upper])))
        return mass

    @property
    def alive(self) -> np.ndarray:
        """Edges whose posterior (as a single or in a pair) is not negligible next to the leader's."""
        s = self._state()
        if "alive" not in s:
            mass = s["single_all"] + s["pair_all"].sum(axis=0) + s["pair_all"].sum(axis=1)
            s["alive"] = mass >= ALIVE_SHARE * mass.max()
        return s["alive"]

    def background(self) -> float:
        """Posterior mean of the per-run chance of drift with every edge off (p0)."""
        s = self._state()
        chance = s["none_only"] * s["none_chance"]
        for kind, probs in (("single", s["single_all"]), ("pair", s["pair_all"][self._upper])):
            k = s["kinds"][kind]
            if k is not None:
                chance += float((probs * k["c_off"]).sum())
        return chance

    def counts(self, edges: tuple[int, ...]) -> tuple[float, float]:
        """(divergences, clean runs) of the masks that enabled every edge of the set."""
        if not edges:
            return self.divergences, self.exposure
        if len(edges) == 1:
            return self.single_divergences[edges[0]], self.single_exposure[edges[0]]
        a, b = min(edges), max(edges)
        return self.pair_divergences[a, b], self.pair_exposure[a, b]

    def miss_chance(self, edges: tuple[int, ...], clean_runs) -> np.ndarray | float:
        """Chance that clean_runs runs all miss a cause as strong as this set: E[(1-q)^n].

        The expectation is over the set's posterior per-run chance; clean_runs may be an array.
        """
        n = np.asarray(clean_runs, dtype=float)
        if not edges:  # no set: a cause as strong as the background
            miss = (1 - self._state()["none_chance"]) ** n
            return float(miss) if n.ndim == 0 else miss
        key = ("q_weight", tuple(edges))
        s = self._state()
        if key not in s:
            d, e = self.counts(edges)
            s[key] = self._grid(np.array([d]), np.array([e]))[2][0].sum(axis=1)
        weight = s[key]
        out = (weight[None, :] * (1 - Q_GRID[None, :]) ** n.reshape(-1, 1)).sum(axis=1)
        return float(out[0]) if n.ndim == 0 else out

    def culprit_chance(self, edges: tuple[int, ...]) -> float:
        """Posterior mean per-run chance of a run enabling this set (background included)."""
        key = ("culprit_chance", tuple(edges))
        s = self._state()
        if key not in s:
            d, e = self.counts(edges)
            weight = self._grid(np.array([d]), np.array([e]))[2][0]
            s[key] = float((weight * (1 - (1 - Q_GRID[:, None]) * (1 - P0_GRID[None, :]))).sum())
        return s[key]

    def conditional(self, *, pairs: bool, any_rate: bool = False) -> Probabilities:
        """The posterior, or (pairs=False) the posterior given that no pair is needed together."""
        p = self._state()["any_rate"] if any_rate else self.probabilities()
        if pairs:
            return p
        total = p.none + float(p.single.sum())
        return Probabilities(p.none / total, p.single / total, np.zeros_like(p.pair))

    def top(self, *, pairs: bool = True, any_rate: bool = False) -> Hypothesis:
        """The most probable hypothesis (pairs=False: given that no pair is needed together;
        any_rate: a set counts whatever its rate next to the background)."""
        p = self.conditional(pairs=pairs, any_rate=any_rate)
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
        best_single = np.argsort(-p.single, kind="stable")[:limit]
        out += [Hypothesis("single", (int(i),), float(p.single[i])) for i in best_single if p.single[i] > 0]
        flat = np.argsort(-p.pair.ravel(), kind="stable")[:limit]
        for f in flat:
            a, b = np.unravel_index(int(f), p.pair.shape)
            if p.pair[a, b] > 0:
                out.append(Hypothesis("pair", (int(a), int(b)), float(p.pair[a, b])))
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
    def _chances(self, share: float) -> tuple[float, dict]:
        """The predictive divergence chances of a trial of `share` of a run (a segment,
        segments.py): the background's, and per set (c_on, c_off). A cell's per-run chance c
        becomes 1 - (1 - c)^share (a constant per-step hazard); a full run keeps its own."""
        s = self._state()
        if share == 1.0:
            return s["none_chance"], {kind: None if k is None else (k["c_on"], k["c_off"])
                                      for kind, k in s["kinds"].items()}
        key = ("chances", share)
        if key not in s:
            keep_on = ((1 - Q_GRID[:, None]) * (1 - P0_GRID[None, :])) ** share
            keep_off = np.broadcast_to((1 - P0_GRID[None, :]) ** share, keep_on.shape)
            none = float((s["w_none"] * (1 - (1 - P0_GRID) ** share)).sum())
            s[key] = none, {kind: None if k is None else (
                (k["weight"] * (1 - keep_on)).sum(axis=(1, 2))[k["inv"]],
                (k["weight"] * (1 - keep_off)).sum(axis=(1, 2))[k["inv"]])
                for kind, k in s["kinds"].items()}
        return s[key]

    def _terms(self, *, pairs: bool, share: float = 1.0):
        """Per set: how much enabling it moves the trial's divergence chance and its entropy.

        A trial's divergence chance is base + sum over enabled sets of p_h (c_on - c_off);
        its expected conditional entropy likewise. Returns (base chance, base entropy,
        single (chance, entropy) deltas, pair deltas). share: the trial's share of a run.
        """
        key = ("terms", pairs, share)
        if key in self._cache:
            return self._cache[key]
        s = self._state()
        none = s["none_only"]
        none_chance, chances = self._chances(share)
        base_c = none * none_chance
        base_h = none * float(binary_entropy(none_chance))
        deltas = []
        for kind, probs in (("single", s["single_all"]), ("pair", s["pair_all"])):
            if chances[kind] is None:
                deltas.append((np.zeros_like(probs), np.zeros_like(probs)))
                continue
            pr = probs if kind == "single" else probs[self._upper]
            c_on, c_off = chances[kind]
            base_c += float((pr * c_off).sum())
            base_h += float((pr * binary_entropy(c_off)).sum())
            dc = pr * (c_on - c_off)
            dh = pr * (binary_entropy(c_on) - binary_entropy(c_off))
            if kind == "pair":
                full_c, full_h = np.zeros((self.n, self.n)), np.zeros((self.n, self.n))
                full_c[self._upper], full_h[self._upper] = dc, dh
                dc, dh = full_c, full_h
            deltas.append((dc, dh))
        out = (base_c, base_h, deltas[0], deltas[1])
        self._cache[key] = out
        return out

    def information(self, enabled: np.ndarray, *, pairs: bool = True, share: float = 1.0) -> float:
        """Expected information (bits) one trial of this mask (`share` of a run) gives about
        the hypothesis.

        I = H(outcome) - E_h[H(outcome | h)], the trial diverging with chance
        sum over h of p_h c_h (c_h the predictive chance under h for this mask).
        """
        enabled = np.asarray(enabled, dtype=bool)
        base_c, base_h, (sc, sh), (pc, ph) = self._terms(pairs=pairs, share=share)
        both = np.outer(enabled, enabled)
        chance = base_c + sc[enabled].sum() + pc[both].sum()
        spread = base_h + sh[enabled].sum() + ph[both].sum()
        return float(binary_entropy(chance) - spread)

    def divergence_chance(self, enabled: np.ndarray, share: float = 1.0) -> float:
        """Predictive chance that one trial of this mask (`share` of a run) diverges."""
        enabled = np.asarray(enabled, dtype=bool)
        base_c, _, (sc, _), (pc, _) = self._terms(pairs=True, share=share)
        return float(base_c + sc[enabled].sum() + pc[np.outer(enabled, enabled)].sum())

    def with_pending(self, masks: list[tuple[np.ndarray, float]]) -> EdgePosterior:
        """A copy for planning: each trial in flight (its mask and share of a run) counts as
        the clean part of it it is expected to be (its predicted chance to stay clean).
        Never used for verdicts."""
        plan = EdgePosterior.__new__(EdgePosterior)
        plan.__dict__.update({k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in self.__dict__.items()})
        plan._cache = {}
        for enabled, share in masks:
            plan.observe(enabled, False, share * (1.0 - self.divergence_chance(enabled, share)))
        return plan

    def ranked_tests(self, limit: int = 8, *, pairs: bool = True,
                     share: float = 1.0) -> list[tuple[float, np.ndarray]]:
        """The most informative masks of a family, best first, as (bits, enabled).

        The family: a contiguous run of the surviving edges (in graph order), or
        every surviving edge but such a run; and the k most probable surviving
        edges (for a posterior a hint made uneven). Edges ruled out stay off.
        Sums over runs come from prefix sums, so all of them are scored at once.
        """
        alive_idx = np.flatnonzero(self.alive)
        k = len(alive_idx)
        if k == 0:
            return []
        base_c, base_h, (sc, sh), (pc, ph) = self._terms(pairs=pairs, share=share)
        starts, ends = np.triu_indices(k + 1, k=1)  # runs [start, end) of surviving edges
        sub = np.ix_(alive_idx, alive_idx)
        in_c, out_c = _run_sums(sc[alive_idx], pc[sub], starts, ends)
        in_h, out_h = _run_sums(sh[alive_idx], ph[sub], starts, ends)
        chance = base_c + np.concatenate([in_c, out_c])
        spread = base_h + np.concatenate([in_h, out_h])
        scores = binary_entropy(np.clip(chance, 0.0, 1.0)) - spread
        candidates = []
        limit = min(limit, len(scores))
        best = np.argpartition(-scores, limit - 1)[:limit]
        for o in best[np.argsort(-scores[best], kind="stable")]:
            r = o % len(starts)
            run = np.zeros(k, dtype=bool)
            run[starts[r]:ends[r]] = True
            chosen = run if o < len(starts) else ~run
            enabled = np.zeros(self.n, dtype=bool)
            enabled[alive_idx[chosen]] = True
            candidates.append((float(scores[o]), enabled))
        # The k most probable edges: prefixes of the edges sorted by posterior mass.
        mass = self._state()["single_all"][alive_idx]
        order = alive_idx[np.argsort(-mass, kind="stable")]
        sub = np.ix_(order, order)
        ends = np.arange(1, k + 1)
        prefix_c = _run_sums(sc[order], pc[sub] + pc[sub].T, np.zeros(k, dtype=int), ends)[0]
        prefix_h = _run_sums(sh[order], ph[sub] + ph[sub].T, np.zeros(k, dtype=int), ends)[0]
        # pc holds each pair once (a < b); symmetrized it counts twice inside a prefix.
        prefix_c = base_c + prefix_c - _pair_half(pc[sub] + pc[sub].T, ends)
        prefix_h = base_h + prefix_h - _pair_half(ph[sub] + ph[sub].T, ends)
        prefix_bits = binary_entropy(np.clip(prefix_c, 0.0, 1.0)) - prefix_h
        for i in np.argsort(-prefix_bits, kind="stable")[:limit]:
            enabled = np.zeros(self.n, dtype=bool)
            enabled[order[: i + 1]] = True
            candidates.append((float(prefix_bits[i]), enabled))
        candidates.sort(key=lambda c: -c[0])
        out, seen = [], set()
        for bits, enabled in candidates:
            key = enabled.tobytes()
            if key not in seen:
                seen.add(key)
                out.append((bits, enabled))
        return out[:limit]


def _pair_half(sym: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Half the sum of a symmetric matrix over each leading block [0, end)."""
    table = np.cumsum(np.cumsum(sym, axis=0), axis=1)
    return table[ends - 1, ends - 1] / 2


def _run_sums(single: np.ndarray, pair: np.ndarray, starts: np.ndarray, ends: np.ndarray):
    """Sums inside each run [start, end) and outside it: singles, and pairs wholly there."""
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
