"""What the audit adds to the discovery run, and what each mask costs in step time.

FSDP2 reference workload (torchrun, gloo, CPU), under the launcher's setup
(sitecustomize, a plan in BISECT_PREFETCH_PLAN).

1. Audit overhead. The audit is the order record inside the discovery run
   plus the analysis afterwards (judge/audit.audit_run_dir). The record's cost is
   measured side by side inside ONE job (machine noise hits both alike):
   steps alternate between recording the order and not, and the extra time
   of a recorded step is charged once per recorded discovery step. Overhead
   = (extra per recorded step x recorded steps + analysis time) / the
   discovery run's wall time (launch to exit). Target: at most 1%.
2. Step time per mask: K runs each of all-on, backward-off and all-off; each
   run's step time by the tool's own rule (judge/step_time.py: slowest rank,
   warm-up steps left out, median), reported against all-on as a ratio with
   its range over the K runs.

Run: ``python -m benchmarks.bench_audit [--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.torchrun import torchrun


def _plan(run_dir: Path, *, mask: list[str] | None, order_steps: int) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    plan = {"version": 1, "experiment": "bench", "run_id": run_dir.name, "out_dir": str(run_dir),
            "mask": mask, "guard": "none", "fault": None,
            "record": {"graph": True, "probe": True, "digests": None, "digest_every": 1,
                       "order_steps": order_steps}}
    path = run_dir / "plan.json"
    path.write_text(json.dumps(plan))
    return path


def _torchrun(run_dir: Path, module_args: list[str], *, plan: Path, nproc: int,
              timeout: float) -> float:
    """One job under torchrun; returns its wall time (launch to exit)."""
    return torchrun(module_args, nproc=nproc, plan=plan, timeout=timeout, cwd=run_dir)[1]

def worker(out: str, layers: int, steps: int) -> None:
    """Inside the job: steps alternate between recording the order and not; rank 0 writes times."""
    import torch
    import torch.distributed as dist

    from bisect_prefetch import adapters
    from bisect_prefetch.workloads import fsdp2 as workload

    session = adapters.install()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1234)
    model = workload.TinyTransformer(vocab=64, dim=32, heads=2, layers=layers)
    workload.apply_fsdp(model, workload.init_device_mesh("cpu", (world,)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    batches = workload.synthetic_batches(seed=1234, count=4, batch=8, seq=16, vocab=64)
    times: dict[str, list[float]] = {"plain": [], "order": []}
    for step in range(1, steps + 1):
        condition = "order" if step % 2 else "plain"
        session.order.steps_left = 1 if condition == "order" else 0  # this step only
        tokens = batches[step % 4][rank * (8 // world):(rank + 1) * (8 // world)]
        started = time.perf_counter()
        loss, grad_norm = workload.train_step(model, optimizer, tokens)
        adapters.report_step(step, loss=loss, grad_norm=grad_norm)  # writes the recorded step
        if step > 4:  # warm-up
            times[condition].append(time.perf_counter() - started)
    if rank == 0:
        Path(out).write_text(json.dumps(times))
    dist.destroy_process_group()


def _audit_overhead(tmp: Path, args: argparse.Namespace) -> dict:
    from bisect_prefetch.judge.audit import audit_run_dir
    from bisect_prefetch.runs.discover import DISCOVERY_STEPS

    inside = tmp / "inside"
    out = inside / "times.json"
    _torchrun(inside, ["benchmarks.bench_audit", "--worker", str(out), "--layers",
                       str(args.layers), "--steps", str(args.steps)],
              plan=_plan(inside, mask=None, order_steps=1), nproc=args.nproc,
              timeout=args.timeout)
    times = json.loads(out.read_text())
    plain, order = statistics.median(times["plain"]), statistics.median(times["order"])
    walls, analysis = [], []
    for k in range(args.runs):  # discovery runs as the tool launches them, then the analysis
        run_dir = tmp / f"discover{k}"
        plan = _plan(run_dir, mask=None, order_steps=3)
        walls.append(_torchrun(run_dir, ["bisect_prefetch.workloads.fsdp2", "--layers",
                                         str(args.layers), "--steps", str(DISCOVERY_STEPS)],
                               plan=plan, nproc=args.nproc, timeout=args.timeout))
        started = time.perf_counter()
        audit_run_dir(run_dir)
        analysis.append(time.perf_counter() - started)
    wall, analysis_s = statistics.median(walls), statistics.median(analysis)
    extra = max(order - plain, 0.0) * DISCOVERY_STEPS + analysis_s
    return {"step_plain_ms": plain * 1e3, "step_order_ms": order * 1e3,
            "order_step_extra_ms": (order - plain) * 1e3, "analysis_ms": analysis_s * 1e3,
            "discovery_wall_s": wall, "audit_overhead": extra / wall,
            "steps_each": len(times["plain"]), "discovery_runs": args.runs}


def _mask_costs(tmp: Path, args: argparse.Namespace) -> dict:
    from bisect_prefetch.judge.step_time import WARMUP_STEPS, mask_costs, run_step_time_ms

    graph_dir = tmp / "graph"
    _torchrun(graph_dir, ["bisect_prefetch.workloads.fsdp2", "--layers", str(args.layers),
                          "--steps", "1"], plan=_plan(graph_dir, mask=None, order_steps=0),
              nproc=args.nproc, timeout=args.timeout)
    edges = [e["id"] for e in json.loads((graph_dir / "graph.rank0.json").read_text())["edges"]]
    masks = {"all-on": edges, "backward-off": [e for e in edges if e.startswith("fwd:")],
             "all-off": []}
    times: dict[str, list[float | None]] = {name: [] for name in masks}
    for k in range(args.runs):
        for name, mask in masks.items():  # interleaved: drift of the machine hits all alike
            run_dir = tmp / f"{name}{k}"
            _torchrun(run_dir, ["bisect_prefetch.workloads.fsdp2", "--layers", str(args.layers),
                                "--steps", str(args.mask_steps)],
                      plan=_plan(run_dir, mask=mask, order_steps=0), nproc=args.nproc,
                      timeout=args.timeout)
            times[name].append(run_step_time_ms(run_dir))
    return {"warmup_steps": WARMUP_STEPS, "steps": args.mask_steps, "runs": args.runs,
            "costs": mask_costs(times)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=60, help="steps of the side-by-side job")
    parser.add_argument("--mask-steps", type=int, default=20, help="steps of each mask's run")
    parser.add_argument("--runs", type=int, default=3, help="runs per mask and discovery runs")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv if argv is not None else sys.argv[1:] if __name__ == "__main__"
                             else [])
    if args.worker:
        worker(args.worker, args.layers, args.steps)
        return {}
    with tempfile.TemporaryDirectory(prefix="bench-audit-") as tmp:
        audit_figures = _audit_overhead(Path(tmp), args)
        print(f"audit: order record +{audit_figures['order_step_extra_ms']:.2f} ms on a "
              f"{audit_figures['step_plain_ms']:.1f} ms step, analysis "
              f"{audit_figures['analysis_ms']:.1f} ms, discovery run "
              f"{audit_figures['discovery_wall_s']:.2f} s: overhead "
              f"{audit_figures['audit_overhead']:.2%} (target <= 1%)", flush=True)
        mask_figures = _mask_costs(Path(tmp), args)
        for name, cost in mask_figures["costs"].items():
            print(f"step time {name}: {cost['median_ms']:.1f} ms, {cost['ratio']:.3f}x all-on "
                  f"(runs {cost['ratio_min']:.3f}-{cost['ratio_max']:.3f}x, {cost['runs']} runs, "
                  f"median after {mask_figures['warmup_steps']} warm-up steps)", flush=True)
    figures = {"audit": audit_figures, "step_time": mask_figures}
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return figures


if __name__ == "__main__":
    main()
