"""Cost of the in-process adapter on the FSDP2 reference workload (torchrun, gloo, CPU).

Step overhead is measured side by side inside ONE job, so that machine noise
(other jobs on a shared box easily move step times by 2x between runs) hits
every condition alike. The job runs under the launcher's setup (sitecustomize,
plan with a mask that enables every edge, probe on) and cycles its steps
through all orders of three conditions:

- ``off``: adapter paused (``fsdp2.paused()``: the patched FSDP2 methods pass
  straight through, no report_step), i.e. the workload without the adapter;
- ``on``: mask + probe on every prefetch, report_step (metrics line, probe rewrite);
- ``digests``: as ``on``, plus the digests of every parameter's gradient and value
  (adapters/digest.py), as the optimizer step pre-hook takes them in a zero-touch job.

Overhead = median(on) / median(off) - 1; the digests' extra cost is reported
on top of ``on``, both for wall time and for the CPU time of rank 0's step
thread (which a loaded machine disturbs less). The digests are also timed
directly: the CPU time of taking and writing them in each ``digests`` step,
against the median CPU time of an ``on`` step (a difference of two medians
moves by a few percent on a shared machine; the direct time does not). The
interleaved job runs ``--repeats`` times; each figure is the median over the
repeats, each repeat's own figure a median over its steps.

Start-up (launch to the first step) and its share of a ``--startup-steps`` run
come from whole jobs with and without the adapter, alternated.

The digests' xor before torch 2.9 (no ``torch.hash_tensor``: adapters/torch_digest.py folds
halves in plain tensor ops instead) is timed side by side with hash_tensor on this torch, in
one process: a step's digests of one rank of the workload (each parameter's local shard of 2
ranks, gradient and value, as ``TensorBatch`` takes them), and of 8 large float32 tensors of
4M elements (where the cost is per byte, not per op; a tenth of the rounds), alternating the
two, medians of the thread's CPU time. ``--digest-fallback-only`` runs this part alone.
Run: ``python -m benchmarks.bench_adapter [--repeats N] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.torchrun import REPO, torchrun

CONDITIONS = ("off", "on", "digests")
WARMUP_STEPS = 3  # with the adapter on: discovery happens in the first step


def _write_plan(run_dir: Path, *, mask: list[str] | None) -> Path:
    plan = {
        "version": 1,
        "experiment": "bench",
        "run_id": run_dir.name,
        "out_dir": str(run_dir),
        "mask": mask,
        "guard": "none",
        "record": {"graph": True, "probe": True, "digests": None, "digest_every": 1},
        "fault": None,
    }
    path = run_dir / "plan.json"
    path.write_text(json.dumps(plan))
    return path


def _torchrun(
    run_dir: Path, module_args: list[str], *, plan: Path | None, args: argparse.Namespace
) -> float:
    """Run one job under torchrun in its own process group; returns its launch time."""
    run_dir.mkdir(parents=True, exist_ok=True)
    return torchrun(module_args, nproc=args.nproc, plan=plan, timeout=args.timeout, cwd=REPO)[0]


def _startup_run(run_dir: Path, *, plan: Path | None, args: argparse.Namespace) -> dict:
    timings = run_dir / "timings.json"
    workload = [
        "bisect_prefetch.workloads.fsdp2", "--layers", str(args.layers),
        "--steps", str(args.startup_steps), "--seed", "1234", "--timings", str(timings),
    ]  # fmt: skip
    launched = _torchrun(run_dir, workload, plan=plan, args=args)
    wall = time.time() - launched
    startup = json.loads(timings.read_text())["first_step_start"] - launched
    return {"startup_s": startup, "wall_s": wall}


def worker(out: str, layers: int, steps: int) -> None:
    """Inside the job: train, cycling steps through the conditions; rank 0 writes the times."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from bisect_prefetch import adapters
    from bisect_prefetch.adapters import fsdp2 as fsdp2_adapter
    from bisect_prefetch.workloads import fsdp2 as workload

    if fsdp2_adapter.adapter() is None:
        raise SystemExit("the bench worker must run under the adapter (sitecustomize + plan)")
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

    # Every order of the conditions in turn, so none always follows another.
    schedule = itertools.cycle(c for order in itertools.permutations(CONDITIONS) for c in order)
    times: dict[str, list[float]] = {c: [] for c in CONDITIONS}
    cpu_times: dict[str, list[float]] = {c: [] for c in CONDITIONS}
    digest_cpu: list[float] = []  # the digests alone, in each digests step
    for step in range(1, steps + 1):
        condition = "on" if step <= WARMUP_STEPS else next(schedule)
        started, cpu_started = time.perf_counter(), time.thread_time()
        paused = fsdp2_adapter.paused() if condition == "off" else contextlib.nullcontext()
        with paused:
            loss, grad_norm = workload.train_step(model, optimizer, tokens)
        if condition != "off":
            adapters.report_step(step, loss=loss, grad_norm=grad_norm)
        if condition == "digests":
            digest_started = time.thread_time()
            adapter = fsdp2_adapter.adapter()
            adapter.session.recorder.digest_columns(step, *adapter.tensor_digests("*", step))
            if step > WARMUP_STEPS:
                digest_cpu.append(time.thread_time() - digest_started)
        if step > WARMUP_STEPS:
            times[condition].append(time.perf_counter() - started)
            cpu_times[condition].append(time.thread_time() - cpu_started)
    if rank == 0:
        figures = {"wall": times, "cpu": cpu_times, "digest_cpu": digest_cpu}
        Path(out).write_text(json.dumps(figures))
    dist.destroy_process_group()


def digest_fallback(layers: int, rounds: int) -> dict:
    """CPU ms of a step's digests with torch.hash_tensor's xor and with the fallback's."""
    import torch

    from bisect_prefetch.adapters.torch_digest import (
        TensorBatch,
        xor_by_folding,
        xor_by_hash_tensor,
    )
    from bisect_prefetch.workloads import fsdp2 as workload

    torch.set_num_threads(1)
    torch.manual_seed(1234)
    model = workload.TinyTransformer(vocab=64, dim=32, heads=2, layers=layers)
    shards = [p.detach().chunk(2, dim=0)[0].contiguous() for p in model.parameters()]
    cases = {  # the tensors, and how many times each way (a large step takes ~0.1-0.3 s)
        "workload_rank": ([*shards, *(torch.randn_like(s) for s in shards)], rounds),
        "large_8x4M": ([torch.randn(4 << 20) for _ in range(8)], max(5, rounds // 10)),
    }
    xors = {"hash_tensor": xor_by_hash_tensor, "fallback": xor_by_folding}
    figures = {}
    for case, (tensors, times_each) in cases.items():
        names = [f"t{k}" for k in range(len(tensors))]
        batches = {how: TensorBatch(names, tensors, xor=xor) for how, xor in xors.items()}
        assert batches["fallback"].measure(tensors)[1] == batches["hash_tensor"].measure(tensors)[1]
        times: dict[str, list[float]] = {how: [] for how in xors}
        for k in range(times_each):
            for how in (("hash_tensor", "fallback") if k % 2 == 0 else ("fallback", "hash_tensor")):
                started = time.thread_time()
                batches[how].measure(tensors)
                times[how].append(1000 * (time.thread_time() - started))
        medians = {how: statistics.median(t) for how, t in times.items()}
        figures[case] = {"tensors": len(tensors), "elements": sum(t.numel() for t in tensors),
                         "rounds": times_each, "median_cpu_ms": medians,
                         "ratio": medians["fallback"] / medians["hash_tensor"]}
    return figures


def _say_digest_fallback(figures: dict) -> None:
    for case, f in figures.items():
        ms = f["median_cpu_ms"]
        print(f"digests without torch.hash_tensor ({case}, {f['tensors']} tensors, "
              f"{f['elements']:,} elements): {ms['fallback']:.3f} ms CPU against "
              f"{ms['hash_tensor']:.3f} ms with it (x{f['ratio']:.2f}, medians)", flush=True)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description="adapter overhead on the FSDP2 workload")
    parser.add_argument("--steps", type=int, default=183, help="steps of the interleaved job")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved jobs (figures: median)")
    parser.add_argument("--startup-rounds", type=int, default=3)
    parser.add_argument("--startup-steps", type=int, default=20)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--json", default=None, help="write the figures here")
    parser.add_argument("--digest-rounds", type=int, default=200,
                        help="digests timed each way (figures: medians)")
    parser.add_argument("--digest-fallback-only", action="store_true",
                        help="only the digests' xor with and without torch.hash_tensor")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.layers, args.steps)
        return {}
    print("digests with and without torch.hash_tensor, side by side...", flush=True)
    fallback = digest_fallback(args.layers, args.digest_rounds)
    _say_digest_fallback(fallback)
    if args.digest_fallback_only:
        if args.json:
            Path(args.json).write_text(json.dumps({"digest_fallback": fallback}, indent=1))
        return {"digest_fallback": fallback}

    with tempfile.TemporaryDirectory(prefix="bench-adapter-") as tmp:
        root = Path(tmp)
        print("start-up: whole jobs with and without the adapter, alternated...", flush=True)
        startup: dict[str, list[dict]] = {"bare": [], "adapter": []}
        for i in range(args.startup_rounds):
            for name in ("bare", "adapter") if i % 2 == 0 else ("adapter", "bare"):
                run_dir = root / f"{name}-{i}"
                run_dir.mkdir()
                plan = _write_plan(run_dir, mask=None) if name == "adapter" else None
                startup[name].append(_startup_run(run_dir, plan=plan, args=args))
        graph = json.loads((root / "adapter-0" / "graph.rank0.json").read_text())
        mask = [edge["id"] for edge in graph["edges"]]

        print(f"step time: {args.repeats} jobs, {args.steps} steps each cycling {CONDITIONS}...",
              flush=True)
        repeats = []
        for i in range(args.repeats):
            run_dir = root / f"interleaved-{i}"
            run_dir.mkdir()
            times_path = run_dir / "times.json"
            worker_args = [
                "benchmarks.bench_adapter", "--worker", str(times_path),
                "--layers", str(args.layers), "--steps", str(args.steps),
            ]  # fmt: skip
            _torchrun(run_dir, worker_args, plan=_write_plan(run_dir, mask=mask), args=args)
            repeats.append(_repeat_figures(json.loads(times_path.read_text())))
            last = repeats[-1]
            print(f"  job {i + 1}: digests {last['digests_cpu_pct']:+.2f}% of a step's CPU "
                  f"(difference of medians: {last['digests_extra_cpu_pct']:+.2f}%)", flush=True)

    def median_of(key: str) -> float:
        return statistics.median(r[key] for r in repeats)

    median_ms = {c: statistics.median(r["step_ms"][c] for r in repeats) for c in CONDITIONS}
    cpu_ms = {c: statistics.median(r["step_cpu_ms"][c] for r in repeats) for c in CONDITIONS}
    startup_figures = {
        name: {
            "startup_s": statistics.median(r["startup_s"] for r in runs),
            "wall_s": statistics.median(r["wall_s"] for r in runs),
            "startup_share": statistics.median(r["startup_s"] / r["wall_s"] for r in runs),
        }
        for name, runs in startup.items()
    }
    result = {
        "layers": args.layers,
        "world_size": args.nproc,
        "edges_in_mask": len(mask),
        "median_step_ms": median_ms,
        "median_step_cpu_ms": cpu_ms,
        "repeats": args.repeats,
        "steps_per_condition": repeats[0]["steps_per_condition"],
        "adapter_overhead_pct": median_of("adapter_overhead_pct"),
        "digests_extra_pct": median_of("digests_extra_pct"),
        "adapter_overhead_cpu_pct": median_of("adapter_overhead_cpu_pct"),
        "digests_extra_cpu_pct": median_of("digests_extra_cpu_pct"),
        "digest_cpu_ms": median_of("digest_cpu_ms"),
        "digests_cpu_pct": median_of("digests_cpu_pct"),
        "per_repeat": repeats,
        "startup": startup_figures,
        "startup_steps": args.startup_steps,
        "digest_fallback": fallback,
    }

    print("\nmedian step (ms): " + ", ".join(f"{c} {m:.2f}" for c, m in median_ms.items()))
    print("median step CPU (ms): " + ", ".join(f"{c} {m:.2f}" for c, m in cpu_ms.items()))
    print(
        f"adapter overhead (mask + probe): {result['adapter_overhead_pct']:+.2f}% per step "
        f"(CPU of rank 0's step: {result['adapter_overhead_cpu_pct']:+.2f}%)"
    )
    print(
        f"digests, extra on top:           {result['digests_extra_pct']:+.2f}% per step "
        f"(CPU: {result['digests_extra_cpu_pct']:+.2f}%)"
    )
    print(
        f"digests, timed directly:         {result['digest_cpu_ms']:.3f} ms CPU a step, "
        f"{result['digests_cpu_pct']:+.2f}% of an 'on' step's CPU "
        f"(median of {args.repeats} jobs: "
        + ", ".join(f"{r['digests_cpu_pct']:+.2f}%" for r in repeats) + ")"
    )
    _say_digest_fallback(fallback)
    for name, f in startup_figures.items():
        print(
            f"start-up {name:<8} {f['startup_s']:.2f} s before the first step, "
            f"{100 * f['startup_share']:.0f}% of a {args.startup_steps}-step run "
            f"({f['wall_s']:.2f} s)"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return result


def _repeat_figures(times: dict) -> dict:
    """One interleaved job's figures: medians over its steps, per condition."""
    step_ms = {c: 1000 * statistics.median(times["wall"][c]) for c in CONDITIONS}
    cpu_ms = {c: 1000 * statistics.median(times["cpu"][c]) for c in CONDITIONS}
    digest_cpu_ms = 1000 * statistics.median(times["digest_cpu"])
    return {
        "step_ms": step_ms,
        "step_cpu_ms": cpu_ms,
        "steps_per_condition": {c: len(times["wall"][c]) for c in CONDITIONS},
        "adapter_overhead_pct": 100 * (step_ms["on"] / step_ms["off"] - 1),
        "digests_extra_pct": 100 * (step_ms["digests"] - step_ms["on"]) / step_ms["off"],
        "adapter_overhead_cpu_pct": 100 * (cpu_ms["on"] / cpu_ms["off"] - 1),
        "digests_extra_cpu_pct": 100 * (cpu_ms["digests"] - cpu_ms["on"]) / cpu_ms["off"],
        "digest_cpu_ms": digest_cpu_ms,
        "digests_cpu_pct": 100 * digest_cpu_ms / cpu_ms["on"],
    }


if __name__ == "__main__":
    main()
