"""Benchmark of the search: every target of issues 12, 13 and 14 side by side, on simulated drift.

Graph: the MindFormers policy at 32 layers (67 edges) unless a case says
otherwise; runs of 100 steps; culprits drawn at random per trial, the same
culprits and noise for every method (same seed, per-edge streams). The search is
not told q; the baselines (benchmarks/baselines.py) are, which favours them.

Sections: no hint (issue 14 item 5, with the baselines and the pair); hints
(issue 14 items 4, 6); background drift, sets of three, the default budget and
calibration (issue 12 items 1, 3); slots (issue 13 item 3: wall-clock in full
runs against one slot). Every case prints accuracy, claimed confidence, runs,
rounds and the inconclusive share; then where the runs of the one-culprit cases
go (localizing, confirming, ruling out background drift) beside the information
floor; the targets are checked at the end, PASS or FAIL with the figures.

`python -m benchmarks bench_search` runs the trial counts the issues ask for, on
two processes (about 40 minutes on 2 cores). BENCH_SEARCH_SCALE=0.1 scales every
trial count down (a quick look); BENCH_SEARCH_CASES=q3,bg-culprit runs only those
cases (the targets are checked on a run of every case).
"""

from __future__ import annotations

import math
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

from benchmarks.baselines import BASELINES
from bisect_prefetch.graph import from_policy
from bisect_prefetch.search.hints import HintPrior, edge_ends
from bisect_prefetch.search.stats import (
    binary_entropy,
    hazard_for_chance,
    per_run_chance,
    z_channel_capacity,
)
from bisect_prefetch.simulation.scores import runs_by_stage_mean
from bisect_prefetch.simulation.search_run import METHODS
from bisect_prefetch.simulation.trials import simulate

POLICY, LAYERS, STEPS, SEED = "mindformers", 32, 100, 20260601
CHAIN_Q = per_run_chance(0.05, 30)  # the hazard of issue 35's measurements, over 30 steps
WORKERS = 2


@dataclass(frozen=True)
class Case:
    key: str
    title: str
    q: float
    trials: int
    culprits: tuple[str, ...] = ("all",)
    together: bool = False
    method: str = "search"
    policy: str = POLICY
    layers: int = LAYERS
    background: float = 0.0
    hint_accuracy: float | None = None
    slots: int = 1
    options: dict = field(default_factory=dict)


# The cases segments are measured on: key, title, q, trials, culprits, together, policy,
# layers, background. q8 is make demo's search (14 edges, drift in about 4 runs of 5).
SEGMENT_BASES = [
    ("q3", "q = 0.3", 0.3, 100, ("all",), False, POLICY, LAYERS, 0.0),
    ("q1", "q = 0.1", 0.1, 40, ("all",), False, POLICY, LAYERS, 0.0),
    ("q8", "q = 0.8, fsdp2-chain 8 layers", 0.8, 100, ("all",), False, "fsdp2-chain", 8, 0.0),
    ("bg", "background 0.3, no culprit", 0.3, 60, (), False, POLICY, LAYERS, 0.3),
    ("three", "three together, q = 0.3", 0.3, 40, ("all", "all", "all"), True, POLICY, LAYERS, 0.0),
]
SEGMENT_STARTUPS = (0, 50, 200)

CASES = [
    # issue 14 item 5: no hint, with the baselines
    Case("q3", "single culprit, q = 0.3", 0.3, 1000),
    Case("q1", "single culprit, q = 0.1", 0.1, 1000),
    Case("pair", "pair needed together, q = 0.3", 0.3, 1000, ("all", "all"), True),
    Case("q3-each", "  baseline each-edge, q = 0.3", 0.3, 50, method="each-edge"),
    Case("q3-bpair", "  baseline binary-pair, q = 0.3", 0.3, 300, method="binary-pair"),
    Case("q3-brep", "  baseline binary-repeats, q = 0.3", 0.3, 300, method="binary-repeats"),
    Case("q1-brep", "  baseline binary-repeats, q = 0.1", 0.1, 300, method="binary-repeats"),
    Case("pair-dd", "  baseline ddmin-repeats, pair q = 0.3", 0.3, 100, ("all", "all"), True,
         method="ddmin-repeats"),
    # issue 14 items 4, 6: a localization hint
    Case("q3-h80", "hint right 80%, q = 0.3", 0.3, 300, hint_accuracy=0.8),
    Case("q1-h80", "hint right 80%, q = 0.1", 0.1, 300, hint_accuracy=0.8),
    Case("q3-h0", "hint always wrong, q = 0.3", 0.3, 300, hint_accuracy=0.0),
    Case("q1-h0", "hint always wrong, q = 0.1", 0.1, 300, hint_accuracy=0.0),
    # issue 12 items 1, 3: background drift, sets of three
    # all_off_runs: auto (the default) rules out drift without prefetch as strong as the
    # answer's; all_off_runs: 1 is the cheaper search that trusts it to be rare
    Case("bg", "background as strong as a culprit (0.3), no culprit, 67 edges", 0.3, 1000, (),
         background=0.3),
    Case("bg-count", "  the same, all_off_runs: 1", 0.3, 300, (), background=0.3,
         options={"all_off_runs": 1}),
    Case("bg-chain", "background 0.3, no culprit, fsdp2-chain 8 layers", 0.3, 1000, (),
         policy="fsdp2-chain", layers=8, background=0.3),
    Case("q3-count", "single culprit, q = 0.3, all_off_runs: 1", 0.3, 300,
         options={"all_off_runs": 1}),
    Case("q1-count", "single culprit, q = 0.1, all_off_runs: 1", 0.1, 300,
         options={"all_off_runs": 1}),
    Case("bg-culprit", "background p0 = 0.02 and a culprit at q = 0.3", 0.3, 1000, background=0.02),
    Case("three", "three edges needed together, q = 0.3", 0.3, 300, ("all", "all", "all"), True),
    Case("three-dd", "  baseline ddmin-repeats, three q = 0.3", 0.3, 100, ("all", "all", "all"), True,
         method="ddmin-repeats"),
    # issue 13 item 3: slots
    *[Case(f"q3-s{n}", f"slots {n}, q = 0.3", 0.3, 300, slots=n) for n in (1, 2, 4, 8, 16)],
    *[Case(f"q1-s{n}", f"slots {n}, q = 0.1", 0.1, 100, slots=n) for n in (1, 2, 4, 8, 16)],
    # several masks per run (segments), cut by the cost model at a start-up cost of S
    # steps, beside the same cases with segments off (same seeds): auto must never cost
    # more cluster time than one mask a run
    *[Case(f"{base}-{seg}-S{cost}", f"{'segments' if seg == 'seg' else 'one mask a run'}, {what}, "
           f"start-up {cost} steps", q, trials, culprits, together, policy=policy, layers=layers,
           background=background,
           options={"startup_cost": cost, "segments": "auto" if seg == "seg" else "off"})
      for base, what, q, trials, culprits, together, policy, layers, background in SEGMENT_BASES
      for cost in SEGMENT_STARTUPS for seg in ("seg", "one")],
    *[Case(f"q3-s8-{seg}", f"slots 8, {'segments' if seg == 'seg' else 'one mask a run'}, q = 0.3, "
           "start-up 200", 0.3, 40, slots=8,
           options={"startup_cost": 200, "segments": "auto" if seg == "seg" else "off"})
      for seg in ("seg", "one")],
    # issue 35: several independent causes on the reported chain (14 edges, hazard 0.05 over
    # 30 steps: a per-run chance of 0.785), each beside the same searches with one culprit,
    # and the one-cause search alone (protocol.Bisection, as before several causes), same seeds
    *[Case(key, title, CHAIN_Q, trials, culprits, policy="fsdp2-chain", layers=8, method=method,
           background=background)
      for key, title, trials, culprits, method, background in (
          ("c1", "one culprit, 14 edges, q = 0.785", 300, ("all",), "search", 0.0),
          ("c1-one", "  the same, the one-cause search alone", 300, ("all",), "one-cause", 0.0),
          ("c2", "two independent culprits, 14 edges", 300, ("all", "all"), "search", 0.0),
          ("c3", "three independent culprits, 14 edges", 200, ("all", "all", "all"), "search", 0.0),
          ("c2-pair", "a single beside a pair needed together, 14 edges", 200, ("all+all", "all"),
           "search", 0.0),
          ("c2-bg", "two culprits beside background p0 = 0.02, 14 edges", 200, ("all", "all"),
           "search", 0.02),
          ("c1-bg", "one culprit beside background p0 = 0.02, 14 edges", 200, ("all",), "search", 0.02),
          ("c1-bg-one", "  the same, the one-cause search alone", 200, ("all",), "one-cause", 0.02))],
    Case("q3-one", "single culprit, q = 0.3, the one-cause search alone", 0.3, 1000, method="one-cause"),
    Case("bg-culprit-one", "  p0 = 0.02 and a culprit at q = 0.3, the one-cause search alone", 0.3, 1000,
         background=0.02, method="one-cause"),
]


def _run(case: Case, trials: int, seed: int) -> dict:
    method = case.method if case.method in METHODS else BASELINES[case.method]
    return simulate(
        case.policy, case.layers, list(case.culprits), together=case.together,
        hazard=hazard_for_chance(case.q, STEPS), steps=STEPS, trials=trials, seed=seed,
        background=case.background, hint_accuracy=case.hint_accuracy, slots=case.slots,
        method=method, **case.options,
    )


def _chunk(args: tuple[Case, int, int]) -> tuple[str, list[dict], float]:
    case, trials, seed = args
    start = time.perf_counter()
    return case.key, _run(case, trials, seed)["results"], time.perf_counter() - start


def _summary(results: list[dict]) -> dict:
    import numpy as np

    runs = [r["runs"] for r in results]
    claims = [r["confidence"] for r in results if r["confidence"] is not None]
    return {
        "trials": len(results),
        "accuracy": sum(r["correct"] for r in results) / len(results),
        "claimed": float(np.mean(claims)) if claims else None,
        "runs_median": float(np.median(runs)),
        "runs_p90": float(np.percentile(runs, 90)),
        "rounds_median": float(np.median([r["rounds"] for r in results])),
        "rounds_p90": float(np.percentile([r["rounds"] for r in results], 90)),
        "inconclusive": sum(r["verdict"] == "inconclusive" for r in results) / len(results),
        "by_stage": runs_by_stage_mean(results),
        "startups_median": float(np.median([r["startups"] for r in results])),
        # Every step the cluster runs: the search's and the golden reference's.
        "steps_median": float(np.median([r["steps"] + r["golden_steps"] for r in results])),
        "cost_median": float(np.median([r["cost"] for r in results])),
    }


def information_floor(q: float, alpha: float = 0.05, hint_accuracy: float | None = None) -> float:
    """Fewest runs on average that can name one culprit among the graph's edges with error
    alpha (Fano): the entropy of the culprit (given the hint, drawn as the simulator draws
    it) less what an error of alpha may leave unresolved, over one run's capacity (a
    Z-channel at q). Lower than any search can reach: the hint's own wait (the first
    divergence) and every check come on top.
    """
    import numpy as np

    edge_ids = from_policy(POLICY, LAYERS).edge_ids()
    units = HintPrior(edge_ids).units
    n = len(edge_ids)
    entropy = math.log2(n)
    if hint_accuracy is not None:
        # joint[e, u]: chance that e is the culprit and the hint names u.
        joint = np.full((n, len(units)), (1 - hint_accuracy) / len(units) / n)
        joint[np.arange(n), [units.index(edge_ends(e)[1]) for e in edge_ids]] += hint_accuracy / n
        given = joint / joint.sum(axis=0)
        entropy = float(-(joint * np.log2(given, where=given > 0, out=np.zeros_like(given))).sum())
    unresolved = float(binary_entropy(alpha)) + alpha * math.log2(n - 1)
    return (entropy - unresolved) / z_channel_capacity(q)


def main() -> None:
    scale = float(os.environ.get("BENCH_SEARCH_SCALE", "1"))
    wanted = [k for k in os.environ.get("BENCH_SEARCH_CASES", "").split(",") if k]
    cases = [c for c in CASES if not wanted or c.key in wanted]
    print(f"graph {POLICY} {LAYERS} layers (67 edges), {STEPS} steps per run, seed {SEED}, "
          f"{WORKERS} processes, trial scale {scale:g}", flush=True)
    start = time.perf_counter()
    summary = {}
    print(f"  {'case':<62} {'trials':>6} {'acc':>6} {'claim':>6} {'runs p50':>8} {'p90':>6}"
          f" {'rounds p50':>10} {'p90':>6} {'inconcl':>7} {'cpu s':>6} {'start-ups':>9} {'steps':>7}"
          f" {'cost':>7}", flush=True)
    # Trials split into chunks, each its own seed offset, so the processes share the work;
    # each case prints as soon as its chunks are in.
    with ProcessPoolExecutor(WORKERS) as pool:
        futures = {}
        for case in cases:
            trials = max(4, round(case.trials * scale))
            chunks = 4 if trials >= 100 else 1
            futures[case.key] = [
                pool.submit(_chunk, (case, trials // chunks + (i < trials % chunks), SEED + 1000 * i))
                for i in range(chunks)
            ]
        for case in cases:
            results, seconds = [], 0.0
            for future in futures[case.key]:
                _, chunk, took = future.result()
                results += chunk
                seconds += took
            s = summary[case.key] = _summary(results)
            claimed = f"{s['claimed']:.3f}" if s["claimed"] is not None else "-"
            print(f"  {case.title:<62} {s['trials']:>6} {s['accuracy']:>6.3f} {claimed:>6} "
                  f"{s['runs_median']:>8.1f} {s['runs_p90']:>6.1f} {s['rounds_median']:>10.1f} "
                  f"{s['rounds_p90']:>6.1f} {s['inconclusive']:>7.3f} {seconds:>6.1f} "
                  f"{s['startups_median']:>9.1f} {s['steps_median']:>7.0f} {s['cost_median']:>7.0f}",
                  flush=True)
    print(f"\nall cases in {time.perf_counter() - start:.0f} s wall-clock\n")
    _where_the_runs_go(cases, summary)
    _segments_side_by_side(cases, summary)
    if wanted:
        if all(k in summary for k in SEGMENT_CASES):
            for ok, line in _segment_targets(summary):
                print(f"{'PASS' if ok else 'FAIL'} {line}")
        print("targets are checked on a run of every case")
        return
    for ok, line in _targets(summary):
        print(f"{'PASS' if ok else 'FAIL'} {line}")


# Protocol stages (vocab.STAGES) grouped by what they are for.
STAGE_GROUPS = {
    "localize": ("calibrate", "search", "reduce", "extra"),
    "confirm": ("leading-set", "keep-only", "drop-only", "check-off"),
    "background controls": ("background-control",),
}


def _groups(by_stage: dict) -> dict[str, float]:
    return {group: sum(by_stage.get(stage, 0.0) for stage in stages) for group, stages in STAGE_GROUPS.items()}


def _where_the_runs_go(cases: list[Case], summary: dict) -> None:
    """Mean runs per step group for the search cases, beside the information floor."""
    print("where the runs go (means): localize (the search) + confirm (keep-only, drop-only, "
          "all-off) + background controls; information floor (Fano, expected runs)")
    for case in cases:
        by_stage = summary[case.key]["by_stage"]
        if (not by_stage or case.slots > 1 or case.layers != LAYERS or len(case.culprits) != 1
                or "segments" in case.options):
            continue
        g = _groups(by_stage)
        floor = "" if case.background else f"; floor {information_floor(case.q, hint_accuracy=case.hint_accuracy):.1f}"
        print(f"  {case.title:<62} {g['localize']:6.1f} + {g['confirm']:5.1f} + "
              f"{g['background controls']:5.1f} = {sum(g.values()):6.1f}{floor}")
    print()


def _segments_side_by_side(cases: list[Case], summary: dict) -> None:
    """Start-ups, steps and cluster time per verdict (medians, the golden reference
    included), beside the information floor in steps (Fano's runs x steps a run)."""
    print("segments against one mask a run (medians): start-ups, steps, cluster time "
          "(start-ups x start-up cost + steps), wall-clock in full runs")
    for case in cases:
        if "segments" not in case.options:
            continue
        s = summary[case.key]
        floor = "" if case.background or len(case.culprits) != 1 else (
            f"; floor {information_floor(case.q) * STEPS:.0f} steps")
        print(f"  {case.title:<62} {s['startups_median']:6.1f} {s['steps_median']:8.0f} "
              f"{s['cost_median']:8.0f} {s['rounds_median']:6.1f}{floor}")
    print()


def _targets(s: dict) -> list[tuple[bool, str]]:
    out = []

    def at_most(key, figure, limit, what, note=""):
        value = s[key][figure]
        out.append((value <= limit and s[key]["accuracy"] >= 0.95,
                    f"{what}: {figure} {value:.1f} <= {limit:g}, accuracy {s[key]['accuracy']:.3f} >= 0.95{note}"))

    def runs_at_most(key, limit, what, q, hint_accuracy=None):
        # Beside the target: the floor no search reaches, and the mean runs the checks took.
        g = _groups(s[key]["by_stage"])
        at_most(key, "runs_median", limit, what,
                f" (information floor {information_floor(q, hint_accuracy=hint_accuracy):.1f} on average;"
                f" of the mean {sum(g.values()):.1f}, confirm {g['confirm']:.1f} and background controls"
                f" {g['background controls']:.1f})")

    runs_at_most("q3", 34, "no hint, q = 0.3", 0.3)
    runs_at_most("q1", 110, "no hint, q = 0.1", 0.1)
    out.append((s["pair"]["accuracy"] >= 0.95, f"pair at q = 0.3 found: accuracy {s['pair']['accuracy']:.3f} >= 0.95"))
    runs_at_most("q3-h80", 15, "hint right 80%, q = 0.3", 0.3, 0.8)
    runs_at_most("q1-h80", 45, "hint right 80%, q = 0.1", 0.1, 0.8)
    for q in ("q3", "q1"):
        limit = 1.2 * s[q]["runs_median"]
        at_most(f"{q}-h0", "runs_median", limit, f"hint always wrong, {q}: <= 1.2x the no-hint median")
    for key in ("bg", "bg-chain"):
        out.append((s[key]["accuracy"] >= 0.95,
                    f"{key}: not-prefetch in {s[key]['accuracy']:.3f} >= 0.95 of {s[key]['trials']} searches"))
    for q in ("q3", "q1"):
        out.append((True, f"cost of the background controls at {q}: median runs {s[q]['runs_median']:.1f}"
                          f" against {s[q + '-count']['runs_median']:.1f} with all_off_runs: 1"))
    out.append((s["bg-culprit"]["accuracy"] >= 0.95,
                f"p0 = 0.02 + culprit q = 0.3: accuracy {s['bg-culprit']['accuracy']:.3f} >= 0.95, "
                f"median runs {s['bg-culprit']['runs_median']:.1f}"))
    out.append((s["three"]["accuracy"] >= 0.90,
                f"three together at q = 0.3: found exactly in {s['three']['accuracy']:.3f} >= 0.90, "
                f"median runs {s['three']['runs_median']:.1f}"))
    for key, what in (("q1", "single q = 0.1"), ("pair", "pair q = 0.3")):
        out.append((s[key]["inconclusive"] <= 0.02,
                    f"default budget, {what}: inconclusive {s[key]['inconclusive']:.3f} <= 0.02"))
    for key in ("q3", "q1", "pair", "bg", "bg-chain", "bg-culprit", "q3-h80", "q3-h0", "three"):
        claimed = s[key]["claimed"]
        out.append((claimed is not None and s[key]["accuracy"] >= claimed,
                    f"calibration {key} over {s[key]['trials']} searches: accuracy {s[key]['accuracy']:.3f}"
                    f" >= claimed {claimed if claimed is None else round(claimed, 3)}"))
    out += _segment_targets(s)
    out += _several_causes_targets(s)
    for q, name in (("q3", "0.3"), ("q1", "0.1")):
        serial = s[f"{q}-s1"]
        for n, want in ((2, 1.8), (4, 3.0), (8, 5.0), (16, 7.0)):
            par = s[f"{q}-s{n}"]
            speed = serial["rounds_median"] / par["rounds_median"]
            ok = par["accuracy"] >= 0.95 and (speed >= want or q == "q1")
            out.append((ok, f"slots {n}, q = {name}: {speed:.2f}x faster than one slot (target {want}x"
                        f"{' at q = 0.3' if q == 'q1' else ''}), accuracy {par['accuracy']:.3f}"))
        ratio = s[f"{q}-s8"]["runs_median"] / serial["runs_median"]
        out.append((ratio <= 1.6 or q == "q1",
                    f"slots 8, q = {name}: runs {ratio:.2f}x the serial count (target <= 1.6 at q = 0.3)"))
    return out


def _several_causes_targets(s: dict) -> list[tuple[bool, str]]:
    """Issue 35: every cause named, at a cost against one culprit; one culprit as before."""
    out = []
    one = s["c1"]["runs_median"]
    for key, named, limit in (("c2", 0.90, 2.5), ("c3", 0.85, 4.0)):
        ratio = s[key]["runs_median"] / one
        out.append((s[key]["accuracy"] >= named and ratio <= limit,
                    f"{key}: every cause named in {s[key]['accuracy']:.3f} >= {named:g}, median runs "
                    f"{s[key]['runs_median']:.1f} = {ratio:.2f}x one culprit's (<= {limit:g}x)"))
    for key, alone in (("c1", "c1-one"), ("q3", "q3-one"), ("bg-culprit", "bg-culprit-one"),
                       ("c1-bg", "c1-bg-one")):
        ratio = s[key]["runs_median"] / s[alone]["runs_median"]
        out.append((ratio <= 1.05 and s[key]["accuracy"] >= s[alone]["accuracy"] - 0.02,
                    f"{key}: median runs {ratio:.2f}x the one-cause search's (<= 1.05), accuracy "
                    f"{s[key]['accuracy']:.3f} against {s[alone]['accuracy']:.3f}"))
    for key in ("c1", "c2", "c3", "c2-pair", "c2-bg", "c1-bg"):
        claimed = s[key]["claimed"]
        out.append((claimed is not None and s[key]["accuracy"] >= claimed,
                    f"calibration {key} over {s[key]['trials']} searches: accuracy {s[key]['accuracy']:.3f}"
                    f" >= claimed {claimed if claimed is None else round(claimed, 3)}"))
    return out


SEGMENT_CASES = [c.key for c in CASES if "segments" in c.options]


def _segment_targets(s: dict) -> list[tuple[bool, str]]:
    """Issue 25: start-ups, cluster time and steps with segments against one mask a run,
    the golden reference included, and their accuracy against what they claim."""
    out = []
    for q in ("q3", "q1"):
        for cost, limit in ((50, 0.8), (200, 0.55)):
            seg, one = s[f"{q}-seg-S{cost}"], s[f"{q}-one-S{cost}"]
            ratio = seg["cost_median"] / one["cost_median"]
            steps = seg["steps_median"] / one["steps_median"]
            line = (f"segments, {q}, start-up {cost}: start-ups {seg['startups_median']:.1f} against "
                    f"{one['startups_median']:.1f}; cluster time {ratio:.2f}x (target <= {limit}); steps "
                    f"{steps:.2f}x (target <= 1.1); accuracy {seg['accuracy']:.3f} >= claimed "
                    f"{seg['claimed']:.3f}")
            ok = ratio <= limit and steps <= 1.1 and seg["accuracy"] >= seg["claimed"]
            if q == "q3":
                ok = ok and seg["startups_median"] <= 12
                line += "; start-ups <= 12"
            out.append((ok if q == "q3" else True, line + ("" if q == "q3" else " (reported)")))
    for base, *_ in SEGMENT_BASES:
        for cost in SEGMENT_STARTUPS:
            seg, one = s[f"{base}-seg-S{cost}"], s[f"{base}-one-S{cost}"]
            out.append((seg["cost_median"] <= one["cost_median"],
                         f"segments auto, {base}, start-up {cost}: cluster time {seg['cost_median']:.0f}"
                         f" <= {one['cost_median']:.0f} with one mask a run"))
    out.append((s["bg-seg-S200"]["accuracy"] >= 0.95,
                f"segments, background 0.3: not-prefetch in {s['bg-seg-S200']['accuracy']:.3f} >= 0.95"))
    out.append((s["three-seg-S200"]["accuracy"] >= 0.90,
                f"segments, three together: found exactly in {s['three-seg-S200']['accuracy']:.3f} >= 0.90"))
    seg, one = s["q3-s8-seg"], s["q3-s8-one"]
    out.append((seg["rounds_median"] <= one["rounds_median"],
                f"slots 8, segments: wall-clock {seg['rounds_median']:.1f} full runs against "
                f"{one['rounds_median']:.1f} with one mask a run (target: no worse); start-ups "
                f"{seg['startups_median']:.1f} against {one['startups_median']:.1f}"))
    return out


if __name__ == "__main__":
    main()
