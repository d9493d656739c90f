"""Runs one job as the subreaper of everything it starts, so that nothing outlives it.

A job's processes can leave every trace the launcher follows: a child that starts its own
session (setsid) leaves the job's process group, and one started with a scrubbed
environment (env -i) loses the plan entry procs.marked_processes looks for. What none of
them can leave is the process tree: this small program (started by the launcher, the
standard library only, no site packages) marks itself a child subreaper (Linux prctl), so
an orphan of the job is handed to it rather than to init, then runs the job as its child.
When the job's main process ends, whatever it left is sent SIGTERM, then after the grace
time SIGKILL; a SIGTERM to this program does the same at once. Its exit status is the
job's (a signal is raised again). Elsewhere than Linux it only runs and waits.

    python -I -S reaper.py GRACE_S ARGV...
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def descendants(root: int) -> list[int]:
    """Every process below root in the process tree (from /proc; [] where there is none)."""
    children: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()  # after the command name, which may hold spaces
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(name))
    found: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _signal_tree(sig: int) -> None:
    for pid in descendants(os.getpid()):
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def _reap() -> bool:
    """Collect every child that has ended; False once there is no child left."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


def _end_leftovers(grace_s: float) -> None:
    if not descendants(os.getpid()):
        return
    _signal_tree(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while _reap() and time.monotonic() < deadline:
        time.sleep(0.02)
    _signal_tree(signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while _reap() and time.monotonic() < deadline:
        time.sleep(0.02)


def main(argv: list[str]) -> None:
    grace_s, command = float(argv[0]), argv[1:]
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the launcher's group and plan-entry search remain
    def stop(signum: int, frame: object) -> None:
        _signal_tree(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    job = os.fork()
    if job == 0:
        # What exec keeps: Python ignores SIGPIPE and SIGXFSZ; a job expects the defaults.
        for sig in (signal.SIGTERM, signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)
        try:
            os.execvp(command[0], command)
        except OSError as exc:
            os.write(2, f"cannot start {command[0]}: {exc.strerror or exc}\n".encode())
        os._exit(127)
    status = None
    while status is None:
        try:
            pid, code = os.waitpid(-1, 0)
        except ChildProcessError:
            status = 0
            break
        if pid == job:
            status = code
    _end_leftovers(grace_s)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    sys.exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


if __name__ == "__main__":
    main(sys.argv[1:])
