"""Start the ranks of a built-in reference workload on this host, as torchrun does for
one node, without torchrun's agent: the agent imports torch before any rank starts
(about 2 s a run, a quarter of a short run's wall: docs/benchmarks.md) and has no work
to do here (no restarts, one node).

    python -m bisect_prefetch.workloads.local_ranks --nproc 2 --master-port 29500 \\
        -- -m bisect_prefetch.workloads.fsdp2 --layers 4 --steps 10

Each rank is `python ARGS` with torchrun's variables for a single node (RANK,
LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT; and
OMP_NUM_THREADS=1 where unset, for more than one rank),
in this process's group, writing to this process's stdout and stderr. When a rank
fails, the others are stopped (SIGTERM, then SIGKILL after a grace): a peer left
alone would wait in a collective until gloo's timeout. The exit code is the first
failing rank's (0 when every rank succeeds). SIGTERM and SIGINT are passed on to the
ranks. Users' jobs keep their own launcher (`command:`); this is for the built-in
workloads only.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

GRACE_S = 5.0  # a stopped rank's time to exit after SIGTERM, before SIGKILL
POLL_S = 0.02


def rank_env(rank: int, nproc: int, master_addr: str, master_port: int) -> dict[str, str]:
    env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc),
               LOCAL_WORLD_SIZE=str(nproc), GROUP_RANK="0", MASTER_ADDR=master_addr,
               MASTER_PORT=str(master_port))
    if nproc > 1:
        env.setdefault("OMP_NUM_THREADS", "1")  # as torchrun does: ranks share the cores
    return env


def stop(ranks: list[subprocess.Popen], sig: int = signal.SIGTERM) -> None:
    """Signal every rank still running, wait up to GRACE_S, then SIGKILL the rest."""
    for proc in ranks:
        if proc.poll() is None:
            proc.send_signal(sig)
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline and any(p.poll() is None for p in ranks):
        time.sleep(POLL_S)
    for proc in ranks:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def run(nproc: int, master_addr: str, master_port: int, args: list[str]) -> int:
    ranks: list[subprocess.Popen] = []
    stopping: list[int] = []

    def on_signal(sig: int, _frame) -> None:
        stopping.append(sig)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    for rank in range(nproc):
        ranks.append(subprocess.Popen([sys.executable, *args],
                                      env=rank_env(rank, nproc, master_addr, master_port)))
    while True:
        if stopping:
            stop(ranks, stopping[0])
            return 128 + stopping[0]
        codes = [p.poll() for p in ranks]
        failed = [c for c in codes if c not in (None, 0)]
        if failed:
            stop(ranks)
            return failed[0] if failed[0] > 0 else 128 - failed[0]  # killed by a signal
        if all(c == 0 for c in codes):
            return 0
        time.sleep(POLL_S)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nproc", type=int, required=True)
    parser.add_argument("--master-addr", default="127.0.0.1")
    parser.add_argument("--master-port", type=int, required=True)
    parser.add_argument("args", nargs=argparse.REMAINDER, help="-- then python's arguments")
    ns = parser.parse_args(argv)
    args = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
    if ns.nproc < 1 or not args:
        parser.error("give --nproc >= 1 and, after --, the rank's python arguments")
    return run(ns.nproc, ns.master_addr, ns.master_port, args)


if __name__ == "__main__":
    sys.exit(main())
