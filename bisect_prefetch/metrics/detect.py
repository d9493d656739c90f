"""Which parsers read a log, and which metrics it carries: every format tried, best first.

`readings(paths)` reads each file with every console and line format (jsonl,
torchtitan, mindformers, megatron) and returns one Reading per (file, format)
that found metric lines, best first: the most metric lines, then the most
metrics, then the order of FORMATS. A metric counts when the log carries it
as a number on every metric line; timing, throughput and memory figures
(tps, mfu, step time, ...) differ from run to run by nature and are left out
of the names to compare (said in `left_out`). Loss comes first, then the grad
norm, then the rest in the order the log prints them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.metrics.console import ANSI_RE, CONSOLE_FORMATS
from bisect_prefetch.metrics.lines import parse_jsonl_line
from bisect_prefetch.metrics.loading import parse_file, sample_lines

FORMATS = ("jsonl", "torchtitan", "mindformers", "megatron")  # every format that needs no pattern
# Words of a name that say it measures time, speed or memory: never equal run to run.
_TIMING = re.compile(
    r"(?:^|_)(?:tps|wps|sps|tflops|mfu|memory|mem|time|times|elapsed|throughput|speed|ms|"
    r"sec|secs|second|seconds|duration|timestamp|wall|reserved|allocated|per_sec|per_second)"
    r"(?:$|_)")
_NOT_METRICS = frozenset({"step", "rank", "epoch", "iteration", "iter"})
# A console line's keys, after the step: torchtitan `loss: 8.1`, mindformers `loss:[8.1/8.2]`,
# megatron `| lm loss: 8.1 |`.
_KEY = re.compile(rb"([A-Za-z_][A-Za-z0-9_]*):")
_MEGATRON_KEY = re.compile(rb"\| *([A-Za-z][A-Za-z0-9_ ]*?) *:")


@dataclass
class Reading:
    """What one format read in one file."""

    fmt: str
    path: Path
    lines: int  # metric lines read
    steps: int  # distinct steps
    last_step: int  # the highest step read
    names: list[str]  # on every metric line, loss first
    left_out: list[str] = field(default_factory=list)  # carried, but timing or memory
    sample: str = ""  # the first metric line, ANSI colours stripped

    def describe(self) -> str:
        return f"{self.fmt} ({self.lines} line(s), {', '.join(self.names)})"


def is_timing(name: str) -> bool:
    """Whether a metric's name says it measures time, speed or memory."""
    return bool(_TIMING.search(name.lower()))


def _head(path: Path) -> bytes:
    """The lines format detection reads (metrics.loading.sample_lines: the first 8 MiB,
    a line over the limit read past, never held)."""
    try:
        return b"".join(sample_lines(path))
    except OSError:
        return b""


def _canonical(fmt: str, key: str) -> str:
    """A key as the parser names its metric: `lm loss` -> loss, `global_norm` -> grad_norm."""
    console = CONSOLE_FORMATS[fmt]
    for name, alias in getattr(console, "aliases", ()):
        if key == alias:
            return name
    return key.strip().replace(" ", "_")


def _candidates(fmt: str, lines: list[bytes]) -> tuple[list[bytes], list[str]]:
    """The lines of this console format, and the keys they show (in order, first seen first)."""
    console = CONSOLE_FORMATS[fmt]
    found, keys = [], []
    key_re = _MEGATRON_KEY if fmt == "megatron" else _KEY
    for line in lines:
        m = console.step_re.search(line)
        if m is None or not m.group(1):
            continue
        found.append(line)
        for raw in key_re.findall(m.group(2)):
            name = _canonical(fmt, raw.decode("ascii", "replace"))
            if re.fullmatch(r"\w+", name) and name not in keys:
                keys.append(name)
    return found, keys


def _order(names: Sequence[str]) -> list[str]:
    first = [n for n in ("loss", "grad_norm") if n in names]
    return first + [n for n in names if n not in first]


def _read(path: Path, fmt: str, data: bytes) -> Reading | None:
    lines = [ANSI_RE.sub(b"", line) if b"\x1b" in line else line for line in data.splitlines()]
    if fmt == "jsonl":
        metric_lines = [line for line in lines if line.lstrip().startswith(b"{")
                        and parse_jsonl_line(line) is not None]
        if not metric_lines:
            return None
        keys: list[str] = []
        for line in metric_lines:
            keys += [k for k in parse_jsonl_line(line)[2] if k not in keys]
    else:
        metric_lines, keys = _candidates(fmt, lines)
        if not metric_lines:
            return None
    keys = [k for k in keys if k.lower() not in _NOT_METRICS]
    if not keys:
        return None
    try:
        result = parse_file(path, fmt, names=keys)
    except BisectPrefetchError:  # no key held a number
        return None
    by_rank = {rank: set().union(*(set(s.steps.tolist()) for s in series.values()))
               for rank, series in result.series.items()}
    steps = set().union(*by_rank.values())
    every_line = {name for name in keys
                  if all(name in series and set(series[name].steps.tolist()) == by_rank[rank]
                         for rank, series in result.series.items())}
    carried = [k for k in keys if k in every_line]
    names = _order([k for k in carried if not is_timing(k)])
    if not names:
        return None
    sample = metric_lines[0].decode("utf-8", "replace").strip()
    return Reading(fmt=fmt, path=path, lines=result.lines_read, steps=len(steps),
                   last_step=max(steps), names=names,
                   left_out=[k for k in carried if is_timing(k)], sample=sample[:300])


def readings(paths: Sequence[Path]) -> list[Reading]:
    """Every (file, format) that reads metric lines, best first."""
    found = []
    for path in paths:
        data = _head(Path(path))
        if not data.strip():
            continue
        for fmt in FORMATS:
            reading = _read(Path(path), fmt, data)
            if reading is not None:
                found.append(reading)
    return sorted(found, key=lambda r: (-r.lines, -len(r.names), FORMATS.index(r.fmt),
                                        [str(p) for p in paths].index(str(r.path))))


def steps_seen(paths: Sequence[Path]) -> int:
    """The most distinct steps any format reads in these files (0: none yet)."""
    return max((r.steps for r in readings(paths)), default=0)
