"""Start-up and per-step time of the reference workloads, launched the way the tool launches them.

Each workload runs through the tool's own Runner (plan, sitecustomize, the
launcher, the metrics reading), once short and once long, `--repeats` times,
alternating. Per-step time is the difference of the two walls over the
difference of their steps, so start-up and shutdown cancel out (the long run
is long enough for its extra steps to outweigh a loaded machine's noise);
start-up is the short run's wall less its steps: launch, imports, compile (or
process groups) and exit. Medians over repeats. (The launcher's time to first
progress is no start-up figure for MindFormers: its info.log grows long
before the first step.)

- fsdp2: configs/fsdp2.yaml's workload (real torch FSDP2, 2 ranks over gloo).
- mindformers: configs/mindformers-cpu.yaml's (real MindFormers 1.9 trainer, 1 rank,
  its own venv; `make bench` makes it).

Then the FSDP2 workload's launch side by side, interleaved: its ranks started as the tool
starts them (workloads/local_ranks.py) and the same job under torchrun (as a `command:`),
5-step runs through the Runner, medians of their walls.

Run: ``python -m benchmarks.bench_workloads [--repeats N] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from bisect_prefetch.experiment import load_experiment, with_overrides
from bisect_prefetch.runs.execute import Runner
from bisect_prefetch.runs.store import StateDir

REPO = Path(__file__).resolve().parents[1]
# workload -> (experiment, short steps, long steps)
WORKLOADS = {"fsdp2": (REPO / "configs" / "fsdp2.yaml", 5, 25),
             "mindformers": (REPO / "configs" / "mindformers-cpu.yaml", 5, 405)}


def measure(config: Path, *, short_steps: int, long_steps: int, repeats: int) -> dict[str, float]:
    experiment = load_experiment(config)
    walls: dict[int, list[float]] = {short_steps: [], long_steps: []}
    with tempfile.TemporaryDirectory() as tmp, StateDir(tmp, experiment.name) as state:
        runner = Runner(experiment, state).open()
        for index in range(repeats):
            for steps in (short_steps, long_steps):
                key = runner.key("bench", mask=None, guard="none", steps=steps, index=index)
                out = runner.run(key, label=f"bench-{steps}")
                if out.outcome != "ok" or out.steps_done != steps:
                    raise SystemExit(f"{config.name}: run {out.run_id} ended {out.outcome} "
                                     f"({out.reason}) after {out.steps_done} of {steps} steps")
                walls[steps].append(out.wall_s)
    short, long = statistics.median(walls[short_steps]), statistics.median(walls[long_steps])
    per_step = (long - short) / (long_steps - short_steps)
    startup = short - short_steps * per_step
    return {"startup_s": round(startup, 2), "per_step_ms": round(per_step * 1e3, 1),
            "short_run": [short_steps, round(short, 2)], "long_run": [long_steps, round(long, 2)],
            "repeats": repeats}


def launch_side_by_side(config: Path, *, steps: int, repeats: int) -> dict:
    """Short runs of the FSDP2 workload, its ranks started by local_ranks and by torchrun."""
    own = load_experiment(config)
    w = own.workload
    torchrun = with_overrides(own, {"workload": None, "command": [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={w.world_size}",
        "--master_addr=127.0.0.1", "--master_port={port}", "-m", "bisect_prefetch.workloads.fsdp2",
        "--layers", str(w.layers), "--steps", "{steps}", "--seed", "{seed}"]})
    walls: dict[str, list[float]] = {"local_ranks": [], "torchrun": []}
    with tempfile.TemporaryDirectory() as tmp:
        for index in range(repeats):
            for name, experiment in (("local_ranks", own), ("torchrun", torchrun)):
                with StateDir(Path(tmp) / name, experiment.name) as state:
                    runner = Runner(experiment, state).open()
                    out = runner.run(runner.key("launch", mask=None, guard="none", steps=steps,
                                                index=index), label=name)
                if out.outcome != "ok":
                    raise SystemExit(f"{name}: run {out.run_id} ended {out.outcome} ({out.reason})")
                walls[name].append(out.wall_s)
    medians = {name: round(statistics.median(w), 2) for name, w in walls.items()}
    return {**medians, "ratio": round(medians["local_ranks"] / medians["torchrun"], 2),
            "steps": steps, "repeats": repeats}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    figures = {}
    print(f"{'workload':<12} {'start-up':>9} {'per step':>9}  (median of {args.repeats})", flush=True)
    for name, (config, short_steps, long_steps) in WORKLOADS.items():
        figures[name] = f = measure(config, short_steps=short_steps, long_steps=long_steps,
                                    repeats=args.repeats)
        print(f"{name:<12} {f['startup_s']:>8.1f}s {f['per_step_ms']:>7.1f}ms  "
              f"({short_steps} steps in {f['short_run'][1]:.1f}s, {long_steps} in {f['long_run'][1]:.1f}s)",
              flush=True)
    figures["launch"] = launch = launch_side_by_side(WORKLOADS["fsdp2"][0], steps=5,
                                                     repeats=max(args.repeats, 5))
    print(f"fsdp2 launch, {launch['steps']}-step run (median of {launch['repeats']}, interleaved): "
          f"local_ranks {launch['local_ranks']:.2f}s, torchrun {launch['torchrun']:.2f}s "
          f"(x{launch['ratio']:.2f})", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
