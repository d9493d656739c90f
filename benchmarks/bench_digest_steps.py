"""Steps used with gradient digests against metrics only, on the real FSDP2 demo.

The demo is configs/fsdp2-fault.yaml (8 layers, 2 ranks, 30 steps, a planted one-ulp fault
with hazard 0.05). K full-length runs plus a golden one record digests and metrics; for each
run, the first step where its digests differ from the golden run's and the first where its
metrics do: as logged (full precision, jsonl) and as printed with 5 decimals (what a console
log or a 5-decimal comparison sees). Under live stop a run costs its first differing step, or
all its steps when it stays clean, so

    steps used = sum over runs of (first differing step, else the run's length)

for each signal. The same runs are measured every way (paired), so the random divergence
times cancel out of the ratios. Run: ``python -m benchmarks.bench_digest_steps [--runs K]``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.bench_adapter import _torchrun
from bisect_prefetch.experiment import load_experiment
from bisect_prefetch.metrics.digests import compare_digest_files
from bisect_prefetch.metrics.loading import load_run
from bisect_prefetch.runs.plan import build_plan, write_plan

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "configs" / "fsdp2-fault.yaml"
PRINTED_DECIMALS = 5


def _first_metric_diff(a, b, names: list[str], decimals: int | None) -> int | None:
    """First step where any rank's metric differs (values rounded to `decimals`, if given)."""
    first = None
    for rank, metrics in a.per_rank.items():
        for name in names:
            sa, sb = metrics.get(name), b.per_rank.get(rank, {}).get(name)
            if sa is None or sb is None:
                continue
            steps, ia, ib = np.intersect1d(sa.steps, sb.steps, return_indices=True)
            va, vb = sa.values[ia], sb.values[ib]
            if decimals is not None:
                va, vb = np.round(va, decimals), np.round(vb, decimals)
            differ = np.nonzero(~((va == vb) | (np.isnan(va) & np.isnan(vb))))[0]
            if len(differ) and (first is None or steps[differ[0]] < first):
                first = int(steps[differ[0]])
    return first


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description="steps used: digests vs metrics, FSDP2 demo")
    parser.add_argument("--runs", type=int, default=6, help="runs compared with the golden one")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args(argv)
    args.nproc = None  # set from the experiment below (bench_adapter's _torchrun reads it)

    experiment = load_experiment(DEMO)
    steps, names = experiment.steps, list(experiment.metrics.names)
    args.nproc = experiment.workload.world_size
    workload_args = ["bisect_prefetch.workloads.fsdp2", "--layers", str(experiment.workload.layers),
                     "--steps", str(steps), "--seed", str(experiment.seed)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-digest-steps-") as tmp:
        dirs = []
        for k in range(args.runs + 1):
            run_dir = Path(tmp) / f"run-{k}"
            run_dir.mkdir()
            plan = build_plan(experiment=experiment, run_id=run_dir.name, out_dir=run_dir,
                              mask=None, guard="none", steps=steps)
            print(f"run {k}/{args.runs} ({'golden' if k == 0 else 'compared'})...", flush=True)
            _torchrun(run_dir, workload_args, plan=write_plan(run_dir, plan), args=args)
            dirs.append(run_dir)
        golden = load_run(dirs[0], "jsonl", names)
        for run_dir in dirs[1:]:
            run = load_run(run_dir, "jsonl", names)
            digests = compare_digest_files(dirs[0] / "digests.jsonl", run_dir / "digests.jsonl")
            rows.append({
                "digests": digests.first_diff_step,
                "metrics": _first_metric_diff(golden, run, names, None),
                "printed": _first_metric_diff(golden, run, names, PRINTED_DECIMALS),
            })

    def used(signal: str) -> int:
        return sum(row[signal] if row[signal] is not None else steps for row in rows)

    result = {
        "experiment": str(DEMO.relative_to(REPO)),
        "runs": len(rows),
        "steps_per_run": steps,
        "first_diff_steps": rows,
        "steps_used": {signal: used(signal) for signal in ("digests", "metrics", "printed")},
        "diverged": {signal: sum(row[signal] is not None for row in rows)
                     for signal in ("digests", "metrics", "printed")},
    }
    result["steps_ratio_digests_vs_metrics"] = result["steps_used"]["digests"] / used("metrics")
    result["steps_ratio_digests_vs_printed"] = result["steps_used"]["digests"] / used("printed")
    for row in rows:
        print(f"  first differing step: digests {row['digests']}, metrics {row['metrics']}, "
              f"printed ({PRINTED_DECIMALS} decimals) {row['printed']}")
    print(f"steps used over {len(rows)} runs of {steps} steps (live stop at the first difference): "
          + ", ".join(f"{s} {n}" for s, n in result["steps_used"].items()))
    print(f"ratio digests / metrics (full precision): {result['steps_ratio_digests_vs_metrics']:.2f}; "
          f"digests / printed ({PRINTED_DECIMALS} decimals): "
          f"{result['steps_ratio_digests_vs_printed']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
