"""The first error line of a run that failed before its first step.

A job that never reaches a step (a bad config value, a missing op) usually
says why in one line among hundreds: the message of the exception that ended
it. That line, not "exit code 1", is what a user needs to see first.
"""

from __future__ import annotations

import re
from pathlib import Path

from bisect_prefetch.runs.faults import MAX_LINE, log_files

# A Python exception's message line (`ValueError: 64 is not divisible by 5`), else a logger's
# error line (MindSpore's `[ERROR] ...`, a `- ERROR -` record).
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)\b: \S")
_LOGGED_ERROR = re.compile(r"\[ERROR\]|\bERROR\b")
_READ_LIMIT = 8 * 1024 * 1024  # a run that failed before its first step wrote little


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
