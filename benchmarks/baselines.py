"""Baselines the benchmark compares the search with, each told the true per-run chance q.

Each edge alone with fixed repeats; binary search with one A/A pair per test;
binary search with fixed repeats; and delta debugging with fixed repeats, the
classic way to find sets needed together. Being told q favours them. Each is a
callable (edge_ids, oracle, *, q, alpha) -> Outcome that simulate() accepts as
its `method`.
"""

from __future__ import annotations

import math

from benchmarks.ddmin import DeltaDebugger
from bisect_prefetch.search.simulate import SimulatedOracle
from bisect_prefetch.search.stats import error_share, runs_for_clean_verdict
from bisect_prefetch.simulation.search_run import Outcome


class _Counter:
    """Wraps an oracle to count the runs and steps a baseline spends (one slot)."""

    def __init__(self, oracle: SimulatedOracle) -> None:
        self.oracle, self.runs, self.steps = oracle, 0, 0

    def diverges(self, mask: frozenset[str], repeats: int, *, stop_early: bool = True) -> bool:
        """Up to `repeats` runs, stopping at the first divergence (one-sided test) unless told not to."""
        diverged = False
        for _ in range(repeats):
            result = self.oracle.run(mask)
            self.runs += 1
            self.steps += result.steps
            diverged = diverged or bool(result.diverged)
            if diverged and stop_early:
                break
        return diverged


def _found(edges: list[str], counter: _Counter, confidence: float | None) -> Outcome:
    verdict = "culprit-found" if edges else "no-drift-reproduced"
    rounds = counter.steps / counter.oracle.steps
    return Outcome(verdict, edges, confidence, counter.runs, counter.steps, rounds)


def each_edge_alone(edge_ids, oracle, *, q: float, alpha: float) -> Outcome:
    """keep-only(e) for every edge, each up to ln(alpha/N)/ln(1-q) runs."""
    counter = _Counter(oracle)
    repeats = runs_for_clean_verdict(q, alpha / len(edge_ids))
    hits = [e for e in edge_ids if counter.diverges(frozenset([e]), repeats)]
    return _found(hits, counter, 1.0 - alpha)


def binary_search(edge_ids, oracle, *, repeats: int, stop_early: bool = True) -> Outcome:
    """Halve the candidates: keep-only(first half) diverges -> it, else the other half."""
    counter = _Counter(oracle)
    candidates = list(edge_ids)
    while len(candidates) > 1:
        half = candidates[: len(candidates) // 2]
        if counter.diverges(frozenset(half), repeats, stop_early=stop_early):
            candidates = half
        else:
            candidates = candidates[len(candidates) // 2:]
    return _found(candidates, counter, None)


def binary_search_pairs(edge_ids, oracle, *, q: float = 0.0, alpha: float = 0.0) -> Outcome:
    """One A/A pair per test, as done by hand: two runs, a difference if either diverged."""
    return binary_search(edge_ids, oracle, repeats=2, stop_early=False)


def binary_search_repeats(edge_ids, oracle, *, q: float, alpha: float) -> Outcome:
    """Repeats per test sized so the clean verdicts together err with chance <= alpha."""
    tests = max(1, math.ceil(math.log2(len(edge_ids))))
    outcome = binary_search(edge_ids, oracle, repeats=runs_for_clean_verdict(q, alpha / tests))
    return Outcome(outcome.verdict, outcome.minimal_set, 1.0 - alpha, outcome.runs, outcome.steps,
                   outcome.rounds)


def ddmin_repeats(edge_ids, oracle, *, q: float, alpha: float) -> Outcome:
    """ddmin over all edges, each test up to ln(alpha_i)/ln(1-q) runs.

    The i-th clean verdict gets error_share(alpha, i): the shares add up to alpha
    however many verdicts ddmin needs.
    """
    counter = _Counter(oracle)
    dd = DeltaDebugger(range(len(edge_ids)))
    clean_verdicts = 0
    while dd.test is not None:
        repeats = runs_for_clean_verdict(q, error_share(alpha, clean_verdicts + 1))
        failed = counter.diverges(frozenset(edge_ids[i] for i in dd.test), repeats)
        clean_verdicts += not failed
        dd.report(failed)
    return _found([edge_ids[i] for i in sorted(dd.current)], counter, 1.0 - alpha)


BASELINES = {
    "each-edge": each_edge_alone,
    "binary-pair": binary_search_pairs,
    "binary-repeats": binary_search_repeats,
    "ddmin-repeats": ddmin_repeats,
}
