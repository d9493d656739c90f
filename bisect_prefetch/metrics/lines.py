"""Line-by-line formats: the recorder's jsonl and a user's regex with named groups."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.metrics.console import INT64_MAX, INT64_MIN, float_or_none
from bisect_prefetch.metrics.trajectory import (
    Columns,
    Counts,
    ParseResult,
    Record,
    bounded_lines,
    build_result,
)

# --------------------------------------------------------------------------- jsonl and regex


def fits_int64(value: object) -> bool:
    """An int (not a bool) that numpy's int64 columns hold: a larger step is an unread line."""
    return isinstance(value, int) and not isinstance(value, bool) and INT64_MIN <= value <= INT64_MAX


def parse_jsonl_line(line: str | bytes, *, rank: int | None = None) -> Record | None:
    """One recorder line -> (rank, step, {metric: value}); None when it is not a metric line.

    Accepts the NaN/Infinity tokens Python's json.dumps writes. Metrics are the numeric
    fields other than step and rank.
    """
    fields = jsonl_fields(line, rank)
    if fields is None:
        return None
    line_rank, step, metrics = fields
    return line_rank, step, {k: v for k, v in metrics.items() if v is not None}


def jsonl_fields(line: str | bytes, rank: int | None,
                 rankless: int | None = 0) -> tuple[int | None, int, dict[str, float | None]] | None:
    """Like parse_jsonl_line, but non-numeric fields are kept as None (to count them).

    A line without a rank field is the file's rank's (rank), else rankless's (None: left
    for the caller to decide, once it knows whether other lines name their rank)."""
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    step = obj.get("step")
    if not fits_int64(step):
        return None
    line_rank = obj.get("rank", rank if rank is not None else rankless)
    if line_rank is not None and not fits_int64(line_rank):
        return None
    metrics = {
        k: float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None
        for k, v in obj.items()
        if k not in ("step", "rank")
    }
    return line_rank, step, metrics


def parse_lines(path: Path, fmt: str, read_line, names: Sequence[str] | None) -> ParseResult:
    """Line-by-line parsing for jsonl and regex: read_line(raw) -> Record | None | 'unread'.

    A value of None in a record is a field that is not a number: for a requested metric
    (or any regex group) it is counted, like `loss: N/A`.
    """
    counts = Counts()
    steps: dict[tuple[int, str], list[int]] = {}
    values: dict[tuple[int, str], list[float]] = {}
    wanted = set(names) if names else None
    # Lines without a rank (read_line gave None): rank 0's only when no line names one.
    rankless: list[tuple[int, bytes, int, dict[str, float]]] = []
    named_rank = False
    with open(path, "rb") as f:
        for number, raw in enumerate(bounded_lines(f), start=1):
            if raw is None:
                counts.long_line(number)
                continue
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
            if rank is None:
                rankless.append((number, raw, step, metrics))
                continue
            named_rank = True
            counts.read += 1
            for name, value in metrics.items():
                key = (rank, name)
                if key not in steps:
                    steps[key], values[key] = [], []
                steps[key].append(step)
                values[key].append(value)
    for number, raw, step, metrics in rankless:
        if named_rank:  # never taken as rank 0's: said as an unread line
            counts.unread_line(number, b"no rank field where other lines name theirs: " + raw)
            counts.rankless += 1
            continue
        counts.read += 1
        for name, value in metrics.items():
            steps.setdefault((0, name), []).append(step)
            values.setdefault((0, name), []).append(value)
    columns = Columns()
    for key in steps:
        columns.add_lists(key[0], key[1], steps[key], values[key])
    return build_result(path, fmt, columns, counts, names)


def jsonl_reader(rank: int | None, rankless: int | None = 0):
    def read_line(raw: bytes):
        record = jsonl_fields(raw, rank, rankless)
        return "unread" if record is None else record

    return read_line


def regex_reader(pattern: str, rank: int | None):
    try:
        compiled = re.compile(pattern)
    except re.error as e:
        raise BisectPrefetchError(f"bad metrics pattern {pattern!r}: {e}") from e
    groups = list(compiled.groupindex)
    if "step" not in groups:
        raise BisectPrefetchError(f"metrics pattern {pattern!r} needs a named group 'step'")
    metric_groups = [g for g in groups if g not in ("step", "rank")]

    def read_line(raw: bytes):
        # Without its line ending, so `$` matches before a CRLF as before an LF.
        m = compiled.search(raw.decode("utf-8", "replace").rstrip("\r\n"))
        if m is None:
            return None
        try:
            step = int(m.group("step"))
            line_rank = int(m.group("rank")) if m.groupdict().get("rank") else rank or 0
        except ValueError:
            return "unread"
        if not (fits_int64(step) and fits_int64(line_rank)):
            return "unread"
        metrics: dict[str, float | None] = {}
        for g in metric_groups:
            text = m.group(g)
            if text is not None:
                metrics[g] = float_or_none(text.encode())
        return line_rank, step, metrics

    return read_line
