"""Helpers shared by the reliability tests: stand-in experiments, state snapshots, leftovers."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

FAKE_JOB = Path(__file__).resolve().parent / "fake_job.py"
NAME = "fake"


def write_experiment(tmp_path: Path, argv: list[str], *, steps: int = 8, timeout_s: float = 30,
                     metrics_format: str = "jsonl", file_name: str = "exp.yaml",
                     extra: str = "") -> Path:
    """An experiment named `fake` running argv, on a static 2-layer graph."""
    path = tmp_path / file_name
    path.write_text(textwrap.dedent(f"""
        name: {NAME}
        command: {json.dumps(argv)}
        metrics: {{format: {metrics_format}, names: [loss]}}
        graph: {{source: static, policy: fsdp2-chain, layers: 2}}
        steps: {steps}
        timeout_s: {timeout_s}
    """) + extra)
    return path


def fake_job_experiment(tmp_path: Path, mode: str = "clean", **kw) -> Path:
    """An experiment running tests/fake_job.py in a mode (clean, crash, hang, ...)."""
    return write_experiment(tmp_path, [sys.executable, str(FAKE_JOB), mode], **kw)


def script_experiment(tmp_path: Path, body: str, *args: str, **kw) -> Path:
    """An experiment running a small Python script written here."""
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(body))
    return write_experiment(tmp_path, [sys.executable, str(script), *args], **kw)


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under root with its bytes (None for a directory), except the lock file.

    The lock file holds the pid of whoever locked last; it is not state.
    """
    if not root.exists():
        return {}
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
        if p.name != "lock"
    }


def job_processes(marker: str) -> list[int]:
    """Live processes (not zombies) whose environment mentions marker: none may outlive a test."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if marker.encode() in (proc / "environ").read_bytes():
                if "\nState:\tZ" not in (proc / "status").read_text():
                    pids.append(int(proc.name))
        except OSError:
            continue
    return pids
