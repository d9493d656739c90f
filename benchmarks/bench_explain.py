"""Cost of the op tracer (adapters/op_trace.py, what `explain` runs) on the FSDP2 reference
workload (torchrun, gloo, CPU).

Measured side by side inside ONE job, as bench_adapter does, so that machine noise hits both
conditions alike: the job runs under the launcher's setup with a plan that traces every
step, and alternates its steps between

- ``untraced``: the tracer paused (``op_trace.paused()``): the adapter with its digests, as
  every run has it;
- ``traced``: every op of the step through the tracer: each input and output fingerprinted
  on the device, the step's fingerprints moved to the host in one transfer and written.

Figures (rank 0): median step time of each, their ratio, ops traced per step, ops per second
of traced step time, bytes written per traced step, and the flush (transfer + write) per
step. The interleaved job runs ``--repeats`` times; each figure is the median over the
repeats. Run: ``python -m benchmarks.bench_explain [--layers N] [--steps N] [--repeats N]
[--json FILE]`` (defaults small enough for a shared 2-core machine).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.torchrun import REPO, torchrun

CONDITIONS = ("untraced", "traced")
WARMUP_STEPS = 2


def _write_plan(run_dir: Path, steps: int) -> Path:
    plan = {
        "version": 1, "experiment": "bench", "run_id": run_dir.name, "out_dir": str(run_dir),
        "mask": None, "guard": "none",
        "record": {"graph": True, "probe": True, "digests": "*", "digest_every": 1,
                   "order_steps": 0, "trace": {"first_step": 1, "last_step": steps}},
        "fault": None,
    }
    path = run_dir / "plan.json"
    path.write_text(json.dumps(plan))
    return path


def worker(out: str, layers: int, steps: int) -> None:
    """Inside the job: train, alternating traced and untraced steps; rank 0 writes the times."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from bisect_prefetch.adapters import op_trace
    from bisect_prefetch.workloads import fsdp2 as workload

    tracer = op_trace.tracer()
    if tracer is None:
        raise SystemExit("the bench worker must run under the adapter with a traced plan")
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1234)
    model = workload.TinyTransformer(vocab=64, dim=32, heads=2, layers=layers)
    workload.apply_fsdp(model, init_device_mesh("cpu", (world,)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    batch = workload.synthetic_batches(seed=1234, count=1, batch=8, seq=16, vocab=64)[0]
    tokens = batch[rank * (8 // world) : (rank + 1) * (8 // world)]
    figures: dict[str, list] = {"untraced": [], "traced": [], "ops": [], "bytes": [],
                                "flush_s": []}
    for step in range(1, steps + 1):
        # Alternate in pairs (AB BA ...) so that neither always follows the other.
        condition = CONDITIONS[(step + (step // 2) % 2) % 2]
        ops, written, flush = tracer.ops_traced, tracer.bytes_written, tracer.seconds_flushing
        started = time.perf_counter()
        with op_trace.paused() if condition == "untraced" else _nothing():
            workload.train_step(model, optimizer, tokens)
        elapsed = time.perf_counter() - started
        if step <= WARMUP_STEPS:
            continue
        figures[condition].append(elapsed)
        if condition == "traced":
            figures["ops"].append(tracer.ops_traced - ops)
            # A step's records are written at the next step's update: count them by step.
            figures["bytes"].append(tracer.bytes_written - written)
            figures["flush_s"].append(tracer.seconds_flushing - flush)
    if rank == 0:
        Path(out).write_text(json.dumps(figures))
    dist.destroy_process_group()


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _repeat_figures(raw: dict) -> dict:
    untraced = statistics.median(raw["untraced"]) * 1000
    traced = statistics.median(raw["traced"]) * 1000
    ops = statistics.median(raw["ops"])
    return {"untraced_ms": untraced, "traced_ms": traced, "ratio": traced / untraced,
            "ops_per_step": ops, "ops_per_s": ops / (traced / 1000),
            "bytes_per_step": statistics.median(raw["bytes"]),
            "flush_ms": statistics.median(raw["flush_s"]) * 1000,
            "steps_per_condition": len(raw["traced"])}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description="op tracer overhead on the FSDP2 workload")
    parser.add_argument("--steps", type=int, default=14, help="steps of the interleaved job")
    parser.add_argument("--repeats", type=int, default=1, help="interleaved jobs (median)")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--json", default=None, help="write the figures here")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.layers, args.steps)
        return {}
    repeats = []
    with tempfile.TemporaryDirectory(prefix="bench-explain-") as tmp:
        for i in range(args.repeats):
            run_dir = Path(tmp) / f"interleaved-{i}"
            run_dir.mkdir()
            times = run_dir / "times.json"
            torchrun(["benchmarks.bench_explain", "--worker", str(times), "--layers",
                      str(args.layers), "--steps", str(args.steps)],
                     nproc=args.nproc, plan=_write_plan(run_dir, args.steps),
                     timeout=args.timeout, cwd=REPO)
            repeats.append(_repeat_figures(json.loads(times.read_text())))
    result = {key: statistics.median(r[key] for r in repeats) for key in repeats[0]}
    result |= {"layers": args.layers, "world_size": args.nproc, "repeats": args.repeats}
    print(f"op tracer, FSDP2 {args.layers} layers, {args.nproc} ranks ({args.repeats} job(s), "
          f"{result['steps_per_condition']:.0f} steps each way): step {result['untraced_ms']:.0f} ms "
          f"untraced, {result['traced_ms']:.0f} ms traced (x{result['ratio']:.2f}); "
          f"{result['ops_per_step']:.0f} ops a step, {result['ops_per_s']:.0f} ops/s traced; "
          f"{result['bytes_per_step'] / 1024:.0f} KiB written a step; flush "
          f"{result['flush_ms']:.1f} ms a step", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
