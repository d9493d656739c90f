"""The precision a job printed its metrics at: what "identical" can mean for them.

Two runs whose loss agrees at 4 printed decimals are identical at that precision, not
bitwise. ``printed_precision(files, fmt, names, pattern)`` reads the first metric lines of
a run's files and gives, per metric, ``FULL`` (a float printed to its last bit: 15 or more
significant digits somewhere, or the recorder's jsonl), the most decimals seen, or None
(the metric was never seen).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from bisect_prefetch.metrics.console import ANSI_RE, CONSOLE_FORMATS
from bisect_prefetch.metrics.trajectory import bounded_lines

FULL = "full"
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
    """Per metric: FULL, the most decimals printed, or None (see the module docstring)."""
    decimals: dict[str, int] = {}
    full: set[str] = set()
    for path in files:
        try:
            for name, token in _tokens(Path(path), fmt, names, pattern):
                places, significant = decimals_of(token)
                decimals[name] = max(decimals.get(name, 0), places)
                if significant >= FULL_DIGITS:
                    full.add(name)
        except (OSError, re.error, KeyError):
            continue
    return {n: FULL if n in full else decimals.get(n) for n in names}


def describe_precision(precision: dict[str, str | int | None]) -> str:
    """'loss (4 decimals), grad_norm (full precision)'."""
    parts = []
    for name, p in precision.items():
        if p == FULL:
            parts.append(f"{name} (full precision)")
        elif p is None:
            parts.append(f"{name} (never printed)")
        else:
            parts.append(f"{name} ({p} decimals)")
    return ", ".join(parts)
