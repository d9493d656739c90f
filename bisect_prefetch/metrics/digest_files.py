"""A run dir's gradient digest files: one a rank, ``digests.rank<R>.jsonl``.

Each rank writes its own file (adapters/recorder.py), created exclusively: a second process
claiming a rank already taken writes ``digests.rank<R>.<host>-<pid>.jsonl`` instead, and
such a file is reported as a second writer of that rank. An older run dir holds one
``digests.jsonl`` every rank appended to; it is still read (``shared``).

Reads here are cheap on purpose: which files there are, a file's first and last line, and
whether it ends mid-line. Comparing two runs' files is metrics/digests.py's work.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bisect_prefetch.metrics.digests import DigestRecord, parse_digest_line, read_digests
from bisect_prefetch.metrics.trajectory import MAX_LINE_BYTES
from bisect_prefetch.vocab import DIGESTS_PREFIX, RANK_FILE_SUFFIX, SHARED_DIGESTS_FILE

RANK_FILE_RE = re.compile(re.escape(DIGESTS_PREFIX) + r"(\d+)(?:\.([^/]+))?" + re.escape(RANK_FILE_SUFFIX) + "$")
TAIL_BYTES = 1 << 16  # read back from a file's end to find its last line


@dataclass
class DigestFiles:
    """The digest files of one run dir."""

    ranks: dict[int, Path] = field(default_factory=dict)  # rank -> the file its writer created
    second_writers: dict[int, list[Path]] = field(default_factory=dict)  # other claims of a rank
    shared: Path | None = None  # an older run dir's one file (ranks then empty)

    @property
    def found(self) -> bool:
        return bool(self.ranks or self.second_writers or self.shared)

    def paths(self) -> list[Path]:
        """Every file, in rank order (the shared one alone)."""
        if self.shared is not None and not self.ranks:
            return [self.shared]
        return [self.ranks[r] for r in sorted(self.ranks)]


def digest_files(run_dir: str | Path) -> DigestFiles:
    """Which digest files a run dir holds (nothing when it is no directory)."""
    run_dir = Path(run_dir)
    files = DigestFiles()
    if not run_dir.is_dir():
        return files
    for path in run_dir.glob(f"{DIGESTS_PREFIX}*{RANK_FILE_SUFFIX}"):
        m = RANK_FILE_RE.match(path.name)
        if m is None or not path.is_file():
            continue
        rank = int(m[1])
        if m[2] is None:
            files.ranks[rank] = path
        else:
            files.second_writers.setdefault(rank, []).append(path)
    shared = run_dir / SHARED_DIGESTS_FILE
    if not files.ranks and not files.second_writers and shared.is_file():
        files.shared = shared
    return files


def read_run_digests(path: str | Path) -> Iterator[DigestRecord]:
    """Every record of a run dir (rank by rank), or of one digest file."""
    path = Path(path)
    if path.is_file():
        yield from read_digests(path)
        return
    for file in digest_files(path).paths():
        yield from read_digests(file)


def ends_mid_line(path: Path) -> bool:
    """Whether a file's last line has no newline: its last record was cut off."""
    with open(path, "rb") as f:
        f.seek(0, 2)
        if f.tell() == 0:
            return False
        f.seek(-1, 2)
        return f.read(1) != b"\n"


def first_record(path: Path) -> DigestRecord | None:
    """The record on a file's first line (None: empty, or not a record)."""
    with open(path, "rb") as f:
        line = f.readline(MAX_LINE_BYTES)
    return parse_digest_line(line) if line.endswith(b"\n") else None


def last_record(path: Path) -> DigestRecord | None:
    """The record on a file's last complete line, read from its end (None: there is none)."""
    with open(path, "rb") as f:
        end = f.seek(0, 2)
        start = max(0, end - TAIL_BYTES)
        f.seek(start)
        tail = f.read(end - start)
    lines = tail.split(b"\n")
    # The last element follows the last newline (empty, or a cut line); the first may be
    # the middle of a line when the tail starts inside one.
    complete = lines[1:-1] if start > 0 else lines[:-1]
    for line in reversed(complete):
        record = parse_digest_line(line)
        if record is not None:
            return record
    return None
