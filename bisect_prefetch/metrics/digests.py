"""Gradient digests: where two runs first differ, parameter by parameter.

A digest record is ``(step, rank, param, digest)``: a hash of one parameter's gradient (or
value) on one rank at one step, written one JSON object a line to digests.jsonl, e.g.
``{"step": 3, "rank": 0, "param": "layers.0.wq.weight", "digest": "9f86d081884c7d65"}``.
Comparing two runs' records gives the first step where any digest differs, the
(rank, param) pairs that differ there, and how the difference spreads (differing records per
step), which usually shows the divergence steps before the printed loss does.

Records are matched by (step, rank, param) in any order, but A/A runs write them in the
same order, so the files are walked in lockstep: identical lines are skipped without being
parsed, and only lines that differ are parsed and matched (memory stays small when the
order agrees).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice, zip_longest
from pathlib import Path
from typing import BinaryIO, NamedTuple

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.metrics.trajectory import LONG_LINE, bounded_lines


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
BLOCK_LINES = 1 << 14
PREFIX_BLOCK = 1 << 20


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
            missing_in_a=len(self.pending_b),
            missing_in_b=len(self.pending_a),
            lines_unread=(self.unread_a, self.unread_b),
            metric_first_diff_step=metric_first_diff,
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
    a_path: str | Path, b_path: str | Path, metric_first_diff: int | None = None
) -> DigestResult:
    """Compare two digests.jsonl files, streaming; identical lines are never parsed."""
    for p in (a_path, b_path):
        if not Path(p).is_file():
            raise BisectPrefetchError(f"digest file not found: {p}")
    matcher = _Matcher()
    with open(a_path, "rb") as fa, open(b_path, "rb") as fb:
        matcher.compared += _skip_common_prefix(fa, fb)
        # No line held whole past MAX_LINE_BYTES: such a line is no record (LONG_LINE).
        read_a, read_b = _lines(fa), _lines(fb)
        while True:
            block_a, block_b = list(islice(read_a, BLOCK_LINES)), list(islice(read_b, BLOCK_LINES))
            if block_a == block_b:  # before any divergence: whole blocks at C speed
                if not block_a:
                    break
                matcher.compared += len(block_a)
                continue
            pairs = [(la, lb) for la, lb in zip_longest(block_a, block_b) if la != lb]
            matcher.compared += max(len(block_a), len(block_b)) - len(pairs)
            lines_a, lines_b = zip(*pairs, strict=True)
            _match_block(matcher, lines_a, lines_b)
    return matcher.result(metric_first_diff)


def _lines(f: BinaryIO) -> Iterator[bytes]:
    return (line if line is not None else LONG_LINE for line in bounded_lines(f))


def _skip_common_prefix(fa: BinaryIO, fb: BinaryIO) -> int:
    """Skip the bytes both files share, up to the line where they first differ.

    Leaves both files at the start of that line and returns how many lines were skipped.
    A/A runs agree for the first part of training: that part costs a memcmp.
    """
    lines = 0
    start = 0  # offset of the first line not yet skipped (the same in both files)
    while True:
        ca, cb = fa.read(PREFIX_BLOCK), fb.read(PREFIX_BLOCK)
        if ca != cb or not ca:
            break
        cut = ca.rfind(b"\n") + 1
        if cut == 0:  # no whole line in the block: leave it to the line-by-line walk
            break
        lines += ca.count(b"\n")
        start += cut
        if cut < len(ca):
            # Bytes after the last newline belong to a line still to compare: reread them.
            fa.seek(start)
            fb.seek(start)
    same = _common_prefix_length(ca, cb)
    cut = ca.rfind(b"\n", 0, same) + 1
    lines += ca.count(b"\n", 0, cut)
    fa.seek(start + cut)
    fb.seek(start + cut)
    return lines


def _common_prefix_length(a: bytes, b: bytes) -> int:
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
    items_a, items_b = _parse_block(lines_a), _parse_block(lines_b)
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


def _parse_block(lines: Sequence[bytes | None]) -> list[tuple | DigestRecord | None]:
    """Each line -> a raw (step, rank, param, digest) bytes tuple, a DigestRecord or None."""
    present = [line for line in lines if line is not None]
    blob = b"".join(present)
    if blob and not blob.endswith(b"\n"):
        blob += b"\n"
    found = CANONICAL_LINES_RE.findall(blob)
    if len(found) == len(present):  # one match a line: every line is canonical
        it = iter(found)
        return [next(it) if line is not None else None for line in lines]
    return [parse_digest_line(line) if line is not None and line.strip() else None for line in lines]


def _as_digest_record(item: tuple | DigestRecord | None) -> DigestRecord | None:
    if item is None or isinstance(item, DigestRecord):
        return item
    step, rank, param, digest = item[:4]
    return DigestRecord(int(step), int(rank), _unescape(param), _unescape(digest), *map(_float, item[4:]))
