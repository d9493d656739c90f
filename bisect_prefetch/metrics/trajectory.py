"""A run's metrics as numbers: Series (one metric on one rank), what one file held
(ParseResult), and a run's Trajectory over every rank.

A record is ``(rank, step, {metric: float})``. Parsers keep only the numbers, per rank and
metric, as numpy columns, so memory grows with the number of steps, never with the size
of the log. A parser never guesses silently: a line that mentions the format's marker but
cannot be read is counted (``lines_unread``, with a few samples); a file with no metrics at
all raises BisectPrefetchError (build_result).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np

from bisect_prefetch.errors import BisectPrefetchError

Record = tuple[int, int, dict[str, float]]
UNREAD_SAMPLES = 5
# A log line longer than this is an unread line, read past in blocks and never held whole
# (a metric line is a few hundred bytes; a flood without newlines must not fill memory).
MAX_LINE_BYTES = 1 << 20
# What stands for such a line where lines travel in blocks (console chunks, live reads):
# no format's marker, so a parser skips it, and the NUL keeps it from any real log line.
LONG_LINE = b"\0(a line over 1 MiB, left out)"
_SKIP_BLOCK = 1 << 16


def skip_rest_of_line(f: BinaryIO) -> None:
    """Read past the rest of the current line (its newline included), a block at a time."""
    while block := f.readline(_SKIP_BLOCK):
        if block.endswith(b"\n"):
            return


def bounded_lines(f: BinaryIO) -> Iterator[bytes | None]:
    """A binary file's lines, each at most MAX_LINE_BYTES; None for a longer one."""
    while line := f.readline(MAX_LINE_BYTES + 1):
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            skip_rest_of_line(f)
            yield None
        else:
            yield line

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
    # values for a (rank, metric, step) read before: a resumed run (the last one is kept),
    # or several ranks' lines interleaved in one file with nothing to tell them apart
    steps_repeated: int = 0
    lines_skipped: int = 0  # other output (warnings, banners, ...)
    values_not_numeric: int = 0  # a metric key with no number, e.g. `loss: N/A (...)`
    unread_samples: list[tuple[int, str]] = field(default_factory=list)  # (line number, text)
    cut_mid_line: tuple[int, str] | None = None  # (line number, text) of a last line cut off

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
        return names_in_order(self.series.values())


class Columns:
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
        """Series per rank and metric; `repeated` counts values for a step seen before.

        `conflict` says the first step printed more than once with different values, where
        not every step was (several ranks interleaved in one log print every step as often):
        a step printed twice is never settled by taking the last value."""
        out: dict[int, dict[str, Series]] = {}
        self.repeated = 0
        self.conflict: str | None = None
        for rank, name in self.order:
            steps, values = self.parts[(rank, name)]
            all_steps, all_values = np.concatenate(steps), np.concatenate(values)
            series = Series(all_steps, all_values)
            repeated = len(all_steps) - len(series)
            self.repeated += repeated
            if repeated and self.conflict is None:
                self.conflict = _conflict(all_steps, all_values, rank, name)
            out.setdefault(rank, {})[name] = series
        return out


def _conflict(steps: np.ndarray, values: np.ndarray, rank: int, name: str) -> str | None:
    """The first step printed more than once with different values (bitwise; NaN equal to
    NaN), unless every step was printed equally often; else None."""
    unique, counts = np.unique(steps, return_counts=True)
    if counts.min() == counts.max():
        return None  # every step as often: ranks interleaved without their rank, said apart
    for step in unique[counts > 1].tolist():
        seen = values[steps == step]
        if len(np.unique(seen.view(np.int64))) > 1:
            shown = ", ".join(f"{v!r}" for v in seen.tolist()[:3])
            return (f"step {step} of {name} (rank {rank}) is printed {len(seen)} times with "
                    f"different values ({shown}): which one the run had is unknown")
    return None


class Counts:
    def __init__(self) -> None:
        self.read = self.unread = self.skipped = self.not_numeric = self.rankless = 0
        self.samples: list[tuple[int, str]] = []
        self.last_unread: tuple[int, str] | None = None

    def long_line(self, number: int) -> None:
        self.unread_line(number, LONG_LINE[1:])

    def unread_line(self, number: int, line: bytes) -> None:
        self.unread += 1
        text = line.decode("utf-8", "replace").rstrip()[:200]
        self.last_unread = (number, text)
        if len(self.samples) < UNREAD_SAMPLES:
            self.samples.append((number, text))


def _cut_mid_line(path: Path, counts: Counts) -> tuple[int, str] | None:
    """The file's last line, when it lacks its newline and could not be read: the writer
    stopped mid-line (a crash, a kill, a full disk)."""
    if counts.last_unread is None or counts.last_unread[0] != counts.read + counts.unread + counts.skipped:
        return None
    with open(path, "rb") as f:
        f.seek(-1, 2)
        return None if f.read(1) == b"\n" else counts.last_unread


def build_result(
    path: Path, fmt: str, columns: Columns, counts: Counts, names: Sequence[str] | None = None
) -> ParseResult:
    result = ParseResult(
        path=path,
        fmt=fmt,
        series=columns.build(),
        steps_repeated=columns.repeated,
        lines_read=counts.read,
        lines_unread=counts.unread,
        lines_skipped=counts.skipped,
        values_not_numeric=counts.not_numeric,
        unread_samples=counts.samples,
        cut_mid_line=_cut_mid_line(path, counts),
    )
    if columns.conflict is not None:
        raise BisectPrefetchError(f"{path}: {columns.conflict}")
    if not any(result.series.values()):
        wanted = f", metrics {', '.join(names)}" if names else ""
        detail = f"; {counts.unread} unreadable line(s), first: {counts.samples[0][1]!r}" if counts.samples else ""
        raise BisectPrefetchError(f"no metrics found in {path} (format {fmt}{wanted}){detail}")
    return result


# --------------------------------------------------------------------------- trajectories


def names_in_order(groups: Iterable[Mapping[str, object]]) -> list[str]:
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
        steps_repeated: int = 0,
        unread_samples: Sequence[tuple[str, int, str]] = (),
        cut_mid_line: Sequence[tuple[str, int, str]] = (),
    ):
        self.per_rank: dict[int, dict[str, Series]] = {
            r: dict(m) for r, m in sorted(per_rank.items()) if m
        }
        self.sources = list(sources)
        self.lines_read = lines_read
        self.lines_unread = lines_unread
        self.steps_repeated = steps_repeated
        self.unread_samples = list(unread_samples)  # (file, line number, text)
        self.cut_mid_line = list(cut_mid_line)  # (file, line number, text): files that stop mid-line
        ranks = (
            [r for r, m in self.per_rank.items() if "loss" in m]
            or [r for r, m in self.per_rank.items() if any(n.endswith("_loss") for n in m)]
            or list(self.per_rank)
        )
        self.metrics_rank: int | None = ranks[0] if ranks else None
        self.series_rank: dict[str, int] = {}
        for name in names_in_order(self.per_rank.values()):
            if self.metrics_rank is not None and name in self.per_rank[self.metrics_rank]:
                self.series_rank[name] = self.metrics_rank
            else:
                self.series_rank[name] = min(r for r, m in self.per_rank.items() if name in m)

    @classmethod
    def from_mapping(cls, metrics: Mapping[str, Mapping[int, float]], *, rank: int = 0) -> Trajectory:
        """A one-rank trajectory from {metric: {step: value}}."""
        return cls({rank: {n: Series.from_mapping(v) for n, v in metrics.items()}})

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
            steps_repeated=sum(r.steps_repeated for r in results),
            unread_samples=samples[:UNREAD_SAMPLES],
            cut_mid_line=[(str(r.path), *r.cut_mid_line) for r in results if r.cut_mid_line],
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
