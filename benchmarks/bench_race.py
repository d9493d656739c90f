"""The race workload's per-run chance of drift without and with stress, side by side.

configs/fsdp2-race.yaml (real torch FSDP2, 2 ranks over gloo, 4 layers; the copy-out of
the all-gather that fwd:layers.1->layers.2 prefetched skips its wait) runs all-on
through the tool's own Runner, without stress and with it, interleaved so both meet
the same machine load; each run is compared with one golden all-off run (the racing
edge does not fire there) and stops at its first differing digest. Then the same
workload without the fault (asynchronous unshards with every wait in place) runs A/A
without and with stress against its own reference: every run must be bitwise
identical (digests).

Printed: per setting, runs, divergences, the per-run chance (95% Clopper-Pearson
interval), the median first differing step, the median step time; the A/A counts; and
what a bisection of the 7 edges would cost at these figures (simulate, same seeds),
in runs x steps, with and without stress. Then three real bisections of the same
experiment side by side, `--stress off` (at most ``--bisect-max-runs`` trials),
`--stress auto` (its calibration stops once the pairs settle it) and `--stress auto`
with the fixed calibration it had before (4 pairs whatever they show; selectable here
only): verdict, confidence, trials, calibration pairs, and the training steps every run
they launched took (golden, calibration and discovery runs included: the cluster's
cost); each auto's ratio to off where both named the racing edge, or an upper bound
where the unstressed one ran out of runs. The machine's load average is printed: timing decides a race.

Run: ``python -m benchmarks.bench_race [--runs N] [--stress-runs N] [--aa-runs N]
[--config FILE] [--compute-ms MS] [--bisect-max-runs N] [--bisections off,auto,auto-fixed]
[--json FILE]`` (``--compute-ms`` overrides the
config's ``workload.compute_ms``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import yaml

from bisect_prefetch.cli import main as cli_main
from bisect_prefetch.commands import bisect as bisect_command
from bisect_prefetch.experiment import load_experiment, with_overrides
from bisect_prefetch.runs.execute import Runner
from bisect_prefetch.runs.store import StateDir
from bisect_prefetch.search.stats import clopper_pearson
from bisect_prefetch.search.stress import FIXED_PAIRS, SEQUENTIAL, CalibrationRule, Hazard
from bisect_prefetch.simulation.trials import simulate
from bisect_prefetch.vocab import Mask

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "fsdp2-race.yaml"
RACING_EDGE = "fwd:layers.1->layers.2"
BISECTIONS = ("off", "auto", "auto-fixed")  # auto-fixed: --stress auto, the 4-pair calibration


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _experiment(config: Path, compute_ms: float | None):
    experiment = load_experiment(config)
    if compute_ms is not None:
        experiment = with_overrides(experiment, {"workload.compute_ms": compute_ms})
    return experiment


def race(runs: int, stress_runs: int, *, config: Path = CONFIG,
         compute_ms: float | None = None) -> dict:
    experiment = _experiment(config, compute_ms)
    steps = experiment.steps
    outcomes: dict[bool, list] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp, StateDir(tmp, experiment.name) as state:
        runner = Runner(experiment, state).open()
        golden = runner.run(runner.key("golden", mask=Mask(), guard="none", steps=steps, index=0),
                            label="golden")
        if not golden.usable:
            raise SystemExit(f"golden run {golden.run_id}: {golden.outcome} ({golden.reason})")
        counts = {False: runs, True: stress_runs}
        index = 0
        while any(len(outcomes[on]) < counts[on] for on in (False, True)):
            for on in (False, True):  # interleaved: both settings meet the same load
                if len(outcomes[on]) >= counts[on]:
                    continue
                key = runner.key("race", mask=None, guard="none", steps=steps, index=index,
                                 stress=on)
                out = runner.run(key, label=f"race-{'on' if on else 'off'}",
                                 reference=golden.run_id)
                outcomes[on].append(out)
                print(f"  stress {'on ' if on else 'off'} run {len(outcomes[on]):>3}: "
                      + (f"diverged at step {out.first_diff_step}" if out.usable and out.diverged
                         else "clean" if out.usable else f"{out.outcome} ({out.reason[:80]})"),
                      flush=True)
            index += 1
    figures = {}
    for on, outs in outcomes.items():
        usable = [o for o in outs if o.usable]
        diverged = [o for o in usable if o.diverged]
        low, high = clopper_pearson(len(diverged), len(usable)) if usable else (0.0, 1.0)
        hazard = Hazard.of([o.first_diff_step if o.diverged else None for o in usable], steps=steps)
        figures["with" if on else "without"] = {
            "runs": len(usable), "failed": len(outs) - len(usable), "divergences": len(diverged),
            "per_run_chance": len(diverged) / len(usable) if usable else None,
            "interval": [low, high], "hazard_per_step": hazard.mean,
            "hazard_interval": list(hazard.interval()),
            "first_diff_step_median": _median([o.first_diff_step for o in diverged]),
            "step_time_ms_median": _median([o.step_time_ms for o in usable if o.step_time_ms]),
        }
    return figures


def aa_without_fault(runs: int, *, config: Path = CONFIG,
                     compute_ms: float | None = None) -> dict:
    """The race workload without its fault: A/A without and with stress, bitwise identical."""
    experiment = _experiment(config, compute_ms)
    experiment = with_overrides(experiment, {"workload.fault": None,
                                             "workload.async_unshard": True,
                                             "name": "fsdp2-async"})
    identical = {False: 0, True: 0}
    total = {False: 0, True: 0}
    with tempfile.TemporaryDirectory() as tmp, StateDir(tmp, experiment.name) as state:
        runner = Runner(experiment, state).open()
        steps = experiment.steps
        reference = runner.run(runner.key("ref", mask=None, guard="none", steps=steps, index=0),
                               label="ref")
        for index in range(runs):
            on = index % 2 == 1
            out = runner.run(runner.key("aa", mask=None, guard="none", steps=steps, index=index,
                                        stress=on), label="aa", reference=reference.run_id)
            total[on] += 1
            identical[on] += int(out.usable and not out.diverged)
    return {"without": [identical[False], total[False]], "with": [identical[True], total[True]]}


def bisect_cost(figures: dict) -> dict | None:
    """A bisection of the 7 edges at the measured hazards (simulate, same seeds).

    Without a divergence without stress, the unstressed search is simulated at the top of
    that hazard's 95% posterior interval (the cheapest it plausibly is): the ratio is then
    an upper bound (``bound``).
    """
    without, with_ = figures["without"], figures["with"]
    if not with_["divergences"]:
        return None
    bound = not without["divergences"]
    hazard = without["hazard_interval"][1] if bound else without["hazard_per_step"]
    cost = ((with_["step_time_ms_median"] or 1.0) / (without["step_time_ms_median"] or 1.0))
    result = simulate("fsdp2-chain", 4, [RACING_EDGE], hazard=hazard,
                      steps=20, trials=40, seed=0,
                      stress_factor=with_["hazard_per_step"] / hazard,
                      stress_cost=max(cost, 1.0))["stress"]
    return {"runs_x_steps_without": result["steps_median_without"],
            "runs_x_steps_with": result["steps_median_with"],
            "ratio": result["steps_median_with"] / result["steps_median_without"],
            "step_cost": cost, "bound": bound, "hazard_without": hazard,
            "accuracy_without": result["accuracy_without"],
            "accuracy_with": result["accuracy_with"]}


def real_bisect(config: Path, compute_ms: float | None, stress: str,
                max_runs: int | None, calibration: CalibrationRule = SEQUENTIAL) -> dict:
    """`bisect-prefetch bisect CONFIG --stress STRESS` as a user runs it, in a fresh state
    dir; its verdict and every training step its runs took (from its journal).
    calibration: the stress calibration's stopping rule (the command's own, or the fixed
    one it had before: no option of the command, so it is set on its module here)."""
    bisect_command.STRESS_CALIBRATION = calibration
    try:
        return _real_bisect(config, compute_ms, stress, max_runs)
    finally:
        bisect_command.STRESS_CALIBRATION = SEQUENTIAL


def _real_bisect(config: Path, compute_ms: float | None, stress: str,
                 max_runs: int | None) -> dict:
    spec = yaml.safe_load(config.read_text())
    if compute_ms is not None:
        spec["workload"]["compute_ms"] = compute_ms
    with tempfile.TemporaryDirectory() as tmp:
        path, out, state_dir = Path(tmp) / "race.yaml", Path(tmp) / "bisect.json", Path(tmp) / "state"
        path.write_text(yaml.safe_dump(spec))
        start = time.perf_counter()
        cli_main(["bisect", str(path), "--stress", stress, "--state-dir", str(state_dir),
                  "--json", str(out)] + (["--max-runs", str(max_runs)] if max_runs else []))
        wall = time.perf_counter() - start
        data = json.loads(out.read_text())
        with StateDir(state_dir, spec["name"]) as state:
            records = state.records()
    return {"verdict": data["verdict"], "minimal_set": data["minimal_set"],
            "confidence": data["confidence"], "trials": data["runs_used"],
            "runs_launched": len(records),
            "runs_x_steps": sum(r.get("steps_done", 0) for r in records),
            "wall_s": round(wall, 1), "stress_used": data["stress"].get("used"),
            "calibration_pairs": (data["stress"]["chance_with"] or {}).get("runs")}


def bisect_side_by_side(config: Path, compute_ms: float | None, max_runs_off: int,
                        which: tuple[str, ...] = BISECTIONS) -> dict:
    """The real bisections (`which` of BISECTIONS) and each auto's ratio of runs x steps to
    off where it means something: both named the racing edge, or the unstressed one ran
    out of runs (inconclusive: its cost is a floor on what naming the edge takes, so the
    ratio is an upper bound, "bound"). An unstressed search that said no-drift-reproduced
    missed the race: no ratio."""
    rules = {"auto": SEQUENTIAL, "auto-fixed": FIXED_PAIRS}
    out = {}
    if "off" in which:
        out["off"] = real_bisect(config, compute_ms, "off", max_runs_off)
    for name in (n for n in which if n in rules):
        auto = out[name] = real_bisect(config, compute_ms, "auto", None, rules[name])
        off = out.get("off")
        named = auto["minimal_set"] == [RACING_EDGE]
        off_named = off is not None and off["minimal_set"] == [RACING_EDGE]
        bound = named and off is not None and not off_named and off["verdict"] == "inconclusive"
        out[f"{name}_ratio"] = (auto["runs_x_steps"] / off["runs_x_steps"]
                                if named and (off_named or bound) else None)
        out[f"{name}_bound"] = bound
    return out


def _bisect_words(name: str, b: dict) -> str:
    found = ",".join(b["minimal_set"]) or "-"
    return (f"bisect --stress {name:<10}: {b['verdict']} {found}, confidence {b['confidence']:.3f}, "
            f"{b['trials']} trials, {b['runs_launched']} runs launched, "
            + (f"{b['calibration_pairs']} calibration pairs, " if b["calibration_pairs"] else "")
            + f"{b['runs_x_steps']} runs x steps, {b['wall_s']:.0f} s")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=60, help="runs without stress")
    parser.add_argument("--stress-runs", type=int, default=30, help="runs with stress")
    parser.add_argument("--aa-runs", type=int, default=8,
                        help="A/A runs without the fault (half with stress)")
    parser.add_argument("--config", type=Path, default=CONFIG, help="the race experiment")
    parser.add_argument("--compute-ms", type=float, default=None,
                        help="override workload.compute_ms (ms each layer's forward sleeps)")
    parser.add_argument("--bisect-max-runs", type=int, default=40,
                        help="trials for the real unstressed bisection (0: no real bisections)")
    parser.add_argument("--bisections", default=",".join(BISECTIONS),
                        help=f"which real bisections, of {','.join(BISECTIONS)}")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    compute_ms = _experiment(args.config, args.compute_ms).workload.compute_ms
    load = os.getloadavg()
    print(f"race workload {args.config.name}, compute_ms {compute_ms:g}, {os.cpu_count()} "
          f"CPU(s), load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}", flush=True)
    figures = race(args.runs, args.stress_runs, config=args.config, compute_ms=args.compute_ms)
    for name, f in figures.items():
        chance = "-" if f["per_run_chance"] is None else f"{f['per_run_chance']:.2f}"
        print(f"{name + ' stress':<15} {f['divergences']:>3} of {f['runs']:>3} runs diverged: "
              f"per-run chance {chance} (95% {f['interval'][0]:.2f}-{f['interval'][1]:.2f}), "
              f"median first differing step {f['first_diff_step_median']}, "
              f"median step time {f['step_time_ms_median'] or 0:.0f} ms"
              + (f", {f['failed']} failed" if f["failed"] else ""), flush=True)
    figures["compute_ms"] = compute_ms
    figures["aa_without_fault"] = aa = aa_without_fault(args.aa_runs, config=args.config,
                                                        compute_ms=args.compute_ms)
    print(f"A/A without the fault: {aa['without'][0]} of {aa['without'][1]} runs bitwise "
          f"identical without stress, {aa['with'][0]} of {aa['with'][1]} with", flush=True)
    figures["bisect"] = cost = bisect_cost(figures)
    if cost is not None:
        print(f"bisect at these figures (simulate, 40 searches): runs x steps median "
              f"{cost['runs_x_steps_without']:g} without stress, {cost['runs_x_steps_with']:g} "
              f"with (x{cost['ratio']:.2f}"
              + (f" at most: no divergence without stress, simulated at its 95% upper hazard "
                 f"{cost['hazard_without']:.4f}" if cost["bound"] else "")
              + f"); step time x{cost['step_cost']:.2f}; accuracy "
              f"{cost['accuracy_without']:.2f} / {cost['accuracy_with']:.2f}", flush=True)
    if args.bisect_max_runs:
        which = tuple(n for n in args.bisections.split(",") if n in BISECTIONS)
        print(f"real bisections side by side: {', '.join(which)} (auto-fixed: --stress auto "
              "with the fixed calibration of 4 pairs)", flush=True)
        figures["real_bisect"] = real = bisect_side_by_side(args.config, args.compute_ms,
                                                            args.bisect_max_runs, which)
        for name in which:
            print(_bisect_words(name, real[name]), flush=True)
        for name in (n for n in which if n != "off" and "off" in which):
            if real[f"{name}_ratio"] is not None:
                print(f"real bisect runs x steps, {name} against off: x{real[f'{name}_ratio']:.2f}"
                      + (" at most (--stress off ran out of runs)" if real[f"{name}_bound"] else ""),
                      flush=True)
            else:
                print(f"no ratio for {name}: --stress off said {real['off']['verdict']}, "
                      f"{name} {real[name]['verdict']} {','.join(real[name]['minimal_set'])}".rstrip(),
                      flush=True)
        if "auto" in which and "auto-fixed" in which:
            print(f"runs x steps, auto against auto-fixed: {real['auto']['runs_x_steps']} against "
                  f"{real['auto-fixed']['runs_x_steps']}", flush=True)
    figures["load_average"] = [round(x, 2) for x in (load, os.getloadavg())[1]]
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
