"""The precision a job printed its metrics at: what "identical" can mean for them.

Two runs whose loss agrees at 4 printed decimals are identical at that precision, not
bitwise. ``printed_precision(files, fmt, names, pattern)`` reads the first metric lines of
a run's files and gives, per metric, the way the job prints it, from the printed text
alone (never from the size of the values):

- ``FULL``: a float printed to its last bit (15 or more significant digits somewhere);
- an int, ``d``: fixed-point, d decimals every time (`f"{loss:.4f}"`), shown by two or more
  numbers with d decimals each and none with another count, or by one with a trailing
  zero past the point (`2.5000`);
- ``AS_PRINTED``: the number of decimals varies (a shortest round-trip repr of floats that
  happen to be short, `0.625`, `%g`): the text is all there is, and two runs printing the
  same way are compared exactly as printed;
- None: the metric was never seen.

Runs printing a metric differently compare at the coarser way (``coarser_decimals``):
fixed-point against anything else at the fixed-point decimals (the fewer of two); two ways
without fixed decimals are compared as printed, since neither has fewer digits to round to.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bisect_prefetch.metrics.console import ANSI_RE, CONSOLE_FORMATS
from bisect_prefetch.metrics.trajectory import Series, Trajectory, bounded_lines

FULL = "full"
AS_PRINTED = "as printed"  # decimals that vary: compared as printed
LINES_READ = 200  # metric lines read per file: the first steps show how a job prints
FULL_DIGITS = 15  # significant digits that only a shortest round-trip repr prints
_NUMBER = rb"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"


def _jsonl_res(names: Sequence[str]) -> dict[str, re.Pattern[bytes]]:
    return {n: re.compile(rb'"' + re.escape(n.encode()) + rb'"\s*:\s*(' + _NUMBER + rb")")
            for n in names}


def _tokens(path: Path, fmt: str, names: Sequence[str], pattern: str | None):
    """(metric, number text) of the first LINES_READ metric lines of one file."""
    seen = 0
    if fmt == "jsonl":
        finders = _jsonl_res(names)
    elif fmt == "regex":
        compiled = re.compile(pattern.encode()) if pattern else None
    else:
        console = CONSOLE_FORMATS[fmt]
    with open(path, "rb") as f:
        for raw in bounded_lines(f):
            if raw is None:
                continue  # a line over the limit: never held, never a metric line
            if seen >= LINES_READ:
                return
            if fmt == "jsonl":
                found = [(n, m[1]) for n, r in finders.items() if (m := r.search(raw))]
            elif fmt == "regex":
                m = compiled.search(raw) if compiled is not None else None
                found = [(n, m[n]) for n in names if m and n in m.groupdict() and m[n]]
            else:
                line = ANSI_RE.sub(b"", raw) if console.strip_ansi else raw
                start = line.find(console.marker)
                if start < 0:
                    continue
                found = []
                for n in names:
                    for key_re in console.key_res(n):
                        m = key_re.search(line, start)
                        if m and m[1]:
                            found.append((n, m[1]))
                            break
            if found:
                seen += 1
                yield from found


def decimals_of(token: bytes) -> tuple[int, int]:
    """(decimals, significant digits) of a printed number."""
    text = token.strip().lstrip(b"+-")
    mantissa, _, exponent = text.lower().partition(b"e")
    whole, _, fraction = mantissa.partition(b".")
    digits = (whole + fraction).lstrip(b"0")
    decimals = len(fraction) - (int(exponent) if exponent.lstrip(b"+-").isdigit() else 0)
    return max(decimals, 0), len(digits)


def printed_precision(files: Sequence[Path], fmt: str, names: Sequence[str],
                      pattern: str | None = None) -> dict[str, str | int | None]:
    """Per metric: FULL, fixed decimals, AS_PRINTED or None (see the module docstring)."""
    decimals: dict[str, set[int]] = {}
    counts: dict[str, int] = {}
    trailing_zero: set[str] = set()
    full: set[str] = set()
    for path in files:
        try:
            for name, token in _tokens(Path(path), fmt, names, pattern):
                places, significant = decimals_of(token)
                decimals.setdefault(name, set()).add(places)
                counts[name] = counts.get(name, 0) + 1
                if significant >= FULL_DIGITS:
                    full.add(name)
                if _trailing_zero(token):
                    trailing_zero.add(name)
        except (OSError, re.error, KeyError):
            continue
    out: dict[str, str | int | None] = {}
    for name in names:
        seen = decimals.get(name)
        if name in full:
            out[name] = FULL
        elif not seen:
            out[name] = None
        elif len(seen) == 1 and (counts[name] > 1 or name in trailing_zero):
            out[name] = next(iter(seen))
        else:
            out[name] = AS_PRINTED
    return out


def _trailing_zero(token: bytes) -> bool:
    """A zero a shortest repr would not print: `2.5000`, not `3.0` (repr's own)."""
    mantissa = token.strip().lower().partition(b"e")[0]
    fraction = mantissa.partition(b".")[2]
    return len(fraction) > 1 and fraction.endswith(b"0")


def coarser_decimals(a: dict[str, str | int | None],
                     b: dict[str, str | int | None]) -> dict[str, int]:
    """Per metric two runs printed differently: the decimals to round both to (the fixed-
    point one's, the fewer of two). Metrics printed alike, never, or without fixed decimals
    on either side are left out: those compare as printed."""
    out = {}
    for name in a.keys() & b.keys():
        pa, pb = a[name], b[name]
        if pa is None or pb is None or pa == pb:
            continue
        fixed = [p for p in (pa, pb) if isinstance(p, int)]
        if fixed:
            out[name] = min(fixed)
    return out


def at_decimals(trajectory: Trajectory, decimals: dict[str, int]) -> Trajectory:
    """The trajectory with these metrics rounded to these decimals (as printed coarser)."""
    per_rank = {
        rank: {name: Series(s.steps, np.round(s.values, decimals[name])) if name in decimals else s
               for name, s in metrics.items()}
        for rank, metrics in trajectory.per_rank.items()}
    return Trajectory(per_rank, sources=trajectory.sources, lines_read=trajectory.lines_read,
                      lines_unread=trajectory.lines_unread,
                      steps_repeated=trajectory.steps_repeated,
                      unread_samples=trajectory.unread_samples,
                      cut_mid_line=trajectory.cut_mid_line)


def describe_precision(precision: dict[str, str | int | None]) -> str:
    """'loss (4 decimals), grad_norm (full precision)'."""
    parts = []
    for name, p in precision.items():
        if p == FULL:
            parts.append(f"{name} (full precision)")
        elif p == AS_PRINTED:
            parts.append(f"{name} (as printed)")  # decimals that vary, or one value so far
        elif p is None:
            parts.append(f"{name} (never printed)")
        else:
            parts.append(f"{name} ({p} decimal{'s' if p != 1 else ''})")
    return ", ".join(parts)
