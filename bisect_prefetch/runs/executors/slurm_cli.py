"""Slurm's client commands, called one way: a time limit, a one-line error, scontrol's fields.

Both Slurm executors (one batch job a run, slurm.py; job steps of the allocation the tool
runs in, slurm_steps.py) and the reading of that allocation (allocation.py) go through
here, so a missing client or a controller that does not answer is said the same way.
"""

from __future__ import annotations

import shutil
import subprocess

from bisect_prefetch.errors import BisectPrefetchError

CLIENT_TIMEOUT_S = 60


def require_clients(programs: tuple[str, ...]) -> None:
    """Each of Slurm's client commands an executor calls is on PATH, or one line says which."""
    for program in programs:
        if shutil.which(program) is None:
            raise BisectPrefetchError(
                f"{program} not found on PATH: the slurm executor needs Slurm's client commands")


def run_client(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """A Slurm client command's answer (never raises on its exit code: callers judge it)."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, env=env,
                              timeout=CLIENT_TIMEOUT_S)
    except FileNotFoundError:
        raise BisectPrefetchError(
            f"{argv[0]} not found on PATH: the slurm executor needs Slurm's client commands"
        ) from None
    except subprocess.TimeoutExpired:
        raise BisectPrefetchError(f"{argv[0]} did not answer within {CLIENT_TIMEOUT_S}s") from None


def one_line(text: str) -> str:
    return " ".join(text.split())


def fields(line: str) -> dict[str, str]:
    """`scontrol show ... -o` output (one record a line) as a dict: Key=Value words.
    A value with spaces (a Reason, a Command) keeps only its first word."""
    return dict(word.split("=", 1) for word in line.split() if "=" in word)


def no_list(value: str | None) -> bool:
    """A node list or name Slurm leaves unset: empty, (null) or None assigned."""
    return not value or value in ("(null)", "None")
