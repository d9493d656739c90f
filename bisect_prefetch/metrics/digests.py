"""Gradient digests: where two runs first differ, parameter by parameter.

A digest record is ``(step, rank, param, digest)``: a hash of one parameter's gradient (or
value) on one rank at one step, written one JSON object a line to the rank's own
digests.rank<R>.jsonl (metrics/digest_files.py), e.g.
``{"step": 3, "rank": 0, "param": "layers.0.wq.weight", "digest": "9f86d081884c7d65"}``.
Comparing two runs' records gives the first step where any digest differs, the
(rank, param) pairs that differ there, and how the difference spreads (differing records per
step), which usually shows the divergence steps before the printed loss does.

Records are matched by (step, rank, param) in any order, but A/A runs write them in the
same order, so two files are walked in lockstep, a block of about a MiB at a time: equal
blocks are compared as raw bytes and never parsed; in the first block that differs, the
lines both files share are skipped, and only the lines that differ are parsed and matched
(the regex path for canonical lines, json.loads for any other). One rank's file holds its
steps in order, so its comparison can stop once the first few differing steps are whole
(``spread_steps``): what comes after a divergence is not read at all.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path
from typing import BinaryIO, NamedTuple

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.metrics.trajectory import (
    LONG_LINE,
    MAX_LINE_BYTES,
    bounded_lines,
    skip_rest_of_line,
)


class DigestRecord(NamedTuple):
    step: int
    rank: int
    param: str
    digest: str
    norm: float | None = None  # of the whole gradient, for the report (the digest decides)
    max_abs: float | None = None


# The canonical line json.dumps writes for a record; anything else goes through json.loads.
# ([^"]* is much faster in re than [^"\\]*; an escaped quote then fails the match and the
# line takes the json path; other escapes are undone by _unescape.)
CANONICAL = (rb'\{"step": (\d+), "rank": (\d+), "param": "([^"]*)", "digest": "([^"]*)"'
             rb'(?:, "norm": ([^,}]*), "max_abs": ([^,}]*))?\}[ \t\r]*')
CANONICAL_RE = re.compile(CANONICAL + rb"\n?$")
# The same over many lines at once: the lookbehind (after the literal, so re can still
# search for it fast) and the final newline make each match exactly one whole line.
CANONICAL_LINES_RE = re.compile(CANONICAL[:10] + rb'(?<![^\n]\{"step": )' + CANONICAL[10:] + rb"\n")
CHUNK_BYTES = 1 << 20  # compared as raw bytes while the files agree
BLOCK_LINES = 1 << 10  # lines parsed at a time once they differ (the spread bound is checked between)
# Differing steps analysed (the spread) past a rank's first difference, when bounded.
SPREAD_STEPS = 3
EXAMPLES = 2  # unpaired records named


def format_digest_line(record: DigestRecord) -> str:
    """The canonical digests.jsonl line for a record (without the newline)."""
    return json.dumps(
        {"step": record.step, "rank": record.rank, "param": record.param, "digest": record.digest}
    )


def parse_digest_line(line: str | bytes) -> DigestRecord | None:
    """One digests.jsonl line -> DigestRecord, or None when it is not a digest record."""
    raw = line.encode() if isinstance(line, str) else line
    m = CANONICAL_RE.match(raw)
    if m:
        return DigestRecord(int(m[1]), int(m[2]), _unescape(m[3]), _unescape(m[4]),
                            _float(m[5]), _float(m[6]))
    try:
        obj = json.loads(raw)
    except ValueError:
        return None
    return _from_mapping(obj)


def _float(text: bytes | None) -> float | None:
    """A JSON number's text (NaN and Infinity as Python's json writes them) -> float."""
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _unescape(text: bytes) -> str:
    """A JSON string's raw bytes -> its value (only backslashes need work)."""
    return json.loads(b'"' + text + b'"') if b"\\" in text else text.decode()


def _from_mapping(obj: object) -> DigestRecord | None:
    if not isinstance(obj, Mapping):
        return None
    step, rank, param, digest = (obj.get(k) for k in ("step", "rank", "param", "digest"))
    if not (isinstance(step, int) and isinstance(rank, int) and isinstance(param, str)):
        return None
    if isinstance(step, bool) or isinstance(rank, bool) or not isinstance(digest, str | int):
        return None
    norm, max_abs = (obj.get(k) for k in ("norm", "max_abs"))
    return DigestRecord(step, rank, param, str(digest),
                        float(norm) if isinstance(norm, int | float) else None,
                        float(max_abs) if isinstance(max_abs, int | float) else None)


def _as_record(item: object) -> DigestRecord | None:
    if isinstance(item, DigestRecord):
        return item
    if isinstance(item, Mapping):
        return _from_mapping(item)
    if isinstance(item, tuple) and len(item) in (4, 6):
        return DigestRecord(*item)
    return None


def read_digests(path: str | Path) -> Iterator[DigestRecord]:
    """Stream the records of a digests.jsonl file (unreadable lines are skipped)."""
    with open(path, "rb") as f:
        for line in bounded_lines(f):
            record = parse_digest_line(line) if line is not None else None
            if record is not None:
                yield record


@dataclass
class DigestResult:
    first_diff_step: int | None
    at_first: list[tuple[int, str]]  # (rank, param) differing at first_diff_step
    spread: dict[int, int]  # step -> number of differing records
    records_compared: int  # records both runs have
    records_differing: int
    missing_in_a: int = 0  # records only run B has
    missing_in_b: int = 0
    lines_unread: tuple[int, int] = (0, 0)
    metric_first_diff_step: int | None = None  # where the printed loss or grad_norm first differs
    problems: list[str] = field(default_factory=list)  # why "no difference" would not be proof
    spread_steps: int | None = None  # the spread covers this many differing steps (None: all)
    notes: list[str] = field(default_factory=list)  # how the files were read, once each
    noncanonical: tuple[bool, bool] = (False, False)  # lines read through json.loads
    # Records with no partner inside both files (the first of each side's), not counting
    # the lines one file has after the other ended.
    unpaired: tuple[list[tuple[int, int, str]], list[tuple[int, int, str]]] = ([], [])

    @property
    def lead_steps(self) -> int | None:
        """How many steps before the metrics the digests showed the divergence."""
        if self.first_diff_step is None or self.metric_first_diff_step is None:
            return None
        return self.metric_first_diff_step - self.first_diff_step

    def to_json(self) -> dict:
        return {
            "first_diff_step": self.first_diff_step,
            "at_first": [{"rank": r, "param": p} for r, p in self.at_first],
            "spread": {str(s): n for s, n in self.spread.items()},
            "metric_first_diff_step": self.metric_first_diff_step,
            "lead_steps": self.lead_steps,
            "records_compared": self.records_compared,
            "records_differing": self.records_differing,
            "missing_in_a": self.missing_in_a,
            "missing_in_b": self.missing_in_b,
            "lines_unread": {"a": self.lines_unread[0], "b": self.lines_unread[1]},
            "problems": self.problems,
            "spread_steps": self.spread_steps,
            "notes": self.notes,
        }


@dataclass
class _Matcher:
    """Matches records of run A and run B by (step, rank, param) and tallies differences."""

    pending_a: dict[tuple[int, int, str], str] = field(default_factory=dict)
    pending_b: dict[tuple[int, int, str], str] = field(default_factory=dict)
    spread: Counter = field(default_factory=Counter)
    first: int | None = None
    at_first: set[tuple[int, str]] = field(default_factory=set)
    compared: int = 0
    unread_a: int = 0
    unread_b: int = 0
    slow_a: bool = False  # differing lines not in canonical form, parsed by json.loads
    slow_b: bool = False
    bounded: bool = False  # stopped at the spread bound: what is still pending may come later
    tail_a: int = 0  # lines after the other file ended, unparsed
    tail_b: int = 0

    def bound(self, steps: int) -> None:
        """Keep the first `steps` differing steps (the last one seen may be partial)."""
        for step in sorted(self.spread)[steps:]:
            del self.spread[step]
        self.pending_a.clear()
        self.pending_b.clear()
        self.bounded = True

    def differ(self, step: int, rank: int, param: str | bytes) -> None:
        self.spread[step] += 1
        if self.first is None or step <= self.first:
            if isinstance(param, bytes):
                param = _unescape(param)
            if self.first is None or step < self.first:
                self.first = step
                self.at_first = set()
            self.at_first.add((rank, param))

    def pair(self, ra: DigestRecord | None, rb: DigestRecord | None) -> None:
        if ra is not None and rb is not None and ra[:3] == rb[:3]:
            # The common case once runs diverge: same record, different digest.
            self.compared += 1
            if ra.digest != rb.digest:
                self.differ(ra.step, ra.rank, ra.param)
            return
        if ra is not None:
            self._one(ra, self.pending_b, self.pending_a)
        if rb is not None:
            self._one(rb, self.pending_a, self.pending_b)

    def _one(self, record: DigestRecord, other: dict, mine: dict) -> None:
        key = record[:3]
        digest = other.pop(key, None)
        if digest is None:
            mine[key] = record.digest
            return
        self.compared += 1
        if digest != record.digest:
            self.differ(*key)

    def result(self, metric_first_diff: int | None) -> DigestResult:
        return DigestResult(
            first_diff_step=self.first,
            at_first=sorted(self.at_first),
            spread=dict(sorted(self.spread.items())),
            records_compared=self.compared,
            records_differing=sum(self.spread.values()),
            missing_in_a=len(self.pending_b) + self.tail_b,
            missing_in_b=len(self.pending_a) + self.tail_a,
            lines_unread=(self.unread_a, self.unread_b),
            metric_first_diff_step=metric_first_diff,
            noncanonical=(self.slow_a, self.slow_b),
            unpaired=(sorted(self.pending_a)[:EXAMPLES], sorted(self.pending_b)[:EXAMPLES]),
        )


def compare_digests(
    a_records: Iterable[object],
    b_records: Iterable[object],
    metric_first_diff: int | None = None,
) -> DigestResult:
    """Compare two runs' digest records (DigestRecord, 4-tuples or dicts), in any order."""
    matcher = _Matcher()
    for xa, xb in zip_longest(a_records, b_records):
        if xa == xb:
            matcher.compared += 1
            continue
        ra = _as_record(xa) if xa is not None else None
        rb = _as_record(xb) if xb is not None else None
        matcher.unread_a += xa is not None and ra is None
        matcher.unread_b += xb is not None and rb is None
        matcher.pair(ra, rb)
    return matcher.result(metric_first_diff)


def compare_digest_files(
    a_path: str | Path,
    b_path: str | Path,
    metric_first_diff: int | None = None,
    *,
    spread_steps: int | None = None,
) -> DigestResult:
    """Compare two digest files in lockstep, blockwise; identical blocks are never parsed.

    spread_steps: stop once that many differing steps are complete (None: read both files
    to the end). Only for files whose records come in step order (one rank's file): the
    bound then holds the first spread_steps differing steps whole.
    """
    for p in (a_path, b_path):
        if not Path(p).is_file():
            raise BisectPrefetchError(f"digest file not found: {p}")
    matcher = _Matcher()
    with open(a_path, "rb") as fa, open(b_path, "rb") as fb:
        _walk(matcher, _Chunks(fa), _Chunks(fb), spread_steps)
    result = matcher.result(metric_first_diff)
    result.spread_steps = spread_steps
    return result


class _Chunks:
    """A file read in blocks that end at a line boundary; bytes not used can be given back.

    A line over MAX_LINE_BYTES is never held whole: it comes as LONG_LINE (no record).
    """

    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        self.rest = b""
        self.eof = False

    def take(self) -> bytes:
        """The next whole lines, about CHUNK_BYTES (at the end, a last line without newline)."""
        data = self.rest
        if len(data) < CHUNK_BYTES and not self.eof:
            data += self._read()
        while True:
            cut = data.rfind(b"\n") + 1
            if cut:
                self.rest = data[cut:]
                return data[:cut]
            if self.eof:
                self.rest = b""
                return data
            if len(data) > MAX_LINE_BYTES:
                skip_rest_of_line(self.f)
                data = LONG_LINE + b"\n"
                continue
            data += self._read()  # a line longer than a block: read on to its end

    def _read(self) -> bytes:
        more = self.f.read(CHUNK_BYTES)
        self.eof = not more
        return more

    @property
    def ended(self) -> bool:
        return self.eof and not self.rest

    def give_back(self, data: bytes) -> None:
        self.rest = data + self.rest


def _walk(matcher: _Matcher, ra: _Chunks, rb: _Chunks, spread_steps: int | None) -> None:
    """Feed the matcher what differs between two files, block by block (module docstring)."""
    while True:
        ca, cb = ra.take(), rb.take()
        if ca == cb:  # before any divergence: whole blocks at memcmp speed
            if not ca:
                return
            matcher.compared += ca.count(b"\n") + (not ca.endswith(b"\n"))  # a last line unended
            continue
        same = common_prefix_length(ca, cb)
        cut = ca.rfind(b"\n", 0, same) + 1
        matcher.compared += ca.count(b"\n", 0, cut)
        lines_a, lines_b = ca[cut:].splitlines(keepends=True), cb[cut:].splitlines(keepends=True)
        # A last line cut off (no newline, no whole record) is no record: its partner is a
        # record only the other file has (the cut itself is the caller's finding, metrics/localize.py).
        if lines_a and _cut_off(lines_a[-1]):
            matcher.unread_a += bool(lines_a.pop().strip())
        if lines_b and _cut_off(lines_b[-1]):
            matcher.unread_b += bool(lines_b.pop().strip())
        if not lines_a and not lines_b:
            continue
        if lines_a and lines_b:  # pair line for line; what one side has more waits for the next block
            n = min(len(lines_a), len(lines_b))
            ra.give_back(b"".join(lines_a[n:]))
            rb.give_back(b"".join(lines_b[n:]))
            lines_a, lines_b = lines_a[:n], lines_b[:n]
        elif not (ra.ended if lines_b else rb.ended):
            # One block ended at a line the other goes past: its file has more to come.
            ra.give_back(b"".join(lines_a))
            rb.give_back(b"".join(lines_b))
            continue
        elif not (matcher.pending_a or matcher.pending_b):
            # One file has ended and nothing waits for a partner: the other's lines are
            # records only it has, counted (regex-matched, never matched to a partner).
            records, unread, slow = _count_records(lines_a or lines_b)
            if lines_a:
                matcher.tail_a, matcher.unread_a, matcher.slow_a = (
                    matcher.tail_a + records, matcher.unread_a + unread, matcher.slow_a or slow)
            else:
                matcher.tail_b, matcher.unread_b, matcher.slow_b = (
                    matcher.tail_b + records, matcher.unread_b + unread, matcher.slow_b or slow)
            continue
        else:  # ... or parsed, where a pending record may find its partner among them
            lines_a = lines_a or [None] * len(lines_b)
            lines_b = lines_b or [None] * len(lines_a)
        for start in range(0, len(lines_a), BLOCK_LINES):
            block_a, block_b = lines_a[start:start + BLOCK_LINES], lines_b[start:start + BLOCK_LINES]
            pairs = [(la, lb) for la, lb in zip(block_a, block_b, strict=True) if la != lb]
            matcher.compared += len(block_a) - len(pairs)
            if pairs:
                _match_block(matcher, *zip(*pairs, strict=True))
            if spread_steps is not None and len(matcher.spread) > spread_steps:
                matcher.bound(spread_steps)
                return


def common_prefix_length(a: bytes, b: bytes) -> int:
    lo, hi = 0, min(len(a), len(b))  # a[:lo] == b[:lo]; the answer is at most hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _match_block(matcher: _Matcher, lines_a: Sequence[bytes | None], lines_b: Sequence[bytes | None]) -> None:
    """Match a block of differing line pairs. Canonical lines stay raw byte tuples."""
    items_a, slow_a = _parse_block(lines_a)
    items_b, slow_b = _parse_block(lines_b)
    matcher.slow_a |= slow_a
    matcher.slow_b |= slow_b
    differing: list[tuple] = []
    for la, lb, ia, ib in zip(lines_a, lines_b, items_a, items_b, strict=True):
        if type(ia) is tuple and type(ib) is tuple and ia[:3] == ib[:3]:
            # The common case once runs diverge: same record, another digest.
            matcher.compared += 1
            if ia[3] != ib[3]:
                differing.append(ia)
            continue
        ra, rb = _as_digest_record(ia), _as_digest_record(ib)
        matcher.unread_a += ra is None and la is not None and bool(la.strip())
        matcher.unread_b += rb is None and lb is not None and bool(lb.strip())
        matcher.pair(ra, rb)
    if not differing:
        return
    steps = [int(raw[0]) for raw in differing]
    matcher.spread.update(steps)
    low = min(steps)
    if matcher.first is None or low <= matcher.first:
        for raw, step in zip(differing, steps, strict=True):
            if step == low:
                matcher.spread[step] -= 1  # differ() counts it again
                matcher.differ(step, int(raw[1]), raw[2])


def _parse_block(lines: Sequence[bytes | None]) -> tuple[list[tuple | DigestRecord | None], bool]:
    """Each line -> a raw (step, rank, param, digest) bytes tuple, a DigestRecord or None;
    and whether some record was not canonical (read the slow way, json.loads)."""
    present = [line if line.endswith(b"\n") else line + b"\n" for line in lines if line is not None]
    found = CANONICAL_LINES_RE.findall(b"".join(present))
    if len(found) == len(present):  # one match a line: every line is canonical
        it = iter(found)
        return [next(it) if line is not None else None for line in lines], False
    parsed = [parse_digest_line(line) if line is not None and line.strip() else None for line in lines]
    return parsed, any(record is not None for record in parsed)


def _cut_off(line: bytes) -> bool:
    """A file's last line without its newline that is no whole record."""
    return not line.endswith(b"\n") and parse_digest_line(line) is None


def _count_records(lines: list[bytes]) -> tuple[int, int, bool]:
    """How many lines are digest records, how many (not blank) are not, and whether some
    line needed the slow path."""
    blob = b"".join(lines)
    records = len(CANONICAL_LINES_RE.findall(blob if blob.endswith(b"\n") else blob + b"\n"))
    if records == len(lines):
        return records, 0, False
    parsed = [parse_digest_line(line) for line in lines if line.strip()]
    records = sum(record is not None for record in parsed)
    return records, len(parsed) - records, records > 0


def _as_digest_record(item: tuple | DigestRecord | None) -> DigestRecord | None:
    if item is None or isinstance(item, DigestRecord):
        return item
    step, rank, param, digest = item[:4]
    return DigestRecord(int(step), int(rank), _unescape(param), _unescape(digest), *map(_float, item[4:]))
