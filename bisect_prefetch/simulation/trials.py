"""The `simulate` command's trials: many simulated searches on one graph, each against
culprits drawn at random, scored (scores.py).

Culprits: a selector matching several edges draws one of them per trial (`all` draws
any edge). Hints: with `hint_accuracy` C, the first diverged run carries a localized
unit: the target of a culprit edge with chance C, else a unit drawn evenly from the
graph's (its own stream). Stress (`simulate`'s stress_factor): the same searches, same
seeds, with and without it.

The baselines the benchmark compares with live in benchmarks/baselines.py; any
callable (edge_ids, oracle, *, q, alpha) -> Outcome can be passed as `method`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.graph import from_policy
from bisect_prefetch.search.hints import HintPrior, edge_ends
from bisect_prefetch.search.segments import SEGMENTS_MODES, lengths_for
from bisect_prefetch.search.simulate import TOGETHER, SimulatedOracle, stream
from bisect_prefetch.search.stats import hazard_for_chance, per_run_chance
from bisect_prefetch.select import select
from bisect_prefetch.simulation.scores import is_correct, percentile, scores, trial_record
from bisect_prefetch.simulation.search_run import METHODS, Outcome, run_search


def draw_culprits(selectors: Sequence[str], edge_ids: Sequence[str], rng: np.random.Generator) -> list[str]:
    """One edge per selector (per part of `A+B`: a cause needed together); a selector
    matching several edges draws one (no repeats). Single edges come in graph order."""
    chosen: list[str] = []
    causes: list[str] = []
    for selector in selectors:
        parts = []
        for part in selector.split(TOGETHER):
            pool = [e for e in select(part, edge_ids) if e not in chosen]
            if not pool:
                raise BisectPrefetchError(f"culprit {selector!r} has no edge left to draw")
            chosen.append(pool[int(rng.integers(len(pool)))])
            parts.append(chosen[-1])
        causes.append(TOGETHER.join(sorted(parts, key=edge_ids.index)))
    return sorted(causes, key=lambda c: edge_ids.index(c.split(TOGETHER)[0]))


def simulate(
    policy: str,
    layers: int,
    culprits: Sequence[str],
    *,
    hazard: float,
    stress_factor: float | None = None,
    stress_cost: float = 1.0,
    **settings,
) -> dict:
    """`_simulate`, and with a stress factor the same searches (same seeds) under stress too.

    Stress model: it multiplies the culprit's per-step hazard by ``stress_factor`` (below 1:
    a stress that hides the race; capped at 0.99) and each step's time by ``stress_cost``;
    background drift (no race) stays. The result is the stressed searches', with ``stress``:
    both settings' medians and costs (steps x step-time factor, plus the start-ups) and
    whether stress pays; `bisect --stress auto` would use it only where it raises the hazard.
    """
    if stress_factor is None:
        return _simulate(policy, layers, culprits, hazard=hazard, **settings)
    if stress_factor <= 0:
        raise BisectPrefetchError(f"--stress-factor must be above 0, got {stress_factor}")
    if stress_cost < 1.0:
        raise BisectPrefetchError(f"--stress-cost is a step-time factor of at least 1, got {stress_cost}")
    without = _simulate(policy, layers, culprits, hazard=hazard, **settings)
    stressed_hazard = min(hazard * stress_factor, 0.99)
    stressed = _simulate(policy, layers, culprits, hazard=stressed_hazard, **settings)
    startup = settings.get("startup_cost", 0.0)
    time_without = percentile([r["steps"] + startup * r["runs"] for r in without["results"]], 50)
    time_with = percentile([r["steps"] * stress_cost + startup * r["runs"]
                             for r in stressed["results"]], 50)
    stressed["stress"] = {
        "factor": stress_factor, "step_cost": stress_cost,
        "hazard_without": hazard, "hazard_with": stressed_hazard,
        "per_run_chance_without": without["per_run_chance"],
        "per_run_chance_with": stressed["per_run_chance"],
        "accuracy_without": without["accuracy"], "accuracy_with": stressed["accuracy"],
        "runs_median_without": without["runs_median"], "runs_median_with": stressed["runs_median"],
        "steps_median_without": without["steps_median"],
        "steps_median_with": stressed["steps_median"],
        "time_median_without": time_without, "time_median_with": time_with,
        "used": stressed_hazard > hazard,  # what --stress auto would keep
        "pays": stressed_hazard > hazard and time_with < time_without,
    }
    return stressed


def _simulate(
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
    max_runs: int | None = None,
    slots: int = 1,
    hint_accuracy: float | None = None,
    all_off_runs: int | str = "auto",
    segments: str = "off",
    method: str | Callable[..., Outcome] = "search",
) -> dict:
    """Run `trials` simulated searches on one graph and score them (the simulate JSON of docs/contract.md).

    A culprit selector that matches several edges draws one of them per trial
    (`all` draws any edge). `background` is the per-run chance of drift with every
    edge off. `startup_cost` is in steps per run; it only adds to the reported
    cost. `all_off_runs`: as the experiment's search.all_off_runs (a count, or
    "auto"). `method`: one of METHODS, or a baseline callable (benchmarks/baselines.py).
    """
    _check_options(method=method, trials=trials, slots=slots, hint_accuracy=hint_accuracy,
                   background=background, segments=segments)
    edge_ids = from_policy(policy, layers).edge_ids()
    lengths = (lengths_for(steps, startup_cost, len(edge_ids), chance=per_run_chance(hazard, steps),
                           background=background > 0) if segments == "auto" else None)
    units = HintPrior(edge_ids).units
    q = per_run_chance(hazard, steps)
    alpha = 1.0 - confidence
    results = []
    for trial in range(trials):
        truth = draw_culprits(culprits, edge_ids, stream(seed, trial, "choice"))
        oracle = SimulatedOracle(
            truth, together=together, hazard=hazard, steps=steps,
            background=hazard_for_chance(background, steps) if background else 0.0,
            error_rate=error_rate, seed=seed, trial=trial,
        )
        if method in METHODS:
            hint = _hint_drawer(truth, units, hint_accuracy, stream(seed, trial, "hint"))
            outcome = run_search(
                edge_ids, oracle, slots=slots, hint=hint, confidence=confidence, max_runs=max_runs,
                steps_per_run=steps, all_off_runs=all_off_runs, lengths=lengths,
                startup_cost=startup_cost, one_cause=method == "one-cause",
            )
        else:
            outcome = method(edge_ids, oracle, q=q, alpha=alpha)
        correct = is_correct(outcome, truth, together=together, background=background)
        results.append(trial_record(trial, truth, outcome, correct, startup_cost))
    return {
        **scores(results),
        "slots": slots,
        "hint_accuracy": hint_accuracy,
        "all_off_runs": all_off_runs,
        "background": background,
        "segments": segments,
        "segment_steps": lengths.segment_steps if lengths else steps,
        "cap_steps": lengths.cap_steps if lengths else steps,
        "startup_cost": startup_cost,
        "method": method if isinstance(method, str) else method.__name__,
        "policy": policy,
        "layers": layers,
        "edges": len(edge_ids),
        "per_run_chance": q,
        "seed": seed,
        "results": results,
    }


def _check_options(*, method, trials: int, slots: int, hint_accuracy: float | None, background: float,
                   segments: str) -> None:
    if method not in METHODS and not callable(method):
        raise BisectPrefetchError(f"unknown method {method!r} (the simulator runs the search)")
    if trials < 1:
        raise BisectPrefetchError(f"--trials must be at least 1, got {trials}")
    if slots < 1:
        raise BisectPrefetchError(f"--slots must be at least 1, got {slots}")
    if hint_accuracy is not None and not 0.0 <= hint_accuracy <= 1.0:
        raise BisectPrefetchError(f"--hint-accuracy must be in [0, 1], got {hint_accuracy}")
    if not 0.0 <= background < 1.0:
        raise BisectPrefetchError(f"--background must be in [0, 1), got {background}")
    if segments not in SEGMENTS_MODES:
        raise BisectPrefetchError(f"--segments must be one of {', '.join(SEGMENTS_MODES)}, got {segments!r}")


def _hint_drawer(truth: Sequence[str], units: Sequence[str], accuracy: float | None,
                 rng: np.random.Generator) -> Callable[[], str] | None:
    """The localization the first diverged run carries: a culprit's target with chance accuracy."""
    if accuracy is None or not truth:
        return None

    def draw() -> str:
        if rng.random() < accuracy:
            return edge_ends(truth[int(rng.integers(len(truth)))].split(TOGETHER)[0])[1]
        return units[int(rng.integers(len(units)))]

    return draw
