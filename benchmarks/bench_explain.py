"""Cost of the op tracer (adapters/op_trace.py, what `explain` runs) on the FSDP2 reference
workload (torchrun, gloo, CPU): targeted and full tracing beside untraced steps.

Measured side by side inside ONE job, as bench_adapter does, so that machine noise hits all
conditions alike: the job runs under the launcher's setup with a plan that traces every
step, and rotates its steps between

- ``untraced``: the tracer paused (``op_trace.paused()``): the adapter with its digests, as
  every run has it;
- ``targeted``: only the source and target units of one edge traced (what `explain` does
  for keep-only of a cause, ``op_trace.targeting``): the dispatch mode on only while they
  run (their hooks, and the autograd nodes their forward made);
- ``full``: every op of the step through the tracer (``--all-units``).

In the traced conditions each input and output is fingerprinted on the device, the step's
fingerprints move to the host in one transfer and are written, within the step.

Cases (``--case``): ``chain`` (8 layers, the default workload: the edge
bwd:layers.5->layers.4, make demo's); ``tp`` (the tensor-parallel x FSDP2 mode, 4 layers,
shard groups of size one, DTensor weights: bwd:layers.2->layers.1); ``race``
(configs/fsdp2-race.yaml's workload: 4 layers, dim 64, batch 384, 15 ms of modelled compute
a layer, asynchronous unshards: fwd:layers.1->layers.2).

Figures (rank 0, per case): median step time of each condition and each traced one's
ratio to untraced, ops traced per step, bytes written per traced step, and the flush
(transfer + write) per step. Each figure is the median over ``--repeats`` jobs. Run:
``python -m benchmarks.bench_explain [--case chain|tp|race ...] [--steps N] [--repeats N]
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

CONDITIONS = ("untraced", "targeted", "full")
WARMUP_STEPS = 2
# case -> (workload options, the edge whose units targeted tracing traces)
CASES = {
    "chain": ({"layers": 8}, "bwd:layers.5->layers.4"),
    "tp": ({"layers": 4, "tp": 2}, "bwd:layers.2->layers.1"),
    "race": ({"layers": 4, "dim": 64, "batch": 384, "compute_ms": 15.0, "async": True},
             "fwd:layers.1->layers.2"),
}


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


def worker(out: str, case: str, steps: int) -> None:
    """Inside the job: train, rotating the conditions step by step; rank 0 writes the times."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from bisect_prefetch.adapters import op_trace
    from bisect_prefetch.vocab import parse_edge_id
    from bisect_prefetch.workloads import fsdp2 as workload

    tracer = op_trace.tracer()
    if tracer is None:
        raise SystemExit("the bench worker must run under the adapter with a traced plan")
    options, edge = CASES[case]
    _, src, dst = parse_edge_id(edge)
    dim, batch, tp = options.get("dim", 32), options.get("batch", 8), options.get("tp", 1)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1234)
    model = workload.TinyTransformer(vocab=64, dim=dim, heads=2, layers=options["layers"],
                                     compute_ms=options.get("compute_ms", 0.0))
    if tp > 1:
        mesh = init_device_mesh("cpu", (world // tp, tp), mesh_dim_names=("dp_shard", "tp"))
        workload.apply_tensor_parallel(model, mesh["tp"])
        mesh = mesh["dp_shard"]
    else:
        mesh = init_device_mesh("cpu", (world,))
    workload.apply_fsdp(model, mesh)
    if options.get("async"):
        model._set_unshard_async_op(True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = workload.synthetic_batches(seed=1234, count=1, batch=batch, seq=16, vocab=64)[0]
    replicas = world // tp
    per_rank, replica = batch // replicas, rank // tp
    tokens = data[replica * per_rank:(replica + 1) * per_rank]
    figures: dict[str, list] = {c: [] for c in CONDITIONS}
    figures |= {f"{c}_{k}": [] for c in CONDITIONS[1:] for k in ("ops", "bytes", "flush_s")}
    for step in range(1, steps + 1):
        # Rotate (ABC BCA CAB ...) so that no condition always follows another.
        condition = CONDITIONS[(step + step // len(CONDITIONS)) % len(CONDITIONS)]
        ops, written, flush = tracer.ops_traced, tracer.bytes_written, tracer.seconds_flushing
        if condition == "untraced":
            scope = op_trace.paused()
        else:
            scope = op_trace.targeting((src, dst) if condition == "targeted" else None)
        started = time.perf_counter()
        with scope:
            workload.train_step(model, optimizer, tokens, two_meshes=tp > 1)
        elapsed = time.perf_counter() - started
        if step <= WARMUP_STEPS:
            continue
        figures[condition].append(elapsed)
        if condition != "untraced":
            figures[f"{condition}_ops"].append(tracer.ops_traced - ops)
            # A step's records are written at the next step's update: count them by step.
            figures[f"{condition}_bytes"].append(tracer.bytes_written - written)
            figures[f"{condition}_flush_s"].append(tracer.seconds_flushing - flush)
    if rank == 0:
        Path(out).write_text(json.dumps(figures))
    dist.destroy_process_group()


def _repeat_figures(raw: dict) -> dict:
    untraced = statistics.median(raw["untraced"]) * 1000
    figures = {"untraced_ms": untraced, "steps_per_condition": len(raw["untraced"])}
    for condition in CONDITIONS[1:]:
        traced = statistics.median(raw[condition]) * 1000
        figures |= {f"{condition}_ms": traced, f"{condition}_ratio": traced / untraced,
                    f"{condition}_ops_per_step": statistics.median(raw[f"{condition}_ops"]),
                    f"{condition}_bytes_per_step": statistics.median(raw[f"{condition}_bytes"]),
                    f"{condition}_flush_ms": statistics.median(raw[f"{condition}_flush_s"]) * 1000}
    return figures


def measure(case: str, *, steps: int, repeats: int, nproc: int, timeout: float) -> dict:
    repeated = []
    with tempfile.TemporaryDirectory(prefix="bench-explain-") as tmp:
        for i in range(repeats):
            run_dir = Path(tmp) / f"{case}-{i}"
            run_dir.mkdir()
            times = run_dir / "times.json"
            torchrun(["benchmarks.bench_explain", "--worker", str(times), "--case", case,
                      "--steps", str(steps)],
                     nproc=nproc, plan=_write_plan(run_dir, steps), timeout=timeout, cwd=REPO)
            repeated.append(_repeat_figures(json.loads(times.read_text())))
    result = {key: statistics.median(r[key] for r in repeated) for key in repeated[0]}
    return result | {"case": case, "edge": CASES[case][1], "world_size": nproc,
                     "repeats": repeats}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description="op tracer overhead on the FSDP2 workload")
    parser.add_argument("--case", action="append", choices=sorted(CASES), default=None,
                        help="workload case (repeatable; default: all)")
    parser.add_argument("--steps", type=int, default=17, help="steps of the interleaved job")
    parser.add_argument("--repeats", type=int, default=1, help="interleaved jobs (median)")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--json", default=None, help="write the figures here")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, (args.case or ["chain"])[0], args.steps)
        return {}
    results = {}
    for case in args.case or list(CASES):
        r = results[case] = measure(case, steps=args.steps, repeats=args.repeats,
                                    nproc=args.nproc, timeout=args.timeout)
        print(f"op tracer, {case} ({r['edge']}), {args.nproc} ranks ({args.repeats} job(s), "
              f"{r['steps_per_condition']:.0f} steps each way): step {r['untraced_ms']:.0f} ms "
              f"untraced; targeted {r['targeted_ms']:.0f} ms (x{r['targeted_ratio']:.2f}, "
              f"{r['targeted_ops_per_step']:.0f} ops, "
              f"{r['targeted_bytes_per_step'] / 1024:.0f} KiB a step); full "
              f"{r['full_ms']:.0f} ms (x{r['full_ratio']:.2f}, {r['full_ops_per_step']:.0f} ops, "
              f"{r['full_bytes_per_step'] / 1024:.0f} KiB, flush {r['full_flush_ms']:.1f} ms a "
              "step)", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
