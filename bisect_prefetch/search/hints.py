"""Soft prior over culprit sets from localization hints and audit suspects.

A diverged run may name the first unit whose gradient diverged (its localization).
A bad prefetch along edge src->dst writes into dst, so a right hint names the
culprit's target (or, less often, a chain neighbour of it); a wrong one names any
unit. With the hint's reliability c:

    P(hint names U | culprit e) = c * local(U | e) + (1 - c) / units
    local(U | e) = 1 for U = target(e), NEIGHBOUR for a neighbour of target(e), normalized

and a pair's local() is the mean of its two edges'. c is not trusted: it is
unknown, with a prior over a grid (RELIABILITY), and integrated out over all the
hints together. So hints that agree with each other and with the runs keep their
weight, and hints whose edges the runs clear lose it: the posterior over the sets
(posterior.py) is exact under this model, the hints only reweight its prior.
Audit suspects (edge ids an order audit flagged) work the same way with their
own reliability: a suspect list is right with chance c, and then the culprit is
one of its edges.

Pure: the names come in, log prior factors and structured events go out.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# Prior over a hint's reliability c: a grid, evenly weighted (mean 0.45).
RELIABILITY = np.linspace(0.0, 0.9, 10)
RELIABILITY_WEIGHTS = np.full(len(RELIABILITY), 1.0 / len(RELIABILITY))
# A right hint names a chain neighbour of the culprit's target this much less often.
NEIGHBOUR = 0.25


def edge_ends(edge_id: str) -> tuple[str, str]:
    """(source, target) units of an edge id "phase:src->dst"."""
    _, _, ends = edge_id.partition(":")
    src, _, dst = ends.partition("->")
    return src, dst


class HintPrior:
    """Log prior factors over single edges and pairs from hints and suspects."""

    def __init__(self, edge_ids: Sequence[str]) -> None:
        self.edge_ids = list(edge_ids)
        ends = [edge_ends(e) for e in self.edge_ids]
        self.units = sorted({u for pair in ends for u in pair if u})
        self._unit_index = {u: i for i, u in enumerate(self.units)}
        neighbours: dict[str, set[str]] = {u: set() for u in self.units}
        for src, dst in ends:
            if src and dst:
                neighbours[src].add(dst)
                neighbours[dst].add(src)
        # local[e, U]: chance a right hint about culprit e names unit U.
        n, m = len(self.edge_ids), len(self.units)
        self.local = np.zeros((n, m))
        for i, (_, dst) in enumerate(ends):
            if dst not in self._unit_index:
                continue
            self.local[i, self._unit_index[dst]] = 1.0
            for v in neighbours[dst]:
                self.local[i, self._unit_index[v]] += NEIGHBOUR
            self.local[i] /= self.local[i].sum()
        self.hints: list[str] = []
        self.suspects: list[int] = []

    # -- inputs -------------------------------------------------------------------
    def add_hint(self, unit: str) -> dict:
        """Take a localized unit; returns a structured event (hint or hint-ignored)."""
        if unit not in self._unit_index:
            return {"event": "hint-ignored", "unit": unit, "reason": "unknown-unit"}
        self.hints.append(unit)
        col = self.local[:, self._unit_index[unit]]
        first = [self.edge_ids[i] for i in np.flatnonzero(col == col.max())] if col.max() > 0 else []
        return {"event": "hint", "unit": unit, "edges": first}

    def set_suspects(self, suspects: Sequence[str]) -> list[dict]:
        """Take audit suspects (edge ids); unknown ones are ignored, each with an event."""
        index = {e: i for i, e in enumerate(self.edge_ids)}
        events = []
        self.suspects = []
        for edge in suspects:
            if edge in index:
                if index[edge] not in self.suspects:
                    self.suspects.append(index[edge])
            else:
                events.append({"event": "suspect-ignored", "edge": edge, "reason": "unknown-edge"})
        if self.suspects:
            events.append({"event": "suspects", "edges": [self.edge_ids[i] for i in self.suspects]})
        return events

    # -- the prior factor -----------------------------------------------------------
    def log_factors(self) -> tuple[np.ndarray, np.ndarray]:
        """(per edge, per pair [a, b]) log factors; zeros without hints or suspects."""
        n = len(self.edge_ids)
        single = np.zeros(n)
        pair = np.zeros((n, n))
        if self.hints:
            cols = [self._unit_index[u] for u in self.hints]
            s, p = self._mixture(self.local[:, cols], 1.0 / len(self.units))
            single += s
            pair += p
        if self.suspects:
            right = np.zeros((n, 1))
            right[self.suspects, 0] = 1.0 / len(self.suspects)
            s, p = self._mixture(right, 1.0 / n)
            single += s
            pair += p
        return single, pair

    @staticmethod
    def _mixture(right: np.ndarray, wrong: float) -> tuple[np.ndarray, np.ndarray]:
        """log sum_c prior(c) prod_k [c right[., k] + (1 - c) wrong] / wrong^K, for edges and pairs."""
        pair_right = (right[:, None, :] + right[None, :, :]) / 2

        def integrate(r: np.ndarray) -> np.ndarray:
            c = RELIABILITY.reshape((-1,) + (1,) * (r.ndim - 1))
            log_terms = np.log(c[..., None] * r[None] / wrong + (1 - c[..., None])).sum(axis=-1)
            top = log_terms.max(axis=0)
            weights = RELIABILITY_WEIGHTS.reshape((-1,) + (1,) * (log_terms.ndim - 1))
            return top + np.log((weights * np.exp(log_terms - top)).sum(axis=0))

        return integrate(right), integrate(pair_right)
