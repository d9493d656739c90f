"""A simulated oracle with a known answer, and simulated searches scored against it.

Culprit rule: one edge; several edges any of which is enough (`together=False`);
or several edges needed together (`together=True`). While the rule holds for a
mask, each step of a run diverges with chance `hazard`; optional background
drift does so whatever the mask. A diverging run stops at its first difference.

Random streams: each culprit edge (or the set needed together), the background
and run failures draw from their own generator, seeded from (seed, trial, name),
and a stream draws only in runs where it is in play. So another search policy
meets the same noise: the k-th run that enables a culprit first differs at the
same step whatever ran before it.

Besides the tool's search, baselines for the benchmark, each told the true per-run
chance q (which favours them): each edge alone with fixed repeats; binary search
with one A/A pair per test; binary search with fixed repeats; and delta debugging
with fixed repeats, the classic way to find sets needed together.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.graph import from_policy
from bisect_prefetch.search.ddmin import DeltaDebugger
from bisect_prefetch.search.oracle import RunResult
from bisect_prefetch.search.protocol import Bisection
from bisect_prefetch.search.stats import error_share, per_run_chance, runs_for_clean_verdict
from bisect_prefetch.select import select

METHODS = ("search", "each-edge", "binary-pair", "binary-repeats", "ddmin-repeats")


def _stream(seed: int, trial: int, name: str) -> np.random.Generator:
    # crc32, not hash(): the same name must give the same stream in every process.
    return np.random.default_rng([seed, trial, zlib.crc32(name.encode())])


class SimulatedOracle:
    """Runs nothing: draws each run's first differing step from the culprit rule."""

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
        rules = [tuple(self.culprits)] if together and self.culprits else [(c,) for c in self.culprits]
        self._rules = [(set(rule), _stream(seed, trial, "culprit:" + ",".join(rule))) for rule in rules]
        self._background = _stream(seed, trial, "background")
        self._errors = _stream(seed, trial, "errors")
        self.runs = 0

    def _first_diff(self, rng: np.random.Generator, hazard: float) -> int | None:
        if hazard <= 0.0:
            return None
        step = int(rng.geometric(hazard))
        return step if step <= self.steps else None

    def run(self, mask: frozenset[str]) -> RunResult:
        self.runs += 1
        if self.error_rate and self._errors.random() < self.error_rate:
            return RunResult("error", None, None, 0)
        draws = [self._first_diff(rng, self.hazard) for rule, rng in self._rules if rule <= mask]
        if self.background:
            draws.append(self._first_diff(self._background, self.background))
        diffs = [d for d in draws if d is not None]
        if diffs:
            first = min(diffs)
            return RunResult("stopped-early", True, first, first)
        return RunResult("ok", False, None, self.steps)


# -- baselines ---------------------------------------------------------------------
@dataclass(frozen=True)
class Outcome:
    verdict: str
    minimal_set: list[str]
    confidence: float | None  # None: the method claims nothing
    runs: int
    steps: int


class _Counter:
    """Wraps an oracle to count the runs and steps a baseline spends."""

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
    return Outcome(verdict, edges, confidence, counter.runs, counter.steps)


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


def binary_search_pairs(edge_ids, oracle) -> Outcome:
    """One A/A pair per test, as done by hand: two runs, a difference if either diverged."""
    return binary_search(edge_ids, oracle, repeats=2, stop_early=False)


def binary_search_repeats(edge_ids, oracle, *, q: float, alpha: float) -> Outcome:
    """Repeats per test sized so the clean verdicts together err with chance <= alpha."""
    tests = max(1, math.ceil(math.log2(len(edge_ids))))
    outcome = binary_search(edge_ids, oracle, repeats=runs_for_clean_verdict(q, alpha / tests))
    return Outcome(outcome.verdict, outcome.minimal_set, 1.0 - alpha, outcome.runs, outcome.steps)


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


def run_search(edge_ids, oracle, **options) -> Outcome:
    """The tool's own search (protocol.Bisection) against the oracle."""
    search = Bisection(edge_ids, **options)
    while (mask := search.next_mask()) is not None:
        search.record(mask, oracle.run(mask))
    result = search.result()
    return Outcome(result.verdict, result.minimal_set, result.confidence, result.runs_used, result.steps_used)


# -- simulate --------------------------------------------------------------------------
def draw_culprits(selectors: Sequence[str], edge_ids: Sequence[str], rng: np.random.Generator) -> list[str]:
    """One edge per selector; a selector matching several edges draws one (no repeats)."""
    chosen: list[str] = []
    for selector in selectors:
        pool = [e for e in select(selector, edge_ids) if e not in chosen]
        if not pool:
            raise BisectPrefetchError(f"culprit {selector!r} has no edge left to draw")
        chosen.append(pool[int(rng.integers(len(pool)))])
    return [e for e in edge_ids if e in chosen]


def is_correct(outcome: Outcome, culprits: Sequence[str], *, together: bool, background: float) -> bool:
    if background > 0:
        return outcome.verdict == "not-prefetch"
    if not culprits:
        return outcome.verdict == "no-drift-reproduced"
    if outcome.verdict != "culprit-found":
        return False
    if together:
        return sorted(outcome.minimal_set) == sorted(culprits)
    return len(outcome.minimal_set) == 1 and outcome.minimal_set[0] in culprits


def _percentile(values: Sequence[float], p: float) -> float:
    return float(np.percentile(values, p)) if len(values) else 0.0


def simulate(
    policy: str,
    layers: int,
    culprits: Sequence[str],
    *,
    together: bool = False,
    hazard: float,
    steps: int,
    trials: int = 100,
    seed: int = 0,
    background: float = 0.0,
    startup_cost: float = 0.0,
    error_rate: float = 0.0,
    confidence: float = 0.95,
    max_runs: int = 200,
    method: str = "search",
) -> dict:
    """Run `trials` simulated searches on one graph and score them (DESIGN.md's simulate JSON).

    A culprit selector that matches several edges draws one of them per trial
    (`all` draws any edge). `startup_cost` is in steps per run; it only adds to
    the reported cost. Methods other than "search" are the benchmark baselines.
    """
    if method not in METHODS:
        raise BisectPrefetchError(f"unknown method {method!r} (one of {', '.join(METHODS)})")
    if trials < 1:
        raise BisectPrefetchError(f"--trials must be at least 1, got {trials}")
    edge_ids = from_policy(policy, layers).edge_ids()
    q = per_run_chance(hazard, steps)
    alpha = 1.0 - confidence
    results = []
    for trial in range(trials):
        truth = draw_culprits(culprits, edge_ids, _stream(seed, trial, "choice"))
        oracle = SimulatedOracle(
            truth, together=together, hazard=hazard, steps=steps, background=background,
            error_rate=error_rate, seed=seed, trial=trial,
        )
        if method == "search":
            outcome = run_search(
                edge_ids, oracle, confidence=confidence, max_runs=max_runs, steps_per_run=steps
            )
        elif method == "each-edge":
            outcome = each_edge_alone(edge_ids, oracle, q=q, alpha=alpha)
        elif method == "binary-pair":
            outcome = binary_search_pairs(edge_ids, oracle)
        elif method == "binary-repeats":
            outcome = binary_search_repeats(edge_ids, oracle, q=q, alpha=alpha)
        else:
            outcome = ddmin_repeats(edge_ids, oracle, q=q, alpha=alpha)
        results.append({
            "trial": trial,
            "culprits": truth,
            "verdict": outcome.verdict,
            "minimal_set": outcome.minimal_set,
            "correct": is_correct(outcome, truth, together=together, background=background),
            "confidence": outcome.confidence,
            "runs": outcome.runs,
            "steps": outcome.steps,
            "cost": outcome.steps + startup_cost * outcome.runs,
        })
    runs = [r["runs"] for r in results]
    claims = [r["confidence"] for r in results if r["confidence"] is not None]
    return {
        "trials": trials,
        "accuracy": sum(r["correct"] for r in results) / trials,
        "runs_median": _percentile(runs, 50),
        "runs_p90": _percentile(runs, 90),
        "steps_median": _percentile([r["steps"] for r in results], 50),
        "claimed_confidence": float(np.mean(claims)) if claims else None,
        "cost_median": _percentile([r["cost"] for r in results], 50),
        "method": method,
        "policy": policy,
        "layers": layers,
        "edges": len(edge_ids),
        "per_run_chance": q,
        "seed": seed,
        "results": results,
    }
