"""Finding and killing every process of a job, wherever it went.

A job's process group is not enough: torchrun starts its workers with
start_new_session and msrun with setsid, so the workers live in groups of
their own, and a launcher killed hard leaves them running. What every
process of a job does keep is its environment: the launcher gives each run a
unique BISECT_PREFETCH_PLAN, so the job's processes are the ones whose
/proc/<pid>/environ holds that entry (Linux; elsewhere only the group is
found). A process that also scrubs its environment (env -i) stays in the job's
process tree: the launcher runs every job under runs/reaper.py, which receives
the job's orphans, and kill_job signals every process below it.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from bisect_prefetch.runs.reaper import descendants

PROC = Path("/proc")


def _is_zombie(pid: int) -> bool:
    try:
        return "\nState:\tZ" in (PROC / str(pid) / "status").read_text()
    except OSError:
        return True


def marked_processes(entry: str, *, prefix: bool = False) -> list[int]:
    """Live processes (not us) whose environment holds `entry` (or an entry starting with it)."""
    wanted = entry.encode()
    found = []
    try:
        pids = [int(p.name) for p in PROC.iterdir() if p.name.isdigit()]
    except OSError:
        return []
    for pid in pids:
        if pid == os.getpid():
            continue
        try:
            environ = (PROC / str(pid) / "environ").read_bytes()
        except OSError:
            continue
        entries = environ.split(b"\0")
        hit = any(e.startswith(wanted) for e in entries) if prefix else wanted in entries
        if hit and not _is_zombie(pid):
            found.append(pid)
    return found


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_all(pgid: int | None, pids: list[int], sig: int) -> None:
    if pgid is not None:
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def kill_job(pgid: int | None, marker: str | None, grace_s: float, reap=lambda: None,
             root: int | None = None) -> None:
    """SIGTERM the group, every marked process and every process below root; SIGKILL what
    is left after grace_s.

    reap is called while waiting so the caller can collect its own child
    (an unreaped leader stays in its group as a zombie).
    """
    def remaining() -> list[int]:
        found = marked_processes(marker) if marker else []
        below = [p for p in descendants(root) if not _is_zombie(p)] if root is not None else []
        return sorted(set(found) | set(below))

    _signal_all(pgid, remaining(), signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        reap()
        if not (pgid is not None and _group_alive(pgid)) and not remaining():
            return
        time.sleep(0.05)
    _signal_all(pgid, remaining(), signal.SIGKILL)


def kill_leftovers(entry_prefix: str, grace_s: float = 2.0) -> list[int]:
    """Kill processes left by an orchestrator that died hard (their env starts with the prefix)."""
    pids = marked_processes(entry_prefix, prefix=True)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and marked_processes(entry_prefix, prefix=True):
        time.sleep(0.05)
    for pid in marked_processes(entry_prefix, prefix=True):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids
