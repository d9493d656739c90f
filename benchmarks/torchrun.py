"""How the benchmarks launch an FSDP2 job: torchrun in its own process group, the adapter's
site directory on the path when a plan is given, the whole group killed on timeout."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SITE = REPO / "bisect_prefetch" / "adapters" / "site"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(module_args: list[str], *, nproc: int, plan: Path | None, timeout: float,
             cwd: Path) -> tuple[float, float]:
    """Run `python -m MODULE ARGS` on nproc ranks; returns (launch time as time.time(),
    wall seconds from launch to exit). A failed job raises with the end of its stderr."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    env.pop("BISECT_PREFETCH_PLAN", None)
    if plan is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(SITE), str(REPO)])
        env["BISECT_PREFETCH_PLAN"] = str(plan)
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
               f"--master_port={free_port()}", "-m", *module_args]
    launched, started = time.time(), time.perf_counter()
    process = subprocess.Popen(command, cwd=cwd, env=env, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    if process.returncode != 0:
        raise RuntimeError(f"job failed ({process.returncode}):\n{stderr[-3000:]}")
    return launched, time.perf_counter() - started
