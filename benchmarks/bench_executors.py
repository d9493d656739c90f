"""Executors: Slurm's submission overhead and what local slots buy.

- Submission overhead, on the test cluster (a real single-node Slurm started
  as the tests start it, tests/slurm_cluster.py): one slot, a short job after
  another. For each job after the first: from the moment the orchestrator
  saw the slot free (poll returned the previous job's end) to the next job
  RUNNING (polled with `scontrol show job` every 20 ms); and from the previous
  job's own exit (the exit file its script writes) to the same moment, which
  adds the orchestrator's poll latency. Medians.
- Local slots: an A/A group of the FSDP2 reference workload (world size 1,
  4 layers, the real Runner and run_group) with 4 runs, local slots 1 and 2,
  wall-clock ratio; and the real bisection of that workload with a planted
  fault (`bisect --executor local --slots 1|2`): wall-clock ratio and runs.
  On a 2-core machine two single-rank runs share the cores.

Run: ``python -m benchmarks.bench_executors [--jobs N] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bisect_prefetch.drivers.group import run_group
from bisect_prefetch.experiment import ExecutorConfig, load_experiment
from bisect_prefetch.runs.execute import Runner
from bisect_prefetch.runs.executors.base import Job
from bisect_prefetch.runs.executors.slurm import EXIT_FILE, SlurmExecutor, SlurmOptions
from bisect_prefetch.runs.launcher import JobSpec, job_env
from bisect_prefetch.runs.store import StateDir

SHORT_JOB = "import json; open('metrics.jsonl', 'w').write(json.dumps({'step': 1, 'loss': 1.0}) + '\\n')"


def _state(job_id: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True)
    for field in out.stdout.split():
        if field.startswith("JobState="):
            return field.split("=", 1)[1]
    return "UNKNOWN"


def submission_overhead(root: Path, jobs: int) -> dict[str, float]:
    from tests.slurm_cluster import running_cluster

    with running_cluster(root / "slurm"):
        executor = SlurmExecutor(SlurmOptions(slots=1))
        executor.check(root)
        from_free, from_exit = [], []
        previous: tuple[str, Path] | None = None
        for index in range(jobs):
            run_dir = root / f"run{index}"
            run_dir.mkdir()
            (run_dir / "plan.json").write_text("{}")
            spec = JobSpec(argv=[sys.executable, "-c", SHORT_JOB], run_dir=run_dir,
                           env=job_env(plan_path=run_dir / "plan.json", experiment_env={}),
                           timeout_s=120)
            if previous is not None:
                while executor.poll(previous[0]) is None:
                    time.sleep(0.01)
            freed = time.time()
            job_id = executor.submit(Job(spec=spec))
            while _state(job_id) == "PENDING":
                time.sleep(0.02)
            running = time.time()
            if previous is not None:
                from_free.append(running - freed)
                from_exit.append(running - (previous[1] / EXIT_FILE).stat().st_mtime)
            previous = (job_id, run_dir)
        while executor.poll(previous[0]) is None:
            time.sleep(0.01)
    return {"jobs": jobs, "free_to_running_median_s": round(statistics.median(from_free), 3),
            "exit_to_running_median_s": round(statistics.median(from_exit), 3)}


def local_slots(root: Path) -> dict[str, float]:
    root.mkdir(parents=True)
    (root / "exp.yaml").write_text(
        "name: bench\nworkload: {builtin: fsdp2, layers: 4, world_size: 1}\n"
        "steps: 10\nseed: 7\ntimeout_s: 300\n")
    walls = {}
    for slots in (1, 2):
        experiment = load_experiment(root / "exp.yaml").model_copy(
            update={"executor": ExecutorConfig(kind="local", slots=slots)})
        with StateDir(root / f"state{slots}", experiment.name) as state:
            runner = Runner(experiment, state).open()
            start = time.perf_counter()
            group = run_group(runner, mask=None, runs=4, steps=experiment.steps, guard="none")
            walls[slots] = time.perf_counter() - start
            assert group.verdict == "consistent", group.reason
    return {"aa_4_runs_slots1_s": round(walls[1], 2), "aa_4_runs_slots2_s": round(walls[2], 2),
            "ratio_1_over_2": round(walls[1] / walls[2], 2)}


def local_bisect(root: Path) -> dict[str, float]:
    """The real FSDP2 bisection (planted fault) with local slots 1 and 2: wall and runs."""
    root.mkdir(parents=True)
    (root / "exp.yaml").write_text(
        "name: bench\nworkload:\n  builtin: fsdp2\n  layers: 4\n  world_size: 1\n"
        '  fault: {edge: "bwd:layers.2->layers.1", hazard: 0.3}\n'
        "steps: 10\nseed: 7\ntimeout_s: 300\n")
    out: dict[str, float] = {}
    for slots in (1, 2):
        result = root / f"bisect{slots}.json"
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "bisect_prefetch.cli", "bisect", str(root / "exp.yaml"),
             "--executor", "local", "--slots", str(slots), "--state-dir", str(root / f"s{slots}"),
             "--json", str(result)], capture_output=True, text=True)
        out[f"slots{slots}_s"] = round(time.perf_counter() - start, 1)
        if done.returncode != 1:
            raise RuntimeError(f"bisect with {slots} slot(s) exited {done.returncode}: "
                               f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
        data = json.loads(result.read_text())
        out[f"slots{slots}_runs"] = data["runs_launched"]
        out[f"slots{slots}_verdict"] = f"{data['verdict']} {','.join(data['minimal_set'])}"
    out["ratio_1_over_2"] = round(out["slots1_s"] / out["slots2_s"], 2)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--skip-bisect", action="store_true",
                        help="leave out the real FSDP2 bisection with local slots 1 and 2")
    args = parser.parse_args(argv if argv is not None else [])
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        overhead = submission_overhead(root / "overhead", args.jobs)
        print(f"slurm submission overhead over {overhead['jobs']} jobs: slot free -> next job "
              f"RUNNING median {overhead['free_to_running_median_s']} s; previous job's exit -> "
              f"next RUNNING median {overhead['exit_to_running_median_s']} s", flush=True)
        slots = local_slots(root / "local")
        print(f"local slots, A/A group of 4 FSDP2 runs: slots 1 {slots['aa_4_runs_slots1_s']} s, "
              f"slots 2 {slots['aa_4_runs_slots2_s']} s, ratio {slots['ratio_1_over_2']}x",
              flush=True)
        bisect = None if args.skip_bisect else local_bisect(root / "bisect")
        if bisect is not None:
            print(f"real FSDP2 bisection (4 layers, 1 rank, planted fault), local slots 1 vs 2: "
                  f"{bisect['slots1_s']} s ({bisect['slots1_runs']} runs, "
                  f"{bisect['slots1_verdict']}) vs {bisect['slots2_s']} s "
                  f"({bisect['slots2_runs']} runs, {bisect['slots2_verdict']}), "
                  f"ratio {bisect['ratio_1_over_2']}x", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps({"slurm": overhead, "local": slots, "bisect": bisect},
                                        indent=2) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
