"""What a run was started with, as the journal keeps it, and what differs now.

A job reads its environment in ways no manifest sees (a data dir named only in a variable,
a flag the user exported in the shell), so a run is taken again only while every variable
it was started with is the same: the whole environment the tool launches the job with
(runs/launcher.user_env: the caller's, the pins, the experiment's env; not the plan or the
adapter the tool adds), its PYTHONPATH, and the working directory it started in. The
journal keeps a hash per variable (values can be secrets: a token is never written), and
PYTHONPATH and the working directory in clear. ``VOLATILE`` names what is left out:
terminal and login-session noise, a test runner's current test, and the ids of a Slurm
allocation, which change between shells and allocations and set no job's numbers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

VOLATILE = frozenset({
    # the shell and the terminal
    "_", "OLDPWD", "PWD", "SHLVL", "TERM", "COLUMNS", "LINES", "COLORTERM", "TERM_PROGRAM",
    "TERM_PROGRAM_VERSION", "TERM_SESSION_ID", "WINDOWID", "PS1", "PS2", "PS4",
    "PROMPT_COMMAND", "HISTFILE", "HISTSIZE", "HISTFILESIZE", "HISTCONTROL", "LS_COLORS",
    "LSCOLORS", "MAIL",
    # the login session: ssh, multiplexers, the desktop
    "SSH_AUTH_SOCK", "SSH_AGENT_PID", "SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY", "GPG_TTY",
    "TMUX", "TMUX_PANE", "STY", "WINDOW", "DISPLAY", "XAUTHORITY", "DBUS_SESSION_BUS_ADDRESS",
    "XDG_SESSION_ID", "XDG_SESSION_TYPE", "XDG_SESSION_CLASS", "XDG_VTNR", "XDG_SEAT",
    "SECURITYSESSIONID",
    # a test runner's name for the test it is in
    "PYTEST_CURRENT_TEST",
    # a Slurm allocation's and step's ids
    "SLURM_JOB_ID", "SLURM_JOBID", "SLURM_STEP_ID", "SLURM_STEPID", "SLURM_TASK_PID",
    "SLURM_SRUN_COMM_HOST", "SLURM_SRUN_COMM_PORT", "SLURM_STEP_LAUNCHER_PORT",
    "SLURM_JOB_START_TIME", "SLURM_JOB_END_TIME",
})
PATH_VARIABLE = "PYTHONPATH"  # kept in clear: a checkout is said by its path


def _hash(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def launch_print(env: Mapping[str, str], *, cwd: str | Path | None) -> dict[str, Any]:
    """What the journal keeps of a run's start: a hash per variable, PYTHONPATH and the
    working directory (None: the run dir, as for built-in workloads)."""
    return {
        "cwd": None if cwd is None else str(cwd),
        PATH_VARIABLE: env.get(PATH_VARIABLE, ""),
        "env": {name: _hash(value) for name, value in sorted(env.items())
                if name not in VOLATILE and name != PATH_VARIABLE},
    }


def launch_differs(then: Mapping[str, Any], now: Mapping[str, Any]) -> str | None:
    """What differs between a run's start and a start now, in words; None if nothing."""
    if then.get("cwd") != now.get("cwd"):
        return f"the working directory {then.get('cwd')} -> {now.get('cwd')}"
    if then.get(PATH_VARIABLE, "") != now.get(PATH_VARIABLE, ""):
        return (f"{PATH_VARIABLE} {then.get(PATH_VARIABLE) or 'unset'} -> "
                f"{now.get(PATH_VARIABLE) or 'unset'}")
    before, after = then.get("env") or {}, now.get("env") or {}
    for name in sorted(set(before) | set(after)):
        if name in VOLATILE or before.get(name) == after.get(name):
            continue
        if name not in before:
            return f"the variable {name} is set now"
        if name not in after:
            return f"the variable {name} is unset now"
        return f"the variable {name} has another value (values are not kept)"
    return None
