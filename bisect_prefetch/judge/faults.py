"""Which infrastructure fault ended a failed run: the log line that says so.

A run that ends in error, timeout or truncated is read for known signatures
(collective timeouts, out of memory, rendezvous trouble, a lost node, a
signal) in every log file of its run dir: the job's stdout.log/stderr.log and
each rank's own logs (rank_logs/, torchrun's --log-dir, msrun's worker_N.log).
The fault recorded is the first line matching the most telling kind, in the
order of SIGNATURES: a signal comes last because it is usually what a
launcher sends the other ranks after the real failure.

Fault record (journal, run_details): {"kind", "rank", "file", "line_no", "line"};
rank None when neither the line nor the file name says it, file relative to
the run dir, line_no 1-based.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from bisect_prefetch.vocab import RANK_LOG_DIR, STDERR_FILE, STDOUT_FILE

_TIMED_OUT = r"\btime[ds]? ?out\b"  # timeout, timed out, times out
# kind -> pattern over one line (case-insensitive). Order: most telling first. A name
# must stand alone (NCCL\b), so an environment dump (NCCL_TIMEOUT=...) is no fault.
SIGNATURES: dict[str, str] = {
    "nccl-timeout": r"Watchdog caught collective operation timeout|NCCL\b[^\n]*" + _TIMED_OUT,
    "hccl-timeout": r"\bEI0002\b|HCCL\b[^\n]*" + _TIMED_OUT,
    "gloo-timeout": r"gloo\b[^\n]*" + _TIMED_OUT,
    "cuda-oom": r"CUDA out of memory|torch\.OutOfMemoryError|cudaErrorMemoryAllocation",
    "npu-oom": r"NPU out of memory|\bEL0004\b|Out of Memory!+ Request memory size|"
               r"device\(id:\d+\) memory isn't enough",
    "rendezvous-refused": r"Connection refused|ECONNREFUSED",
    "address-in-use": r"Address already in use|EADDRINUSE|server socket has failed to listen",
    "node-failure": r"srun: error: Node failure|\bNODE_FAIL\b|DUE TO NODE FAILURE",
    "signal": r"Signal \d+ \(SIG[A-Z]+\) received|killed by signal|got signal: ?\d+|"
              r"<Signals\.SIG[A-Z]+|exitcode\s*:\s*-\d+|Segmentation fault|Bus error",
}
_COMPILED = {kind: re.compile(pattern, re.IGNORECASE) for kind, pattern in SIGNATURES.items()}

LOG_SUFFIXES = (".log", ".out", ".err", ".txt")
MAX_LINE = 300  # a recorded line is cut to this many characters
_MAX_BYTES = 64 * 1024 * 1024  # the tail of a log this large is what matters

# A rank named by the line ("[rank1]: ..." from torchrun) or the file: rank3.log,
# worker_3.log (msrun), .../attempt_0/3/stderr.log (torchrun --log-dir).
_LINE_RANK = re.compile(r"^\[rank(\d+)\]")
_PATH_RANKS = (re.compile(r"rank[_-]?(\d+)"), re.compile(r"worker_(\d+)"),
               re.compile(r"attempt_\d+/(\d+)/"))


def match_line(line: str) -> str | None:
    """The kind of fault a single log line names, or None."""
    for kind, pattern in _COMPILED.items():
        if pattern.search(line):
            return kind
    return None


def log_files(run_dir: Path) -> list[Path]:
    """Every log a run left: the job's own two first, then the ranks' logs in path order."""
    run_dir = Path(run_dir)
    top = [run_dir / name for name in (STDERR_FILE, STDOUT_FILE) if (run_dir / name).is_file()]
    rest = sorted(
        p for p in run_dir.rglob("*")
        if p.is_file() and p not in top
        and (p.suffix in LOG_SUFFIXES or RANK_LOG_DIR in p.relative_to(run_dir).parts)
    )
    return top + rest


def _rank(line: str, relative: str) -> int | None:
    found = _LINE_RANK.match(line)
    if found:
        return int(found.group(1))
    for pattern in _PATH_RANKS:
        found = pattern.search(relative)
        if found:
            return int(found.group(1))
    return None


def _read(path: Path) -> tuple[str, int]:
    """The text of a log (its tail when huge) and how many lines came before that tail."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            skip = max(0, size - _MAX_BYTES)
            f.seek(0)
            lines_skipped = sum(f.read(min(1 << 20, skip - done)).count(b"\n")
                                for done in range(0, skip, 1 << 20))
            return f.read().decode("utf-8", errors="replace"), lines_skipped
    except OSError:
        return "", 0


def find_fault(run_dir: Path, *, exit_code: int | None = None, reason: str = "",
               killed_by_us: bool = False) -> dict[str, Any] | None:
    """The fault record of a failed run (see the module docstring), or None when nothing names one.

    When no log line matches: the executor's reason (e.g. `Slurm state NODE_FAIL`),
    then a negative exit_code (killed by a signal), with file and line_no None.
    killed_by_us: the tool stopped the job (a timeout), so signals say nothing.
    """
    run_dir = Path(run_dir)
    texts = [(str(p.relative_to(run_dir)), *_read(p)) for p in log_files(run_dir)]
    kinds = {k: p for k, p in _COMPILED.items() if not (killed_by_us and k == "signal")}
    for kind, pattern in kinds.items():
        for relative, text, lines_skipped in texts:
            found = pattern.search(text)
            if found is None:
                continue
            start = text.rfind("\n", 0, found.start()) + 1
            end = text.find("\n", found.end())
            line = text[start:end if end != -1 else len(text)].rstrip("\r")
            line_no = lines_skipped + text.count("\n", 0, start) + 1
            return {"kind": kind, "rank": _rank(line, relative), "file": relative,
                    "line_no": line_no, "line": line.strip()[:MAX_LINE]}
    kind = match_line(reason)
    if kind is not None and kind in kinds:
        return {"kind": kind, "rank": None, "file": None, "line_no": None, "line": reason}
    if exit_code is not None and exit_code < 0 and not killed_by_us:
        return {"kind": "signal", "rank": None, "file": None, "line_no": None,
                "line": f"killed by signal {-exit_code}"}
    return None


def fault_lines(run_records: list[dict[str, Any]], *, limit: int = 10) -> list[str]:
    """`fault in RUN: ...` for the first `limit` runs (journal records) that name a fault."""
    lines = [f"fault in {r.get('run_id')}: {describe(r['fault'])}"
             for r in run_records if isinstance(r.get("fault"), dict)]
    more = len(lines) - limit
    return lines[:limit] + ([f"... and {more} more run(s) with a fault"] if more > 0 else [])


def describe(fault: dict[str, Any]) -> str:
    """One line for the terminal and the reports: `gloo-timeout on rank 0 (stderr.log:13): ...`."""
    where = f" on rank {fault['rank']}" if fault.get("rank") is not None else ""
    place = f" ({fault['file']}:{fault['line_no']})" if fault.get("file") else ""
    return f"{fault['kind']}{where}{place}: {fault['line']}"
