"""The first error line of a run that failed before its first step.

A job that never reaches a step (a bad config value, a missing op) usually
says why in one line among hundreds: the message of the exception that ended
it. That line, not "exit code 1", is what a user needs to see first.

An in-job adapter that refused the job's engine (adapters/fsdp2_support.py) says
so in one line of its own, in the probe and on stderr: ``adapter_refusal`` finds
it, and it is the run's error whatever else the run did.
"""

from __future__ import annotations

import re
from pathlib import Path

from bisect_prefetch.judge.faults import MAX_LINE, log_files
from bisect_prefetch.vocab import ADAPTER_NOT_ACTIVE, NOT_ACTIVE_KEY

# A Python exception's message line (`ValueError: 64 is not divisible by 5`), else a logger's
# error line (MindSpore's `[ERROR] ...`, a `- ERROR -` record).
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)\b: \S")
_LOGGED_ERROR = re.compile(r"\[ERROR\]|\bERROR\b")
_READ_LIMIT = 8 * 1024 * 1024  # a run that failed before its first step wrote little
_REFUSAL = re.compile(r"bisect-prefetch: (" + re.escape(ADAPTER_NOT_ACTIVE) + r": .*)$")


def first_error_line(run_dir: Path) -> str | None:
    """The first exception message in the run's logs (job's own first), else the first ERROR line."""
    texts = []
    for path in log_files(run_dir):
        try:
            with open(path, "rb") as f:
                texts.append(f.read(_READ_LIMIT).decode("utf-8", errors="replace"))
        except OSError:
            continue
    for pattern in (_EXCEPTION, _LOGGED_ERROR):
        for text in texts:
            for line in text.splitlines():
                if pattern.search(line.strip()):
                    return line.strip()[:MAX_LINE]
    return None


def adapter_refusal(run_dir: Path, merged_probe: dict | None, *, read_logs: bool) -> str | None:
    """The line of an in-job adapter that refused the job's engine: from a rank's probe,
    else, with read_logs (a failed run, or one without a probe: a rank may have been killed
    before it wrote its probe), from the logs; None when none refused."""
    for probe in ((merged_probe or {}).get("ranks") or {}).values():
        line = probe.get(NOT_ACTIVE_KEY) if isinstance(probe, dict) else None
        if isinstance(line, str) and line:
            return line[:MAX_LINE]
    for path in log_files(run_dir) if read_logs else ():
        try:
            with open(path, "rb") as f:
                text = f.read(_READ_LIMIT).decode("utf-8", errors="replace")
        except OSError:
            continue
        if ADAPTER_NOT_ACTIVE not in text:
            continue
        for line in text.splitlines():
            if found := _REFUSAL.search(line.strip()):
                return found.group(1)[:MAX_LINE]
    return None
