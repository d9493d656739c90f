"""One Slurm allocation for a whole search against one batch job a run; a node lost mid-search.

On the tests' two-node Slurm (tests/slurm_cluster.py: each slurmd in a network namespace of
its own, SlurmdTimeout 10 s, so that the controller declares a dead node failed within
about half a minute; the FIFO scheduler sched/builtin), the same bisection of the stand-in
job (tests/jobs/fake_job.py: 2 edges on a static graph, drift planted on
bwd:layers.1->layers.0; --steps steps a run, 20 ms each) runs
- inside `salloc -N2 --no-kill` (every run a job step: 2 slots of one node), and
- with one batch job a run (sbatch, slots 2, one node a run),
first on an idle partition, then beside a competing load: other users' one-node jobs of
--compete-s seconds, each holding its node whole (--exclusive), --queued of them always
pending. Each: the verdict, runs launched, batch jobs the controller saw and job steps
(a run is one step; the shared-filesystem check one more), and the time from the
command's start (salloc's, or the tool's) to its verdict.

Then the allocation's search, idle, with its second node lost while a search run is on it,
twice: only that node's slurmd killed (its steps live on under slurmstepd until the
controller declares the node failed), and every process of the node killed (slurmd,
slurmstepd, the job): the verdict, the runs lost and run again, the time against the
search without a loss.

Run: ``python -m benchmarks.bench_allocation [--steps N] [--compete-s S] [--queued Q] [--json FILE]``
(root, as the two-node tests: network namespaces).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

from tests.conftest import FAKE_JOB
from tests.slurm_cluster import TwoNodeCluster, running_two_node_cluster

EDGE = "bwd:layers.1->layers.0"
COMPETITOR = "competitor"
SEARCH_RUN = re.compile(r"-search-[ks]\d")


def _experiment(root: Path, steps: int) -> Path:
    path = root / "exp.yaml"
    path.write_text(textwrap.dedent(f"""
        name: bench
        command: {json.dumps([sys.executable, str(FAKE_JOB), "clean"])}
        metrics: {{format: jsonl, names: [loss]}}
        graph: {{source: static, policy: fsdp2-chain, layers: 2}}
        steps: {steps}
        timeout_s: 300
        executor: {{kind: slurm, slots: 2}}
    """))
    return path


def _env(cluster: TwoNodeCluster) -> dict[str, str]:
    return {**os.environ, **cluster.env, "OMP_NUM_THREADS": "1"}


def _jobs(cluster: TwoNodeCluster) -> dict[int, str]:
    """Every job the controller still shows (MinJobAge 300 s): id -> name."""
    shown = subprocess.run(cluster.inside(["squeue", "-h", "-a", "-t", "all", "-o", "%i %j"]),
                           env=_env(cluster), capture_output=True, text=True)
    pairs = (line.split(None, 1) for line in shown.stdout.splitlines())
    return {int(p[0]): p[1].strip() for p in pairs if len(p) == 2 and p[0].isdigit()}


def _steps_now(cluster: TwoNodeCluster) -> list[list[str]]:
    shown = subprocess.run(cluster.inside(["squeue", "--steps", "-h", "-o", "%i %j %N"]),
                           env=_env(cluster), capture_output=True, text=True)
    return [line.split() for line in shown.stdout.splitlines() if "bisect-prefetch-" in line]


class Competition:
    """Other users' jobs: --queued one-node jobs always pending, each holding its node whole
    for compete_s seconds, submitted as the earlier ones start."""

    def __init__(self, cluster: TwoNodeCluster, *, compete_s: float, queued: int) -> None:
        self.cluster, self.compete_s, self.queued = cluster, compete_s, queued
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keep_queued, daemon=True)

    def _keep_queued(self) -> None:
        while not self._stop.is_set():
            shown = subprocess.run(self.cluster.inside(["squeue", "-h", "-t", "PD", "-n", COMPETITOR,
                                                        "-o", "%i"]),
                                   env=_env(self.cluster), capture_output=True, text=True)
            for _ in range(self.queued - len(shown.stdout.split())):
                subprocess.run(self.cluster.inside(
                    ["sbatch", "-N1", "--exclusive", f"--job-name={COMPETITOR}", "-o", "/dev/null",
                     "--wrap", f"sleep {self.compete_s:g}"]),
                    env=_env(self.cluster), capture_output=True, check=True)
            self._stop.wait(0.5)

    def __enter__(self) -> Competition:
        self._thread.start()
        time.sleep(2)  # the queue filled, the nodes taken
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        subprocess.run(self.cluster.inside(["scancel", "-n", COMPETITOR]), env=_env(self.cluster),
                       capture_output=True)
        time.sleep(2)


def bisect(cluster: TwoNodeCluster, root: Path, exp: Path, name: str, *, allocation: bool,
           lose: str | None = None) -> dict:
    """One bisection from the first node; lose: "slurmd" or "node" (the second node's)."""
    state, out = root / f"state-{name}", root / f"{name}.json"
    argv = [sys.executable, "-m", "bisect_prefetch.cli", "bisect", str(exp), "--state-dir", str(state),
            "--json", str(out)]
    if allocation:
        argv = ["salloc", "-N2", "--no-kill", *argv]
    before = max(_jobs(cluster), default=0)
    start = time.perf_counter()
    tool = subprocess.Popen(cluster.inside(argv), cwd=root, env=_env(cluster), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lost_at = None
    if lose is not None:
        while tool.poll() is None and lost_at is None:
            if any(SEARCH_RUN.search(s[1]) and s[2] == cluster.nodes[1] for s in _steps_now(cluster)):
                lost_at = time.perf_counter() - start
                if lose == "node":
                    cluster.kill_node(1)
                else:
                    _kill_slurmd(cluster, 1)
            time.sleep(0.1)
    said, err = tool.communicate(timeout=3600)
    wall = time.perf_counter() - start
    if tool.returncode != 1:
        raise RuntimeError(f"{name}: bisect exited {tool.returncode}: {said[-3000:]}{err[-2000:]}")
    data = json.loads(out.read_text())
    jobs = {i: n for i, n in _jobs(cluster).items() if i > before and n != COMPETITOR}
    runs = [r for r in (json.loads(line) for line in (state / "bench" / "journal.jsonl").open())
            if "submitted" not in r]
    return {
        "verdict": f"{data['verdict']} {','.join(data['minimal_set'])}",
        "wall_s": round(wall, 1),
        "runs_launched": data["runs_launched"],
        "batch_jobs": sum(n.startswith("bisect-prefetch-") for n in jobs.values()),
        "allocations": sum(not n.startswith("bisect-prefetch-") for n in jobs.values()),
        "job_steps": (sum(1 for _ in (state / "bench" / "runs").glob("*/job.srun")) + 1
                      if allocation else 0),
        "runs_lost": data["runs_lost"],
        "retried": sum(r["attempt"] > 0 for r in runs),
        "lost_at_s": None if lost_at is None else round(lost_at, 1),
        "ok": data["verdict"] == "culprit-found" and data["minimal_set"] == [EDGE],
    }


def _kill_slurmd(cluster: TwoNodeCluster, node: int) -> None:
    """Only the node's slurmd (SIGKILL): its steps' slurmstepd and tasks go on."""
    listed = subprocess.run(["ip", "netns", "pids", cluster.namespaces[node]], capture_output=True,
                            text=True, check=True)
    for pid in listed.stdout.split():
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "slurmd":
                os.kill(int(pid), 9)
        except OSError:
            pass


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="steps a run (20 ms each)")
    parser.add_argument("--compete-s", type=float, default=20.0)
    parser.add_argument("--queued", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv if argv is not None else [])
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        with running_two_node_cluster(root / "slurm", slurmd_timeout_s=10) as cluster:
            exp = _experiment(root, args.steps)
            for load in ("idle", "busy"):
                for how in ("allocation", "sbatch"):
                    name = f"{how}-{load}"
                    if load == "busy":
                        with Competition(cluster, compete_s=args.compete_s, queued=args.queued):
                            results[name] = bisect(cluster, root, exp, name,
                                                   allocation=how == "allocation")
                    else:
                        results[name] = bisect(cluster, root, exp, name,
                                               allocation=how == "allocation")
                    _say(name, results[name])
            for lose in ("slurmd", "node"):
                name = f"allocation-{lose}-lost"
                results[name] = bisect(cluster, root, exp, name, allocation=True, lose=lose)
                _say(name, results[name])
                cluster.start_slurmd(1)
    if args.json is not None:
        args.json.write_text(json.dumps({"steps": args.steps, "compete_s": args.compete_s,
                                         "queued": args.queued, **results}, indent=2) + "\n")


def _say(name: str, r: dict) -> None:
    lost = f", lost {len(r['runs_lost'])} at {r['lost_at_s']} s, retried {r['retried']}" \
        if r["lost_at_s"] is not None else ""
    print(f"{name}: {r['verdict']} in {r['wall_s']} s; runs {r['runs_launched']}, batch jobs "
          f"{r['batch_jobs']}, allocations {r['allocations']}, job steps {r['job_steps']}{lost}"
          + ("" if r["ok"] else "  <- NOT the planted edge"), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
