"""Simulated searches scored: whether each named the culprits, and what they cost (the
simulate JSON of docs/contract.md)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bisect_prefetch.search.simulate import TOGETHER
from bisect_prefetch.simulation.search_run import Outcome
from bisect_prefetch.vocab import (
    VERDICT_FOUND,
    VERDICT_INCONCLUSIVE,
    VERDICT_NO_DRIFT,
    VERDICT_NOT_PREFETCH,
)


def is_correct(outcome: Outcome, culprits: Sequence[str], *, together: bool, background: float) -> bool:
    """No culprit: not-prefetch under background drift, else no-drift-reproduced; culprits
    (background or not): culprit-found naming them: a set needed together exactly; several
    independent ones, each as its own set and no other (a method that names one set only,
    a baseline, is right when it names one of them)."""
    if not culprits:
        return outcome.verdict == (VERDICT_NOT_PREFETCH if background > 0 else VERDICT_NO_DRIFT)
    if outcome.verdict != VERDICT_FOUND:
        return False
    if together:
        return sorted(outcome.minimal_set) == sorted(culprits)
    if not outcome.culprit_sets:  # a baseline's one set
        return len(outcome.minimal_set) == 1 and outcome.minimal_set[0] in culprits
    return sorted(map(sorted, outcome.culprit_sets)) == sorted(sorted(c.split(TOGETHER)) for c in culprits)


def percentile(values: Sequence[float], p: float) -> float:
    return float(np.percentile(values, p)) if len(values) else 0.0


def trial_record(trial: int, truth: list[str], outcome: Outcome, correct: bool, startup_cost: float) -> dict:
    """One trial of the simulate JSON's results."""
    return {
        "trial": trial,
        "culprits": truth,
        "verdict": outcome.verdict,
        "minimal_set": outcome.minimal_set,
        "culprit_sets": outcome.culprit_sets,
        "correct": correct,
        "confidence": outcome.confidence,
        "runs": outcome.runs,
        "steps": outcome.steps,
        "rounds": outcome.rounds,
        "startups": outcome.startups,
        "golden_steps": outcome.golden_steps,
        # Cluster time in steps: every start-up, the golden reference's included.
        "cost": outcome.steps + outcome.golden_steps + startup_cost * outcome.startups,
        "runs_by_step": outcome.runs_by_stage,  # the key: docs/contract.md's runs_by_step_mean
    }


def scores(results: Sequence[dict]) -> dict:
    """The trials scored: accuracy, what they claimed, and medians of what they cost."""
    trials = len(results)
    runs = [r["runs"] for r in results]
    claims = [r["confidence"] for r in results if r["confidence"] is not None]
    return {
        "trials": trials,
        "accuracy": sum(r["correct"] for r in results) / trials,
        "runs_median": percentile(runs, 50),
        "runs_p90": percentile(runs, 90),
        "steps_median": percentile([r["steps"] for r in results], 50),
        "claimed_confidence": float(np.mean(claims)) if claims else None,
        VERDICT_INCONCLUSIVE: sum(r["verdict"] == VERDICT_INCONCLUSIVE for r in results) / trials,
        "rounds_median": percentile([r["rounds"] for r in results], 50),
        "rounds_p90": percentile([r["rounds"] for r in results], 90),
        "startups_median": percentile([r["startups"] for r in results], 50),
        "cost_median": percentile([r["cost"] for r in results], 50),
        "runs_by_step_mean": runs_by_stage_mean(results),  # the key: docs/contract.md
    }


def runs_by_stage_mean(results: Sequence[dict]) -> dict[str, float]:
    """Mean runs per protocol stage over the trials (where the runs go); {} for a baseline."""
    by_stage = [r["runs_by_step"] for r in results if r["runs_by_step"]]
    return {k: float(np.mean([s[k] for s in by_stage])) for k in by_stage[0]} if by_stage else {}
