"""Whether bisect-prefetch itself failed inside a run's job, and where its rank says so.

The in-job code (adapters/) must never end a job, and says where it failed instead: the op
tracer stops tracing and writes ``op_trace.failed`` into the rank's probe, with a line on
the rank's stderr. Where it ended the job anyway, the job's log holds a Python traceback
whose innermost frame is the in-job code's. Either way that is the tool's failure, not the
user's input: `explain` says so (exit 3) with the rank's log.

Record: ``{"rank": R | None, "what": one line, "log": path[:line]}``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from bisect_prefetch.judge.faults import log_files
from bisect_prefetch.vocab import probe_rank_file

# The in-job code as the job runs it (a copy in the run dir: runs/job_path.py).
_IN_JOB = re.compile(r'File "[^"]*[/\\]bisect_prefetch[/\\]adapters[/\\][^"]+"')
_FRAME = re.compile(r'File "[^"]+", line \d+')
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception)\b:? ?")
_PREFIX = re.compile(r"^\[rank(\d+)\]:\s?")  # torchrun's prefix of a rank's lines
_TRACER_NOTE = "bisect-prefetch: op trace stopped"  # adapters/op_trace.py's line
_READ_LIMIT = 16 * 1024 * 1024


def tool_failure(run_dir: Path) -> dict[str, Any] | None:
    """The first place the tool failed inside the run's job (see the module docstring)."""
    run_dir = Path(run_dir)
    for path in sorted(run_dir.glob(probe_rank_file("*"))):
        try:
            trace = (json.loads(path.read_text()).get("op_trace") or {})
        except (OSError, ValueError, AttributeError):
            continue
        if trace.get("failed"):
            rank = _rank_of(path.name)
            return {"rank": rank, "what": f"the op tracer failed at {trace['failed']}",
                    "log": _line_with(run_dir, _TRACER_NOTE, rank) or str(path)}
    return _traceback_in_job_code(run_dir)


def _rank_of(name: str) -> int | None:
    found = re.search(r"rank(\d+)", name)
    return int(found.group(1)) if found else None


def _lines(run_dir: Path) -> list[tuple[Path, list[str]]]:
    found = []
    for path in log_files(run_dir):
        try:
            with open(path, "rb") as f:
                text = f.read(_READ_LIMIT).decode("utf-8", errors="replace")
        except OSError:
            continue
        found.append((path, text.splitlines()))
    return found


def _line_with(run_dir: Path, needle: str, rank: int | None) -> str | None:
    """path:line of the first log line holding needle (that rank's, where it says)."""
    for path, lines in _lines(run_dir):
        for k, line in enumerate(lines, 1):
            prefix = _PREFIX.match(line)
            if needle in line and (rank is None or prefix is None or int(prefix.group(1)) == rank):
                return f"{path}:{k}"
    return None


def _traceback_in_job_code(run_dir: Path) -> dict[str, Any] | None:
    """A traceback whose innermost frame is the in-job code's: its exception line."""
    for path, lines in _lines(run_dir):
        innermost: dict[int | None, bool] = {}  # per rank: the last frame was the tool's
        for k, line in enumerate(lines, 1):
            prefix = _PREFIX.match(line)
            rank = int(prefix.group(1)) if prefix else _rank_of(str(path.relative_to(run_dir)))
            body = line[prefix.end():] if prefix else line
            if _FRAME.search(body):
                innermost[rank] = bool(_IN_JOB.search(body))
            elif innermost.get(rank) and _EXCEPTION.match(body.strip()):
                return {"rank": rank, "what": body.strip()[:300], "log": f"{path}:{k}"}
    return None
