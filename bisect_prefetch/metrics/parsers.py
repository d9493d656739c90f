"""Reading training metrics from logs: one parser per real log format, and trajectories.

A record is ``(rank, step, {metric: float})``. Parsers stream a file in chunks and keep
only the numbers (per rank and metric, as numpy columns), so memory grows with the
number of steps, never with the size of the log. A parser never guesses silently: a line
that mentions the format's marker but cannot be read is counted (``lines_unread``, with a
few samples); a file with no metrics at all raises BisectPrefetchError.

Console formats (mindformers, torchtitan, megatron) share one engine. Each format names a
marker literal, a step regex that captures ``(step, rest of line)``, and how a metric key
looks. A chunk is read with a few C-speed regex passes (the fast path) when counts prove
every marker line was parsed and every metric key appears on all lines or on none;
otherwise the chunk is read line by line with the same regexes (the slow path), which
gives identical results and exact counts.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bisect_prefetch.errors import BisectPrefetchError

FORMATS = ("jsonl", "mindformers", "torchtitan", "megatron", "regex")
Record = tuple[int, int, dict[str, float]]

CHUNK_BYTES = 4 << 20
# Several files are parsed in worker processes only when there is this much to read.
PARALLEL_MIN_BYTES = 16 << 20
UNREAD_SAMPLES = 5
DETECT_BYTES = 8 << 20

ANSI_RE = re.compile(rb"\x1b\[[0-9;]*[A-Za-z]")
WORKER_LOG_RE = re.compile(r"worker_(\d+)\.log$")


# --------------------------------------------------------------------------- series


class Series(Mapping[int, float]):
    """One metric on one rank: a read-only mapping step -> value over numpy columns."""

    __slots__ = ("steps", "values")

    def __init__(self, steps: Sequence[int] | np.ndarray, values: Sequence[float] | np.ndarray):
        steps = np.asarray(steps, dtype=np.int64)
        values = np.asarray(values, dtype=np.float64)
        if steps.shape != values.shape or steps.ndim != 1:
            raise ValueError("steps and values must be 1-d and of equal length")
        if len(steps) > 1 and not bool(np.all(steps[1:] > steps[:-1])):
            # A resumed run prints steps again: the value written last wins.
            order = np.argsort(steps, kind="stable")
            steps, values = steps[order], values[order]
            last = np.append(steps[1:] != steps[:-1], True)
            steps, values = steps[last], values[last]
        self.steps = steps
        self.values = values

    @classmethod
    def from_mapping(cls, values: Mapping[int, float]) -> Series:
        return cls(list(values.keys()), list(values.values()))

    def __getitem__(self, step: int) -> float:
        i = int(np.searchsorted(self.steps, step))
        if i == len(self.steps) or self.steps[i] != step:
            raise KeyError(step)
        return float(self.values[i])

    def __iter__(self) -> Iterator[int]:
        return iter(self.steps.tolist())

    def __len__(self) -> int:
        return len(self.steps)

    def __repr__(self) -> str:
        return f"Series({len(self)} steps)"


EMPTY_SERIES = Series([], [])


# --------------------------------------------------------------------------- parse result


@dataclass
class ParseResult:
    """What one file held: per rank and metric a Series, plus honest counters."""

    path: Path
    fmt: str
    series: dict[int, dict[str, Series]] = field(default_factory=dict)
    lines_read: int = 0  # metric lines parsed
    lines_unread: int = 0  # lines that mention the marker but could not be read
    lines_skipped: int = 0  # other output (warnings, banners, ...)
    values_not_numeric: int = 0  # a metric key with no number, e.g. `loss: N/A (...)`
    unread_samples: list[tuple[int, str]] = field(default_factory=list)  # (line number, text)

    def records(self) -> Iterator[Record]:
        """Yield (rank, step, {metric: value}) in rank, then step order."""
        for rank in sorted(self.series):
            by_step: dict[int, dict[str, float]] = {}
            for name, s in self.series[rank].items():
                for step, value in zip(s.steps.tolist(), s.values.tolist(), strict=True):
                    by_step.setdefault(step, {})[name] = value
            for step in sorted(by_step):
                yield rank, step, by_step[step]

    @property
    def metric_names(self) -> list[str]:
        return _names_in_order(self.series.values())


class _Columns:
    """Accumulates (step, value) pieces per rank and metric; builds Series at the end."""

    def __init__(self) -> None:
        self.parts: dict[tuple[int, str], tuple[list[np.ndarray], list[np.ndarray]]] = {}
        self.order: list[tuple[int, str]] = []

    def add(self, rank: int, name: str, steps: np.ndarray, values: np.ndarray) -> None:
        if len(steps) == 0:
            return
        key = (rank, name)
        if key not in self.parts:
            self.parts[key] = ([], [])
            self.order.append(key)
        self.parts[key][0].append(steps)
        self.parts[key][1].append(values)

    def add_lists(self, rank: int, name: str, steps: list[int], values: list[float]) -> None:
        self.add(rank, name, np.array(steps, dtype=np.int64), np.array(values, dtype=np.float64))

    def build(self) -> dict[int, dict[str, Series]]:
        out: dict[int, dict[str, Series]] = {}
        for rank, name in self.order:
            steps, values = self.parts[(rank, name)]
            out.setdefault(rank, {})[name] = Series(np.concatenate(steps), np.concatenate(values))
        return out


class _Counts:
    def __init__(self) -> None:
        self.read = self.unread = self.skipped = self.not_numeric = 0
        self.samples: list[tuple[int, str]] = []

    def unread_line(self, number: int, line: bytes) -> None:
        self.unread += 1
        if len(self.samples) < UNREAD_SAMPLES:
            self.samples.append((number, line.decode("utf-8", "replace").rstrip()[:200]))


# --------------------------------------------------------------------------- console formats


def _float_or_none(token: bytes) -> float | None:
    try:
        return float(token)
    except ValueError:
        return None


def _to_floats(tokens: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray | None]:
    """Tokens -> float64 array; the mask of numeric tokens, or None when all are numeric."""
    try:
        return np.array(tokens, dtype=np.float64), None  # float() on each token, in C
    except ValueError:
        values = np.empty(len(tokens), dtype=np.float64)
        ok = np.ones(len(tokens), dtype=bool)
        for i, token in enumerate(tokens):
            v = _float_or_none(token)
            if v is None:
                ok[i] = False
                values[i] = 0.0
            else:
                values[i] = v
        return values, ok


@dataclass(frozen=True)
class ConsoleFormat:
    """How one console log format prints a metric line.

    step_re starts with the marker literal and makes everything after it optional, so it
    matches at the first marker of every line that has one, and runs to the end of the
    line. Group 1 is the step (empty when the marker is not followed by one: the line is
    unread), group 2 the rest of the line.
    """

    name: str
    marker: bytes
    step_re: re.Pattern[bytes]
    default_names: tuple[str, ...]
    strip_ansi: bool = False

    def key_re(self, metric: str) -> re.Pattern[bytes]:
        """A regex that finds `metric`'s value (group 1) and runs to the end of the line."""
        key = re.escape(metric.encode())
        # The literal key comes first so re can search for it fast; the lookbehind makes it
        # a whole word (load_balancing_loss: is not loss:).
        return re.compile(key + rb":(?<!\w" + key + rb":) *([^\s,}|]*)[^\n]*")


@dataclass(frozen=True)
class MegatronFormat(ConsoleFormat):
    # Megatron names its metrics with spaces (`lm loss`, `grad norm`); fields sit between `|`.
    aliases: tuple[tuple[str, str], ...] = (("loss", "lm loss"), ("grad_norm", "grad norm"))

    def key_re(self, metric: str) -> re.Pattern[bytes]:
        key = dict(self.aliases).get(metric, metric.replace("_", " "))
        return re.compile(rb"\| " + re.escape(key.encode()) + rb": *([^\s|]*)[^\n]*")


CONSOLE_FORMATS: dict[str, ConsoleFormat] = {
    # { step:[    1/   10], consumed_samples: 2, ..., loss:  11.854254, ..., grad_norm:  13.83, ... }
    "mindformers": ConsoleFormat(
        "mindformers", b"step:[", re.compile(rb"step:\[(?: *(\d+) */)?([^\n]*)"), ("loss", "grad_norm")
    ),
    # step:  1  loss: 12.2345  grad_norm:  3.4567  memory: ...   (ANSI colours stripped first)
    "torchtitan": ConsoleFormat(
        "torchtitan",
        b"step:",
        re.compile(rb"step:(?:(?<!\wstep:) *(\d+)(?![\d.]))?([^\n]*)"),
        ("loss", "grad_norm"),
        strip_ansi=True,
    ),
    #  iteration        1/     100 | consumed samples: ... | lm loss: 1.034567E+01 | grad norm: 2.3 |
    "megatron": MegatronFormat(
        "megatron",
        b" iteration ",
        re.compile(rb" iteration (?: *(\d+) */)?([^\n]*)"),
        ("loss", "grad_norm"),
    ),
}


def _iter_chunks(path: Path) -> Iterator[bytes]:
    """Whole lines in blocks of about CHUNK_BYTES; the last one may lack its newline."""
    with open(path, "rb") as f:
        rest = b""
        while True:
            block = f.read(CHUNK_BYTES)
            if not block:
                if rest:
                    yield rest
                return
            block = rest + block
            cut = block.rfind(b"\n") + 1
            if cut == 0:
                rest = block
                continue
            rest = block[cut:]
            yield block[:cut]


def _line_count(chunk: bytes) -> int:
    return chunk.count(b"\n") + (0 if chunk.endswith(b"\n") else 1)


class _ConsoleParser:
    def __init__(self, fmt: ConsoleFormat, names: Sequence[str], rank: int):
        self.fmt = fmt
        self.names = list(names)
        self.keys = [fmt.key_re(n) for n in self.names]
        self.rank = rank
        self.columns = _Columns()
        self.counts = _Counts()
        self.line_number = 0  # lines before the current chunk

    def feed(self, chunk: bytes, *, allow_fast: bool = True) -> None:
        if self.fmt.strip_ansi and b"\x1b" in chunk:
            chunk = ANSI_RE.sub(b"", chunk)
        lines = _line_count(chunk)
        if not (allow_fast and self._fast(chunk, lines)):
            self._slow(chunk)
        self.line_number += lines

    def _fast(self, chunk: bytes, lines: int) -> bool:
        matches = self.fmt.step_re.findall(chunk)
        n = len(matches)
        if n == 0:
            return False
        steps_tokens, tails = zip(*matches, strict=True)
        if b"" in steps_tokens:  # a marker without a step: an unread line
            return False
        blob = b"\n".join(tails)
        found = [key.findall(blob) for key in self.keys]
        # Each key regex runs to the end of its line, so it matches at most once a line;
        # n matches mean every line has it, 0 mean none has it. Anything else: slow path.
        if any(len(tokens) not in (0, n) for tokens in found):
            return False
        if not any(len(tokens) == n for tokens in found):
            return False
        steps = np.array(steps_tokens, dtype=np.int64)
        for name, tokens in zip(self.names, found, strict=True):
            if not tokens:
                continue
            values, ok = _to_floats(tokens)
            if ok is None:
                self.columns.add(self.rank, name, steps, values)
            else:
                self.counts.not_numeric += int(n - ok.sum())
                self.columns.add(self.rank, name, steps[ok], values[ok])
        self.counts.read += n
        self.counts.skipped += lines - n
        return True

    def _slow(self, chunk: bytes) -> None:
        steps: dict[str, list[int]] = {n: [] for n in self.names}
        values: dict[str, list[float]] = {n: [] for n in self.names}
        lines = chunk.split(b"\n")
        if chunk.endswith(b"\n"):
            lines.pop()
        for i, line in enumerate(lines):
            number = self.line_number + i + 1
            m = self.fmt.step_re.search(line)
            if m is None:
                self.counts.skipped += 1
                continue
            if not m.group(1):
                self.counts.unread_line(number, line)
                continue
            step, tail = int(m.group(1)), m.group(2)
            any_key = False
            for name, key in zip(self.names, self.keys, strict=True):
                km = key.search(tail)
                if km is None:
                    continue
                any_key = True
                value = _float_or_none(km.group(1))
                if value is None:
                    self.counts.not_numeric += 1
                else:
                    steps[name].append(step)
                    values[name].append(value)
            if any_key:
                self.counts.read += 1
            else:
                self.counts.unread_line(number, line)  # e.g. a line cut off mid-write
        for name in self.names:
            self.columns.add_lists(self.rank, name, steps[name], values[name])


# --------------------------------------------------------------------------- jsonl and regex


def parse_jsonl_line(line: str | bytes, *, rank: int | None = None) -> Record | None:
    """One recorder line -> (rank, step, {metric: value}); None when it is not a metric line.

    Accepts the NaN/Infinity tokens Python's json.dumps writes. Metrics are the numeric
    fields other than step and rank.
    """
    fields = _jsonl_fields(line, rank)
    if fields is None:
        return None
    line_rank, step, metrics = fields
    return line_rank, step, {k: v for k, v in metrics.items() if v is not None}


def _jsonl_fields(line: str | bytes, rank: int | None) -> tuple[int, int, dict[str, float | None]] | None:
    """Like parse_jsonl_line, but non-numeric fields are kept as None (to count them)."""
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    step = obj.get("step")
    if not isinstance(step, int) or isinstance(step, bool):
        return None
    line_rank = obj.get("rank", rank if rank is not None else 0)
    if not isinstance(line_rank, int) or isinstance(line_rank, bool):
        return None
    metrics = {
        k: float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None
        for k, v in obj.items()
        if k not in ("step", "rank")
    }
    return line_rank, step, metrics


def _parse_lines(path: Path, fmt: str, read_line, names: Sequence[str] | None) -> ParseResult:
    """Line-by-line parsing for jsonl and regex: read_line(raw) -> Record | None | 'unread'.

    A value of None in a record is a field that is not a number: for a requested metric
    (or any regex group) it is counted, like `loss: N/A`.
    """
    counts = _Counts()
    steps: dict[tuple[int, str], list[int]] = {}
    values: dict[tuple[int, str], list[float]] = {}
    wanted = set(names) if names else None
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                counts.skipped += 1
                continue
            record = read_line(raw)
            if record is None:
                counts.skipped += 1
                continue
            if record == "unread":
                counts.unread_line(number, raw)
                continue
            rank, step, metrics = record
            if wanted is not None:
                metrics = {k: v for k, v in metrics.items() if k in wanted}
            if wanted is not None or fmt == "regex":
                counts.not_numeric += sum(1 for v in metrics.values() if v is None)
            # Unrequested non-numeric jsonl fields (an event name, a tag) are simply not metrics.
            metrics = {k: v for k, v in metrics.items() if v is not None}
            if not metrics:
                counts.unread_line(number, raw)
                continue
            counts.read += 1
            for name, value in metrics.items():
                key = (rank, name)
                if key not in steps:
                    steps[key], values[key] = [], []
                steps[key].append(step)
                values[key].append(value)
    columns = _Columns()
    for key in steps:
        columns.add_lists(key[0], key[1], steps[key], values[key])
    return _result(path, fmt, columns, counts, names)


def _jsonl_reader(rank: int | None):
    def read_line(raw: bytes):
        record = _jsonl_fields(raw, rank)
        return "unread" if record is None else record

    return read_line


def _regex_reader(pattern: str, rank: int | None):
    try:
        compiled = re.compile(pattern)
    except re.error as e:
        raise BisectPrefetchError(f"bad metrics pattern {pattern!r}: {e}") from e
    groups = list(compiled.groupindex)
    if "step" not in groups:
        raise BisectPrefetchError(f"metrics pattern {pattern!r} needs a named group 'step'")
    metric_groups = [g for g in groups if g not in ("step", "rank")]

    def read_line(raw: bytes):
        m = compiled.search(raw.decode("utf-8", "replace"))
        if m is None:
            return None
        try:
            step = int(m.group("step"))
            line_rank = int(m.group("rank")) if m.groupdict().get("rank") else rank or 0
        except ValueError:
            return "unread"
        metrics: dict[str, float | None] = {}
        for g in metric_groups:
            text = m.group(g)
            if text is not None:
                metrics[g] = _float_or_none(text.encode())
        return line_rank, step, metrics

    return read_line


# --------------------------------------------------------------------------- entry points


def rank_from_path(path: Path) -> int | None:
    """The rank a per-rank log file belongs to (msrun's worker_<rank>.log), if named so."""
    m = WORKER_LOG_RE.search(Path(path).name)
    return int(m.group(1)) if m else None


def _result(
    path: Path, fmt: str, columns: _Columns, counts: _Counts, names: Sequence[str] | None = None
) -> ParseResult:
    result = ParseResult(
        path=path,
        fmt=fmt,
        series=columns.build(),
        lines_read=counts.read,
        lines_unread=counts.unread,
        lines_skipped=counts.skipped,
        values_not_numeric=counts.not_numeric,
        unread_samples=counts.samples,
    )
    if not any(result.series.values()):
        wanted = f", metrics {', '.join(names)}" if names else ""
        detail = f"; {counts.unread} unreadable line(s), first: {counts.samples[0][1]!r}" if counts.samples else ""
        raise BisectPrefetchError(f"no metrics found in {path} (format {fmt}{wanted}){detail}")
    return result


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
        return _parse_lines(path, fmt, _jsonl_reader(rank), names)
    if fmt == "regex":
        if not pattern:
            raise BisectPrefetchError("format regex needs a pattern with named groups")
        return _parse_lines(path, fmt, _regex_reader(pattern, rank), names)
    console = CONSOLE_FORMATS[fmt]
    parser = _ConsoleParser(console, names or console.default_names, rank or 0)
    for chunk in _iter_chunks(path):
        parser.feed(chunk, allow_fast=fast)
    return _result(path, fmt, parser.columns, parser.counts, parser.names)


def _sample_lines(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as f:
        seen = 0
        for line in f:
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
        (name, CONSOLE_FORMATS[name].step_re, [CONSOLE_FORMATS[name].key_re(n) for n in ("loss", "grad_norm")])
        for name in ("mindformers", "megatron", "torchtitan")
    ]
    for line in _sample_lines(path):
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


# --------------------------------------------------------------------------- trajectories


def _names_in_order(groups: Iterable[Mapping[str, object]]) -> list[str]:
    names: dict[str, None] = {}
    for group in groups:
        names.update(dict.fromkeys(group))
    return list(names)


class Trajectory(Mapping[str, Series]):
    """A run's metrics: metric -> Series of the metrics rank, with every rank kept.

    The metrics rank is the lowest rank whose lines carry a loss (non-last pipeline stages
    print `loss: N/A`, so they are never it); a metric that rank lacks comes from the lowest
    rank that has it. `per_rank` holds everything that was read.
    """

    def __init__(
        self,
        per_rank: Mapping[int, Mapping[str, Series]],
        *,
        sources: Sequence[str] = (),
        lines_read: int = 0,
        lines_unread: int = 0,
        unread_samples: Sequence[tuple[str, int, str]] = (),
    ):
        self.per_rank: dict[int, dict[str, Series]] = {
            r: dict(m) for r, m in sorted(per_rank.items()) if m
        }
        self.sources = list(sources)
        self.lines_read = lines_read
        self.lines_unread = lines_unread
        self.unread_samples = list(unread_samples)  # (file, line number, text)
        ranks = (
            [r for r, m in self.per_rank.items() if "loss" in m]
            or [r for r, m in self.per_rank.items() if any(n.endswith("_loss") for n in m)]
            or list(self.per_rank)
        )
        self.metrics_rank: int | None = ranks[0] if ranks else None
        self.series_rank: dict[str, int] = {}
        for name in _names_in_order(self.per_rank.values()):
            if self.metrics_rank is not None and name in self.per_rank[self.metrics_rank]:
                self.series_rank[name] = self.metrics_rank
            else:
                self.series_rank[name] = min(r for r, m in self.per_rank.items() if name in m)

    @classmethod
    def from_mapping(cls, metrics: Mapping[str, Mapping[int, float]], *, rank: int = 0) -> Trajectory:
        """A one-rank trajectory from {metric: {step: value}}."""
        return cls({rank: {n: Series.from_mapping(v) for n, v in metrics.items()}})

    @classmethod
    def from_records(cls, records: Iterable[Record]) -> Trajectory:
        steps: dict[tuple[int, str], list[int]] = {}
        values: dict[tuple[int, str], list[float]] = {}
        for rank, step, metrics in records:
            for name, value in metrics.items():
                steps.setdefault((rank, name), []).append(step)
                values.setdefault((rank, name), []).append(value)
        per_rank: dict[int, dict[str, Series]] = {}
        for (rank, name), s in steps.items():
            per_rank.setdefault(rank, {})[name] = Series(s, values[(rank, name)])
        return cls(per_rank)

    @classmethod
    def from_results(cls, results: Iterable[ParseResult]) -> Trajectory:
        per_rank: dict[int, dict[str, Series]] = {}
        results = list(results)
        for result in results:
            for rank, metrics in result.series.items():
                for name, s in metrics.items():
                    if name in per_rank.get(rank, {}):
                        old = per_rank[rank][name]
                        s = Series(np.concatenate([old.steps, s.steps]), np.concatenate([old.values, s.values]))
                    per_rank.setdefault(rank, {})[name] = s
        samples = [(str(r.path), n, text) for r in results for n, text in r.unread_samples]
        return cls(
            per_rank,
            sources=[str(r.path) for r in results],
            lines_read=sum(r.lines_read for r in results),
            lines_unread=sum(r.lines_unread for r in results),
            unread_samples=samples[:UNREAD_SAMPLES],
        )

    def __getitem__(self, name: str) -> Series:
        return self.per_rank[self.series_rank[name]][name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.series_rank)

    def __len__(self) -> int:
        return len(self.series_rank)

    @property
    def ranks(self) -> list[int]:
        return list(self.per_rank)

    def ranks_with(self, name: str) -> list[int]:
        return [r for r, m in self.per_rank.items() if name in m]

    def __repr__(self) -> str:
        return f"Trajectory({list(self)}, ranks={self.ranks}, metrics_rank={self.metrics_rank})"


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
    paths = [Path(p) for p in paths]
    if not paths:
        raise BisectPrefetchError("no metrics files to read")
    fmt = fmt or detect_format(paths[0])
    jobs = [(p, fmt, pattern, list(names) if names else None) for p in paths]
    if workers is None:
        big = sum(p.stat().st_size for p in paths if p.is_file()) >= PARALLEL_MIN_BYTES
        workers = min(len(paths), os.cpu_count() or 1) if big else 1
    if workers > 1 and len(paths) > 1 and _can_fork():
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            results = list(pool.map(_parse_job, jobs))
    else:
        results = [_parse_job(job) for job in jobs]
    return Trajectory.from_results(results)


def run_files(path: str | Path, fmt: str | None = None) -> list[Path]:
    """The metrics files of a run directory: metrics.jsonl, worker_<rank>.log files, or stdout.log."""
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise BisectPrefetchError(f"no such run directory or log file: {path}")
    jsonl = path / "metrics.jsonl"
    if fmt in (None, "jsonl") and jsonl.is_file():
        return [jsonl]
    workers = [p for p in path.rglob("worker_*.log") if rank_from_path(p) is not None]
    if workers:
        workers.sort(key=lambda p: (rank_from_path(p), str(p)))
        return workers
    stdout = path / "stdout.log"
    if stdout.is_file():
        return [stdout]
    raise BisectPrefetchError(
        f"no metrics in run directory {path}: expected metrics.jsonl, worker_<rank>.log files or stdout.log"
    )


def load_run(
    path: str | Path,
    fmt: str | None = None,
    names: Sequence[str] | None = None,
    *,
    pattern: str | None = None,
    workers: int | None = None,
) -> Trajectory:
    """A run directory or a single log file -> Trajectory (format detected unless given)."""
    files = run_files(path, fmt)
    return load_files(files, fmt, names=names, pattern=pattern, workers=workers)
