"""Start one job and see it to its end: ok, error, timeout or stopped-early (vocab words).

A job is an argument list (never a shell) started in its own process group
(session); a timeout, an early stop or Ctrl-C kills that group and every
process carrying the run's plan in its environment (torchrun's and msrun's
workers run in sessions of their own, see procs.py). stdout and stderr go
to files in the run dir. Progress is a counter the caller supplies (by
default the size of the metrics file); when it stops growing for
no_progress_timeout_s the job counts as hung.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.files import write_text_atomic
from bisect_prefetch.runs import reaper
from bisect_prefetch.runs.job_path import tool_paths
from bisect_prefetch.runs.plan import PLAN_ENV
from bisect_prefetch.runs.procs import kill_job
from bisect_prefetch.vocab import (
    ERROR,
    METRICS_FILE,
    OK,
    STATUS_FILE,
    STDERR_FILE,
    STDOUT_FILE,
    STOPPED_EARLY,
    TIMEOUT,
)

NO_METRICS = "no metrics written"  # a job that exited 0 before any metric value was read

# Same in every run of a group unless the experiment sets them: on CPU the
# thread count alone changes torch's results.
PINNED_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "NUMEXPR_NUM_THREADS": "1",
    "VECLIB_MAXIMUM_THREADS": "1",
    "PYTHONHASHSEED": "0",
}

def user_env(
    *,
    experiment_env: Mapping[str, str],
    workload_env: Mapping[str, str] | None = None,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The job's environment but the tool's own entries (the plan, the adapter on
    PYTHONPATH): base, pins, workload needs, the experiment's env. PYTHONPATH is the one
    the experiment (or else the caller's environment) gives. A reused run is checked
    against it (runs/launch_env.py)."""
    env = dict(os.environ if base is None else base)
    user_path = experiment_env.get("PYTHONPATH", env.get("PYTHONPATH", ""))
    env.update(PINNED_ENV)
    env.update(workload_env or {})
    env.update(experiment_env)
    env.pop("PYTHONPATH", None)
    if user_path:
        env["PYTHONPATH"] = user_path
    return env


def job_env(
    *,
    plan_path: Path,
    experiment_env: Mapping[str, str],
    workload_env: Mapping[str, str] | None = None,
    base: Mapping[str, str] | None = None,
    adapter_paths: Sequence[Path] | None = None,
) -> dict[str, str]:
    """The job's environment: user_env, with the adapter and the plan.

    adapter_paths go in front of PYTHONPATH (runs/job_path.py: a user's job gets the
    adapter tree alone; default: the package's own paths, for built-in workloads); a
    PYTHONPATH the experiment (or else the caller's environment) gives is kept after them.
    """
    env = user_env(experiment_env=experiment_env, workload_env=workload_env, base=base)
    user_path = env.get("PYTHONPATH", "")
    paths = tool_paths() if adapter_paths is None else adapter_paths
    env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), *([user_path] if user_path else [])])
    env[PLAN_ENV] = str(Path(plan_path).resolve())  # the job runs in the run dir
    env["PYTHONUNBUFFERED"] = "1"  # stdout lines reach the log (and the parsers) as printed
    return env


def free_port() -> int:
    """A TCP port free right now on localhost, so runs can overlap."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class JobSpec:
    argv: list[str]
    run_dir: Path
    env: dict[str, str]
    timeout_s: float
    no_progress_timeout_s: float | None = None
    progress_path: Path | None = None  # default: run_dir/metrics.jsonl
    cwd: Path | None = None  # where the job starts (default: its run dir)
    grace_s: float = 5.0  # between SIGTERM and SIGKILL
    poll_s: float = 0.05


@dataclass
class JobResult:
    outcome: str
    exit_code: int | None
    wall_s: float
    reason: str
    first_progress_s: float | None = None  # start to first metrics output: time to first step
    argv: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def check_command(argv: list[str], env: Mapping[str, str]) -> None:
    """A program that does not exist or cannot run is the user's error, said before launch."""
    if not argv:
        raise BisectPrefetchError("empty command")
    program = argv[0]
    if os.sep in program:
        if not (os.path.isfile(program) and os.access(program, os.X_OK)):
            raise BisectPrefetchError(f"command not found or not executable: {program}")
    elif shutil.which(program, path=env.get("PATH")) is None:
        raise BisectPrefetchError(f"command not found: {program} (not on PATH)")


def stop_job(proc: subprocess.Popen, spec: JobSpec, grace_s: float) -> None:
    """Kill the job's process group, every process below it and every process that carries
    its plan, then reap it."""
    plan = spec.env.get(PLAN_ENV)
    kill_job(proc.pid, f"{PLAN_ENV}={plan}" if plan else None, grace_s, reap=proc.poll,
             root=proc.pid)
    proc.wait()


def reaped_argv(argv: list[str], grace_s: float) -> list[str]:
    """argv run under runs/reaper.py: nothing the job starts (a child in a session of its
    own, with a scrubbed environment) outlives it. -I -S: the job's environment (its
    PYTHONPATH, the adapter's site dir) does not reach the reaper's own interpreter."""
    return [sys.executable, "-I", "-S", reaper.__file__, f"{grace_s:g}", *argv]


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def run_job(
    spec: JobSpec,
    *,
    should_stop: Callable[[], bool] | None = None,
    progress: Callable[[], int] | None = None,
) -> JobResult:
    """Run the job to its end and say how it ended; writes status.json into the run dir.

    should_stop is polled while the job runs: when it returns True the group
    is killed and the outcome is stopped-early. progress returns a counter that
    grows as the job reports steps (default: the metrics file's size); a job
    that exits 0 without any progress is an error (missing metrics).
    """
    check_command(spec.argv, spec.env)
    progress_path = spec.progress_path or spec.run_dir / METRICS_FILE
    progress = progress or (lambda: _file_size(progress_path))
    try:
        stdout = open(spec.run_dir / STDOUT_FILE, "wb")
        stderr = open(spec.run_dir / STDERR_FILE, "wb")
    except OSError as exc:
        raise BisectPrefetchError(f"run dir {spec.run_dir} is not writable: {exc.strerror}") from None
    start = time.monotonic()
    with stdout, stderr:
        try:
            proc = subprocess.Popen(
                reaped_argv(spec.argv, spec.grace_s), env=spec.env, cwd=spec.cwd or spec.run_dir, stdin=subprocess.DEVNULL,
                stdout=stdout, stderr=stderr, start_new_session=True,
            )
        except OSError as exc:
            raise BisectPrefetchError(f"cannot start {spec.argv[0]}: {exc.strerror or exc}") from None
        result = _watch(proc, spec, start, should_stop, progress)
    result.argv = list(spec.argv)
    write_text_atomic(spec.run_dir / STATUS_FILE, json.dumps(result.to_json(), indent=1) + "\n")
    return result


def _watch(
    proc: subprocess.Popen,
    spec: JobSpec,
    start: float,
    should_stop: Callable[[], bool] | None,
    progress: Callable[[], int],
) -> JobResult:
    last_count, last_change, first_progress = 0, start, None
    outcome = reason = None
    try:
        while True:
            try:
                exit_code = proc.wait(timeout=spec.poll_s)
                break
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            count = progress()
            if count != last_count:
                last_count, last_change = count, now
                if first_progress is None:
                    first_progress = now - start
            if should_stop is not None and should_stop():
                outcome, reason = STOPPED_EARLY, "stopped early: decided"
                break
            if now - start > spec.timeout_s:
                outcome, reason = TIMEOUT, f"timed out after {spec.timeout_s:g}s"
                break
            if spec.no_progress_timeout_s is not None and now - last_change > spec.no_progress_timeout_s:
                outcome = TIMEOUT
                reason = f"no progress for {spec.no_progress_timeout_s:g}s"
                break
    finally:
        # Whatever happened (an exit, a verdict, a timeout, Ctrl-C), leave no process behind.
        stop_job(proc, spec, spec.grace_s if proc.poll() is None else 0.0)
    wall = time.monotonic() - start
    if outcome is not None:
        return JobResult(outcome, proc.returncode, wall, reason, first_progress)
    # The job exited by itself, perhaps between two polls: look at its progress once more.
    if first_progress is None and progress() != 0:
        first_progress = wall
    if exit_code != 0:
        how = f"killed by signal {-exit_code}" if exit_code < 0 else f"exit code {exit_code}"
        return JobResult(ERROR, exit_code, wall, how, first_progress)
    if progress() == 0:
        return JobResult(ERROR, exit_code, wall, NO_METRICS, first_progress)
    return JobResult(OK, exit_code, wall, "finished", first_progress)
