"""Finding and reading a run's metrics files: one file (parse_file), several (load_files,
in worker processes when there is much to read), or run directories (load_run, load_runs)."""

from __future__ import annotations

import multiprocessing
import os
import re
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.metrics.console import ANSI_RE, CONSOLE_FORMATS, parse_console
from bisect_prefetch.metrics.lines import jsonl_reader, parse_jsonl_line, parse_lines, regex_reader
from bisect_prefetch.metrics.trajectory import ParseResult, Trajectory, bounded_lines
from bisect_prefetch.vocab import (
    METRIC_FORMATS,
    METRICS_FILE,
    METRICS_PREFIX,
    RANK_FILE_SUFFIX,
    STDOUT_FILE,
)

FORMATS = METRIC_FORMATS
# Several files are parsed in worker processes only when there is this much to read.
PARALLEL_MIN_BYTES = 16 << 20
DETECT_BYTES = 8 << 20
# msrun's per-worker logs (log_dir/worker_<rank>.log) and MindFormers' own (log/rank_<rank>/info.log).
WORKER_LOG_RE = re.compile(r"worker_(\d+)\.log$")
RANK_DIR_RE = re.compile(r"^rank_(\d+)$")
# torchrun --log-dir D --redirects 3: D/<run id>/attempt_<n>/<local rank>/stdout.log
TORCHRUN_ATTEMPT_RE = re.compile(r"^attempt_(\d+)$")

# --------------------------------------------------------------------------- entry points


def rank_from_path(path: Path) -> int | None:
    """The rank a per-rank log file belongs to, if named so: msrun's worker_<rank>.log, a
    file in MindFormers' rank_<rank>/ log directory, or torchrun's per-rank stdout.log under
    attempt_<n>/<rank>/ (--log-dir with --redirects: one node, so local rank = rank)."""
    path = Path(path)
    if (path.name == STDOUT_FILE and path.parent.name.isdigit()
            and TORCHRUN_ATTEMPT_RE.match(path.parent.parent.name)):
        return int(path.parent.name)
    m = WORKER_LOG_RE.search(path.name) or RANK_DIR_RE.match(path.parent.name)
    return int(m.group(1)) if m else None


def _last_attempt(paths: list[Path]) -> list[Path]:
    """torchrun's logs of its last attempt only (an elastic restart re-runs the steps)."""
    attempts = [m.group(1) for p in paths if (m := TORCHRUN_ATTEMPT_RE.match(p.parent.parent.name))]
    if not attempts:
        return paths
    last = f"attempt_{max(map(int, attempts))}"
    return [p for p in paths if p.parent.parent.name == last]


def parse_file(
    path: str | Path,
    fmt: str,
    *,
    rank: int | None = None,
    pattern: str | None = None,
    names: Sequence[str] | None = None,
    fast: bool = True,
) -> ParseResult:
    """Parse one log file in format `fmt`, streaming.

    rank: for console logs, the rank of the file (default: from worker_<rank>.log, else 0);
    for jsonl, the rank of lines that carry none. names: the metrics to keep (console
    formats default to loss and grad_norm; jsonl and regex keep every metric). fast=False
    forces the line-by-line path (tests compare the two).
    """
    path = Path(path)
    if fmt not in FORMATS:
        raise BisectPrefetchError(f"unknown metrics format {fmt!r} (known: {', '.join(FORMATS)})")
    if not path.is_file():
        raise BisectPrefetchError(f"metrics file not found: {path}")
    if rank is None:
        rank = rank_from_path(path)
    if fmt == "jsonl":
        return parse_lines(path, fmt, jsonl_reader(rank, rankless=None), names)
    if fmt == "regex":
        if not pattern:
            raise BisectPrefetchError("format regex needs a pattern with named groups")
        return parse_lines(path, fmt, regex_reader(pattern, rank), names)
    return parse_console(path, fmt, names=names, rank=rank or 0, fast=fast)


def sample_lines(path: Path) -> Iterator[bytes]:
    """The lines detection looks at: the first DETECT_BYTES of lines up to MAX_LINE_BYTES;
    longer lines are read past (never held) and do not use up the sample."""
    with open(path, "rb") as f:
        seen = 0
        for line in bounded_lines(f):
            if line is None:
                continue
            yield line
            seen += len(line)
            if seen > DETECT_BYTES:
                return


def detect_format(path: str | Path) -> str:
    """Guess a log file's format from its first metric line (jsonl, mindformers, ...)."""
    path = Path(path)
    if not path.is_file():
        raise BisectPrefetchError(f"metrics file not found: {path}")
    candidates = [
        (name, CONSOLE_FORMATS[name].step_re, [k for n in ("loss", "grad_norm") for k in CONSOLE_FORMATS[name].key_res(n)])
        for name in ("mindformers", "megatron", "torchtitan")
    ]
    for line in sample_lines(path):
        stripped = ANSI_RE.sub(b"", line) if b"\x1b" in line else line
        if stripped.lstrip().startswith(b"{") and parse_jsonl_line(stripped) is not None:
            return "jsonl"
        for name, step_re, keys in candidates:
            m = step_re.search(stripped)
            if m and m.group(1) and any(key.search(m.group(2)) for key in keys):
                return name
    raise BisectPrefetchError(
        f"cannot tell the metrics format of {path}: no jsonl, mindformers, megatron or "
        "torchtitan metric line found (pass --format, or format regex with a pattern)"
    )


def _parse_job(args: tuple) -> ParseResult:
    path, fmt, pattern, names = args
    return parse_file(path, fmt, pattern=pattern, names=names)


def _can_fork() -> bool:
    # Forking a process that runs other threads can deadlock the child.
    return "fork" in multiprocessing.get_all_start_methods() and threading.active_count() == 1


def load_files(
    paths: Sequence[str | Path],
    fmt: str | None = None,
    *,
    names: Sequence[str] | None = None,
    pattern: str | None = None,
    workers: int | None = None,
) -> Trajectory:
    """Parse several files of one run (e.g. one per rank) into one Trajectory.

    Big multi-file runs are parsed in worker processes (one per CPU core); workers=1
    forces a single process.
    """
    return _load_groups([paths], fmt, names=names, pattern=pattern, workers=workers)[0]


def _load_groups(
    groups: Sequence[Sequence[str | Path]],
    fmt: str | None,
    *,
    names: Sequence[str] | None,
    pattern: str | None,
    workers: int | None,
) -> list[Trajectory]:
    """One Trajectory per group of files (a run), every file of every group parsed in one
    pool, so that the runs of a comparison share the cores instead of taking turns."""
    groups = [[Path(p) for p in paths] for paths in groups]
    if not all(groups):
        raise BisectPrefetchError("no metrics files to read")
    jobs = []
    for paths in groups:
        group_fmt = fmt or detect_format(paths[0])
        jobs += [(p, group_fmt, pattern, list(names) if names else None) for p in paths]
    if workers is None:
        big = sum(job[0].stat().st_size for job in jobs if job[0].is_file()) >= PARALLEL_MIN_BYTES
        workers = min(len(jobs), os.cpu_count() or 1) if big else 1
    if workers > 1 and len(jobs) > 1 and _can_fork():
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            results = list(pool.map(_parse_job, jobs))
    else:
        results = [_parse_job(job) for job in jobs]
    trajectories, start = [], 0
    for paths in groups:
        trajectories.append(Trajectory.from_results(results[start : start + len(paths)]))
        start += len(paths)
    return trajectories


def run_files(path: str | Path, fmt: str | None = None) -> list[Path]:
    """The metrics files of a run directory: each rank's metrics.rank<R>.jsonl (else metrics.jsonl), per-rank logs (worker_<rank>.log,
    else rank_<rank>/info.log, else torchrun's attempt_<n>/<rank>/stdout.log), or stdout.log. Per-rank logs come before stdout.log, where
    a launcher may interleave the lines of several ranks with nothing to tell them apart."""
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise BisectPrefetchError(f"no such run directory or log file: {path}")
    if fmt in (None, "jsonl") and (jsonl := jsonl_files(path)):
        return jsonl
    for pattern in ("worker_*.log", "rank_*/info.log", "attempt_*/*/stdout.log"):
        per_rank = _last_attempt([p for p in path.rglob(pattern) if rank_from_path(p) is not None])
        if per_rank:
            return sorted(per_rank, key=lambda p: (rank_from_path(p), str(p)))
    stdout = path / STDOUT_FILE
    if stdout.is_file():
        return [stdout]
    raise BisectPrefetchError(
        f"no metrics in run directory {path}: expected metrics.rank<R>.jsonl or metrics.jsonl, worker_<rank>.log files, "
        "rank_<rank>/info.log files or stdout.log"
    )


def jsonl_files(run_dir: Path) -> list[Path]:
    """The jsonl metrics of a run dir: each rank's metrics.rank<R>.jsonl (report_step), else
    the one metrics.jsonl a job wrote itself (or an older run dir's)."""
    ranks = sorted(run_dir.glob(f"{METRICS_PREFIX}*{RANK_FILE_SUFFIX}"), key=lambda p: (len(p.name), p.name))
    if ranks:
        return ranks
    shared = run_dir / METRICS_FILE
    return [shared] if shared.is_file() else []


def metric_files(run_dir: Path, fmt: str | None, files: str | None) -> list[Path]:
    """The files a run's metrics are read from: the `metrics.files` glob under its dir, else
    those of run_files (none while it has none). The one rule, live and afterwards."""
    if files:
        return sorted(p for p in Path(run_dir).glob(files) if p.is_file())
    try:
        return run_files(run_dir, fmt)
    except BisectPrefetchError:
        return []


def load_run(
    path: str | Path,
    fmt: str | None = None,
    names: Sequence[str] | None = None,
    *,
    pattern: str | None = None,
    workers: int | None = None,
) -> Trajectory:
    """A run directory or a single log file -> Trajectory (format detected unless given)."""
    return load_runs([path], fmt, names, pattern=pattern, workers=workers)[0]


def load_runs(
    paths: Sequence[str | Path],
    fmt: str | None = None,
    names: Sequence[str] | None = None,
    *,
    pattern: str | None = None,
    workers: int | None = None,
) -> list[Trajectory]:
    """Several runs (directories or log files) -> one Trajectory each, their files parsed
    together (see load_files); each run's format is detected from its own files unless given."""
    groups = [run_files(path, fmt) for path in paths]
    return _load_groups(groups, fmt, names=names, pattern=pattern, workers=workers)
