"""Benchmark of the search: the tool's bisection against the baselines, on simulated drift.

Graph: the MindFormers policy at 32 layers (67 edges); runs of 100 steps; one
simulated culprit per trial, drawn at random, the same culprits and the same
noise for every method (same seed). Cases: a single culprit at per-run chance
q = 0.3 and q = 0.1 (per-step hazard h with q = 1 - (1-h)^100), and a pair of
edges needed together at q = 0.3. The q = 0.3 search runs 1,000 trials and
doubles as the calibration run: accuracy must be at least the claimed confidence.
The baselines are told the true q (the search is not), which favours them.

Targets (issue 6): q = 0.3 median runs <= 40 at accuracy >= 0.95; q = 0.1 median
runs <= 130 at accuracy >= 0.95; the pair found (1-minimal) at accuracy >= 0.95.
"""

from __future__ import annotations

import time

from bisect_prefetch.search.simulate import simulate
from bisect_prefetch.search.stats import hazard_for_chance

POLICY, LAYERS, STEPS, SEED = "mindformers", 32, 100, 20260601

# (title, culprit selectors, together, q, [(method, trials, max_runs)])
CASES = [
    ("single culprit, q = 0.3", ["all"], False, 0.3, [
        ("search", 1000, 200), ("each-edge", 100, 0), ("binary-pair", 300, 0),
        ("binary-repeats", 300, 0),
    ]),
    ("single culprit, q = 0.1", ["all"], False, 0.1, [
        ("search", 300, 400), ("each-edge", 30, 0), ("binary-pair", 300, 0),
        ("binary-repeats", 300, 0),
    ]),
    ("pair needed together, q = 0.3", ["all", "all"], True, 0.3, [
        ("search", 120, 400), ("binary-repeats", 120, 0), ("ddmin-repeats", 120, 0),
    ]),
]
TARGETS = {  # case title -> (largest median runs, smallest accuracy)
    "single culprit, q = 0.3": (40, 0.95),
    "single culprit, q = 0.1": (130, 0.95),
    "pair needed together, q = 0.3": (None, 0.95),
}


def _row(method: str, report: dict, seconds: float) -> str:
    claimed = report["claimed_confidence"]
    claimed_text = f"{claimed:.3f}" if claimed is not None else "-"
    return (
        f"  {method:<15} {report['trials']:>6} {report['accuracy']:>8.3f} {report['runs_median']:>8.1f}"
        f" {report['runs_p90']:>8.1f} {report['steps_median']:>10.0f} {claimed_text:>8} {seconds:>6.1f}s"
    )


def main() -> None:
    print(f"graph {POLICY} {LAYERS} layers, {STEPS} steps per run, seed {SEED}")
    verdicts = []
    for title, culprits, together, q, methods in CASES:
        hazard = hazard_for_chance(q, STEPS)
        print(f"\n{title} (per-step hazard {hazard:.5f})")
        print(f"  {'method':<15} {'trials':>6} {'accuracy':>8} {'runs p50':>8} {'runs p90':>8}"
              f" {'steps p50':>10} {'claimed':>8} {'time':>7}")
        for method, trials, max_runs in methods:
            start = time.perf_counter()
            report = simulate(
                POLICY, LAYERS, culprits, together=together, hazard=hazard, steps=STEPS,
                trials=trials, seed=SEED, method=method, max_runs=max_runs or 200,
            )
            print(_row(method, report, time.perf_counter() - start), flush=True)
            if method == "search":
                verdicts.append(_check(title, report, max_runs))
    print()
    for line in verdicts:
        print(line)


def _check(title: str, report: dict, max_runs: int) -> str:
    most_runs, least_accuracy = TARGETS[title]
    ok = report["accuracy"] >= least_accuracy
    wanted = f"accuracy >= {least_accuracy}"
    if most_runs is not None:
        ok = ok and report["runs_median"] <= most_runs
        wanted = f"median runs <= {most_runs} and " + wanted
    calibrated = report["accuracy"] >= report["claimed_confidence"]
    return (
        f"{'PASS' if ok else 'FAIL'} {title}: {wanted} (got {report['runs_median']:.1f} runs, "
        f"accuracy {report['accuracy']:.3f}, --max-runs {max_runs}); "
        f"calibration over {report['trials']} searches: accuracy {report['accuracy']:.3f} "
        f"{'>=' if calibrated else '<'} claimed {report['claimed_confidence']:.3f}"
    )


if __name__ == "__main__":
    main()
