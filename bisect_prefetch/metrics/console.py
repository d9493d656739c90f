"""Console log formats (mindformers, torchtitan, megatron): one engine, fed in chunks.

Each format names a marker literal, a step regex that captures ``(step, rest of line)``,
and how a metric key looks. A chunk is read with a few C-speed regex passes (the fast
path) when counts prove every marker line was parsed and every metric key appears on all
lines or on none; otherwise the chunk is read line by line with the same regexes (the slow
path), which gives identical results and exact counts. The same parser reads a finished
log (parse_console) and follows a running one (metrics/live.py feeds it whole lines).

A finished log is read in chunks of CHUNK_BYTES: small enough that the fast path's passes
over a chunk find it in the CPU cache (a 4 MiB chunk reads about 20% slower).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bisect_prefetch.metrics.trajectory import (
    LONG_LINE,
    MAX_LINE_BYTES,
    Columns,
    Counts,
    ParseResult,
    build_result,
    skip_rest_of_line,
)

CHUNK_BYTES = 256 << 10
ANSI_RE = re.compile(rb"\x1b\[[0-9;]*[A-Za-z]")

# --------------------------------------------------------------------------- console formats

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def float_or_none(token: bytes) -> float | None:
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
            v = float_or_none(token)
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
    unread), group 2 the rest of the line. epoch_re, where a format counts steps per epoch,
    matches just before the marker and captures (epoch, steps per epoch).
    """

    name: str
    marker: bytes
    step_re: re.Pattern[bytes]
    default_names: tuple[str, ...]
    strip_ansi: bool = False
    epoch_re: re.Pattern[bytes] | None = None
    epoch_line_re: re.Pattern[bytes] | None = None  # groups: epoch, step, steps per epoch, rest

    def key_res(self, metric: str) -> tuple[re.Pattern[bytes], ...]:
        """Regexes that find `metric`'s value (group 1), tried in order; each runs to the end
        of the line."""
        return (self._key_re(metric.encode()),)

    def _key_re(self, key: bytes) -> re.Pattern[bytes]:
        key = re.escape(key)
        # The literal key comes first so re can search for it fast; the lookbehind makes it
        # a whole word (load_balancing_loss: is not loss:).
        return re.compile(key + rb":(?<!\w" + key + rb":) *([^\s,}|]*).*")


@dataclass(frozen=True)
class MindFormersFormat(ConsoleFormat):
    """MindFormers' loss callback, every version seen:

    1.x/2.x: { Epoch:[  1/  1], step:[    3/   10], loss:[5.549648/5.542563], ..., global_norm: [1.4394261], ...
    sink mode: ... loss: 5.549648, ...; newer builds: ... loss:  11.854254, ..., grad_norm:  13.83, ...

    `loss:[step loss/running mean]` gives the step loss; `global_norm: [x]` (a numpy array
    printed) is the grad norm where no `grad_norm:` field is printed. The step counts
    within an epoch: the global step is (epoch - 1) * steps per epoch + step.
    """

    aliases: tuple[tuple[str, str], ...] = (("grad_norm", "global_norm"),)

    def key_res(self, metric: str) -> tuple[re.Pattern[bytes], ...]:
        names = [metric] + [alias for name, alias in self.aliases if name == metric]
        return tuple(self._key_re(n.encode()) for n in names)

    def _key_re(self, key: bytes) -> re.Pattern[bytes]:
        key = re.escape(key)
        return re.compile(key + rb":(?<!\w" + key + rb":) *\[? *([^\s,}|/\]]*).*")


@dataclass(frozen=True)
class MegatronFormat(ConsoleFormat):
    # Megatron names its metrics with spaces (`lm loss`, `grad norm`); fields sit between `|`.
    aliases: tuple[tuple[str, str], ...] = (("loss", "lm loss"), ("grad_norm", "grad norm"))

    def key_res(self, metric: str) -> tuple[re.Pattern[bytes], ...]:
        key = dict(self.aliases).get(metric, metric.replace("_", " "))
        return (re.compile(rb"\| " + re.escape(key.encode()) + rb": *([^\s|]*).*"),)


CONSOLE_FORMATS: dict[str, ConsoleFormat] = {
    "mindformers": MindFormersFormat(
        "mindformers",
        b"step:[",
        re.compile(rb"step:\[(?: *(\d+) */)?(.*)"),
        ("loss", "grad_norm"),
        # The lookahead ends the match where the step marker starts (checked per line).
        epoch_re=re.compile(rb"Epoch:\[ *(\d+) */ *\d+ *\], (?=step:\[ *\d+ */ *(\d+) *\])"),
        # The same, with the step and the rest of the line: one pass over a chunk instead of two.
        # The rest starts after the steps per epoch, which hold no metric key.
        epoch_line_re=re.compile(rb"Epoch:\[ *(\d+) */ *\d+ *\], step:\[ *(\d+) */ *(\d+) *\](.*)"),
    ),
    # step:  1  loss: 12.2345  grad_norm:  3.4567  memory: ...   (ANSI colours stripped first)
    "torchtitan": ConsoleFormat(
        "torchtitan",
        b"step:",
        re.compile(rb"step:(?:(?<!\wstep:) *(\d+)(?![\d.]))?(.*)"),
        ("loss", "grad_norm"),
        strip_ansi=True,
    ),
    #  iteration        1/     100 | consumed samples: ... | lm loss: 1.034567E+01 | grad norm: 2.3 |
    "megatron": MegatronFormat(
        "megatron",
        b" iteration ",
        re.compile(rb" iteration (?: *(\d+) */)?(.*)"),
        ("loss", "grad_norm"),
    ),
}


def iter_chunks(path: Path) -> Iterator[bytes]:
    """Whole lines in blocks of about CHUNK_BYTES; the last one may lack its newline.

    A line over MAX_LINE_BYTES comes as LONG_LINE (ConsoleParser counts it unread).
    """
    with open(path, "rb") as f:
        while block := f.read(CHUNK_BYTES):
            if not block.endswith(b"\n"):
                start = block.rfind(b"\n") + 1  # the block's last line starts here
                block += f.readline(max(MAX_LINE_BYTES + 1 - (len(block) - start), 1))
                if len(block) - start > MAX_LINE_BYTES and not block.endswith(b"\n"):
                    skip_rest_of_line(f)
                    block = block[:start] + LONG_LINE + b"\n"
            yield block


def _line_count(chunk: bytes) -> int:
    # numpy's vectorized compare counts newlines about 3x faster than bytes.count.
    newlines = int(np.count_nonzero(np.frombuffer(chunk, dtype=np.uint8) == ord("\n")))
    return newlines + (0 if chunk.endswith(b"\n") else 1)


class ConsoleParser:
    """Reads one rank's console log, fed in whole lines (a chunk may lack its last newline
    only at the end of a finished file)."""

    def __init__(self, fmt: ConsoleFormat, names: Sequence[str], rank: int):
        self.fmt = fmt
        self.names = list(names)
        self.keys = [fmt.key_res(n) for n in self.names]
        self.marker_re = re.compile(re.escape(fmt.marker))
        self.rank = rank
        self.columns = Columns()
        self.counts = Counts()
        self.line_number = 0  # lines before the current chunk

    def feed(self, chunk: bytes, *, allow_fast: bool = True) -> None:
        if self.fmt.strip_ansi and b"\x1b" in chunk:
            chunk = ANSI_RE.sub(b"", chunk)
        lines = _line_count(chunk)
        if not (allow_fast and self._fast(chunk, lines)):
            self._slow(chunk)
        if LONG_LINE in chunk:  # skipped above, as no metric line: counted unread instead
            at = chunk.find(LONG_LINE)
            while at >= 0:
                self.counts.skipped -= 1
                self.counts.long_line(self.line_number + chunk.count(b"\n", 0, at) + 1)
                at = chunk.find(LONG_LINE, at + 1)
        self.line_number += lines

    def _fast(self, chunk: bytes, lines: int) -> bool:
        try:
            return self._fast_columns(chunk, lines)
        except OverflowError:  # a step beyond int64: the line-by-line path counts it unread
            return False

    def _fast_columns(self, chunk: bytes, lines: int) -> bool:
        epoch_lines = self.fmt.epoch_line_re.findall(chunk) if self.fmt.epoch_line_re is not None else []
        if epoch_lines:
            # Each match holds one marker and runs to the end of its line: as many markers
            # as matches means every marker line is one, with its marker first.
            n = len(epoch_lines)
            # (re finds a literal faster than bytes.count does)
            if len(self.marker_re.findall(chunk)) != n:
                return False
            epoch, steps_tokens, per_epoch, tails = zip(*epoch_lines, strict=True)
            steps = np.array(steps_tokens, dtype=np.int64)
            if len(set(epoch)) == 1 and len(set(per_epoch)) == 1:  # one epoch all chunk long
                steps += (int(epoch[0]) - 1) * int(per_epoch[0])
            else:
                steps += (np.array(epoch, dtype=np.int64) - 1) * np.array(per_epoch, dtype=np.int64)
        else:  # no line has an epoch (the line-by-line path finds none either)
            matches = self.fmt.step_re.findall(chunk)
            n = len(matches)
            if n == 0:
                return False
            steps_tokens, tails = zip(*matches, strict=True)
            if b"" in steps_tokens:  # a marker without a step: an unread line
                return False
            steps = np.array(steps_tokens, dtype=np.int64)
        blob = b"\n".join(tails)
        found = []
        for keys in self.keys:
            # Each key regex runs to the end of its line, so it matches at most once a line:
            # n matches mean every line has it, 0 none. A line takes the first alias it has,
            # so a later alias counts only where no line has an earlier one.
            for key in keys:
                tokens = key.findall(blob)
                if len(tokens) not in (0, n):
                    return False
                if tokens:
                    break
            found.append(tokens)
        if not any(found):
            return False
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

    def _step(self, line: bytes, m: re.Match[bytes]) -> int:
        step = int(m.group(1))
        if self.fmt.epoch_re is not None:
            em = self.fmt.epoch_re.search(line)
            if em is not None and em.end() == m.start():
                step += (int(em.group(1)) - 1) * int(em.group(2))
        return step

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
            step, tail = self._step(line, m), m.group(2)
            if not INT64_MIN <= step <= INT64_MAX:  # numpy's step column cannot hold it
                self.counts.unread_line(number, line)
                continue
            any_key = False
            for name, keys in zip(self.names, self.keys, strict=True):
                km = next((km for km in (key.search(tail) for key in keys) if km is not None), None)
                if km is None:
                    continue
                any_key = True
                value = float_or_none(km.group(1))
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


def parse_console(
    path: Path, fmt: str, *, names: Sequence[str] | None = None, rank: int = 0, fast: bool = True
) -> ParseResult:
    """Read a whole console log, streaming (fast=False: the line-by-line path only)."""
    console = CONSOLE_FORMATS[fmt]
    parser = ConsoleParser(console, names or console.default_names, rank)
    for chunk in iter_chunks(path):
        parser.feed(chunk, allow_fast=fast)
    return build_result(path, fmt, parser.columns, parser.counts, parser.names)
