"""Following a running job: its metrics and gradient digests, compared with the golden run
step by step as they are written, so that a diverged run can be stopped at its first
differing step.

Every format is read by the parser `compare` uses, fed only complete new lines: console
logs by ConsoleParser (one per file, its rank from the file's name), jsonl by the same
line reader as parse_lines, regex by the same compiled pattern. The files followed are the
ones the run is read from afterwards (metrics.files, else the rule of run_files), so the
live verdict and the final one see the same numbers. A line still being written waits for
its newline; a log that stops mid-line is left to the final read, which counts it unread.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Protocol

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.metrics.compare import StreamingComparator
from bisect_prefetch.metrics.console import CONSOLE_FORMATS, ConsoleParser
from bisect_prefetch.metrics.digest_files import digest_files
from bisect_prefetch.metrics.digests import DigestRecord, common_prefix_length, parse_digest_line
from bisect_prefetch.metrics.lines import jsonl_reader, regex_reader
from bisect_prefetch.metrics.loading import jsonl_files, metric_files, rank_from_path, run_files
from bisect_prefetch.metrics.trajectory import LONG_LINE, MAX_LINE_BYTES, Columns, bounded_lines

# Which files to follow is looked up again this often (per-rank logs appear as ranks start);
# the launcher polls much more often, and a directory walk each time would cost more than
# reading the new lines.
FILES_REFRESH_S = 1.0


class MetricsConfig(Protocol):
    """What following needs of an experiment's `metrics:` (experiment.MetricsConfig)."""

    format: str
    files: str | None
    pattern: str | None
    names: list[str]


class NewLines:
    """The complete lines appended to a file since the last call, as one bytes block.

    A line over MAX_LINE_BYTES is never held whole: it comes as LONG_LINE, and what is left
    of it is read past as it arrives.
    """

    PIECE_BYTES = 1 << 20

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0  # bytes consumed: complete lines (and long lines read past)
        self._partial = b""
        self._skipping = False  # inside a long line: drop bytes up to its newline

    def read(self) -> bytes:
        out = []
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset + len(self._partial))
                while piece := f.read(self.PIECE_BYTES):
                    out.append(self._take(piece))
        except FileNotFoundError:
            return b""
        return b"".join(out)

    def _take(self, piece: bytes) -> bytes:
        if self._skipping:
            newline = piece.find(b"\n")
            if newline < 0:
                self.offset += len(piece)
                return b""
            self.offset += newline + 1
            piece, self._skipping = piece[newline + 1:], False
        block = self._partial + piece
        cut = block.rfind(b"\n") + 1
        self._partial = block[cut:]
        self.offset += cut
        if len(self._partial) <= MAX_LINE_BYTES:
            return block[:cut]
        self.offset += len(self._partial)
        self._partial, self._skipping = b"", True
        return block[:cut] + LONG_LINE + b"\n"


class _FileFeed:
    """One followed file and the parser its format reads it with."""

    def __init__(self, path: Path, config: MetricsConfig, comparator: StreamingComparator | None) -> None:
        self.lines = NewLines(path)
        self.comparator = comparator
        self.fmt = config.format
        rank = rank_from_path(path)
        if self.fmt in CONSOLE_FORMATS:
            console = CONSOLE_FORMATS[self.fmt]
            self.parser = ConsoleParser(console, config.names or console.default_names, rank or 0)
        elif self.fmt == "regex":
            self.read_line = regex_reader(config.pattern or "", rank)
        else:
            self.read_line = jsonl_reader(rank)
        self.names = set(config.names) if config.names else None
        self.values_read = 0  # metric values read so far: the job's progress

    def poll(self) -> None:
        """Read what is new; count its metric values and hand them to the comparator."""
        block = self.lines.read()
        if not block:
            return
        if self.fmt in CONSOLE_FORMATS:
            # A fresh Columns a poll: the parser hands over only what this block held.
            self.parser.columns = Columns()
            self.parser.feed(block)
            for (rank, name), (steps, values) in self.parser.columns.parts.items():
                self.values_read += len(steps)
                if self.comparator is not None:
                    for s, v in zip(steps, values, strict=True):
                        self.comparator.feed_columns(rank, name, s, v)
            return
        for raw in block.splitlines():
            record = self.read_line(raw) if raw.strip() else None
            if record is None or record == "unread":
                continue
            rank, step, metrics = record
            wanted = {k: v for k, v in metrics.items() if v is not None and (self.names is None or k in self.names)}
            self.values_read += len(wanted)
            if wanted and self.comparator is not None:
                self.comparator.feed(rank, step, wanted)


class RankDigestFollower:
    """One rank's digests, compared with the golden run's file of that rank as they are written.

    A/A runs write the same bytes until they differ, so the new lines are compared as raw
    bytes with the golden file's bytes at the same offset, and nothing is parsed while they
    agree. At the first line that differs both lines are parsed: the same record with another
    digest is the rank's first difference (the run stops there; what follows is not
    aligned and is left to the final comparison). Records the golden run lacks, or in
    another order, are followed by key through the slow path (the rest of the golden
    rank's file read once, one rank's records); a record the golden run lacks cannot be
    compared: it is counted in ``unmatched``, never taken for a difference.
    """

    def __init__(self, path: Path, reference: Path, rank: int) -> None:
        self.lines = NewLines(path)
        self.reference = reference
        self.rank = rank
        self.offset = 0  # bytes of the followed file compared so far
        self.diverged = False
        self.by_key: dict[tuple[int, int, str], str] | None = None  # the slow path, once taken
        self.unmatched = 0

    def poll(self, comparator: StreamingComparator) -> None:
        block = self.lines.read()
        if not block or self.diverged:
            return
        if self.by_key is None:
            block = self._skip_equal(block)
        for raw in block.splitlines():
            if self.diverged:
                return
            record = parse_digest_line(raw)
            if record is not None:
                self._compare(record, comparator)

    def _skip_equal(self, block: bytes) -> bytes:
        """Compare with the golden bytes at this offset; returns the lines from the first that
        differs (empty when all agree), after which the slow path follows by key."""
        start = self.offset
        expected = _read_at(self.reference, start, len(block))
        self.offset += len(block)
        if expected == block:
            return b""
        same = common_prefix_length(block, expected)
        cut = block.rfind(b"\n", 0, same) + 1
        self.by_key = {}
        with open(self.reference, "rb") as f:  # the golden rank's records from that line on
            f.seek(start + cut)
            for line in bounded_lines(f):
                record = parse_digest_line(line) if line is not None else None
                if record is not None:
                    self.by_key[record[:3]] = record.digest
        return block[cut:]

    def _compare(self, record: DigestRecord, comparator: StreamingComparator) -> None:
        assert self.by_key is not None
        expected = self.by_key.pop(record[:3], None)
        if expected is None:
            self.unmatched += 1
        elif expected != record.digest:
            comparator.note_digest_diff(record.step, record.rank, record.param)
            self.diverged = True


def _read_at(path: Path, offset: int, size: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(size)
    except OSError:
        return b""


class DigestFollower:
    """A running job's digest files, each rank's against the golden run's file of that rank.

    Ranks are found as their files appear (looked up again every FILES_REFRESH_S). A rank
    the golden run has no file of is counted in ``unmatched_ranks``. Memory: one rank's
    new lines at a time, plus the golden records of a rank that left the byte path.
    """

    def __init__(self, run_dir: Path, reference_dir: Path, comparator: StreamingComparator) -> None:
        self.run_dir = run_dir
        self.reference = digest_files(reference_dir)
        self.comparator = comparator
        self.ranks: dict[int, RankDigestFollower] = {}
        self.unmatched_ranks: set[int] = set()
        self._looked_at = -FILES_REFRESH_S

    @property
    def offset(self) -> int:
        """Bytes of digest lines read so far: the job's progress."""
        return sum(f.lines.offset for f in self.ranks.values())

    @property
    def unmatched(self) -> int:
        return sum(f.unmatched for f in self.ranks.values())

    def poll(self) -> None:
        now = time.monotonic()
        if not self.ranks or now - self._looked_at >= FILES_REFRESH_S:
            self._looked_at = now
            for rank, path in digest_files(self.run_dir).ranks.items():
                golden = self.reference.ranks.get(rank)
                if golden is None:
                    self.unmatched_ranks.add(rank)
                elif rank not in self.ranks:
                    self.ranks[rank] = RankDigestFollower(path, golden, rank)
        for follower in self.ranks.values():
            follower.poll(self.comparator)


class LiveMetrics:
    """Progress and the live comparison of a running job, polled by the launcher.

    progress() reads what is new and returns how much the job has measured so far: the
    metric values read plus the bytes of digest lines (both written only as steps end, so
    a job's other output, its start-up logs, is no progress); diverged and first_diff_step say what the comparison found;
    steps_seen is the highest step compared so far.
    """

    def __init__(self, run_dir: Path, config: MetricsConfig, comparator: StreamingComparator | None,
                 *, reference_dir: Path | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.config = config
        self.comparator = comparator
        self.feeds: dict[Path, _FileFeed] = {}
        self._per_rank = False  # once per-rank logs are followed, stdout.log no longer is
        self._files_at = -FILES_REFRESH_S
        self._paths: list[Path] = []
        self.digests: DigestFollower | None = None
        if comparator is not None and reference_dir is not None and digest_files(reference_dir).ranks:
            self.digests = DigestFollower(self.run_dir, Path(reference_dir), comparator)

    @property
    def diverged(self) -> bool:
        return self.comparator is not None and self.comparator.diverged

    @property
    def first_diff_step(self) -> int | None:
        return self.comparator.first_diff_step if self.comparator is not None else None

    @property
    def steps_seen(self) -> int:
        return self.comparator.last_step if self.comparator is not None else 0

    def progress(self) -> int:
        now = time.monotonic()
        done = sum(feed.lines.offset for feed in self.feeds.values())
        # Until the first line arrives, look every poll: the first steps count most.
        if not done or now - self._files_at >= FILES_REFRESH_S:
            self._paths, self._files_at = self._files(), now
        for path in self._paths:
            if path not in self.feeds:
                self.feeds[path] = _FileFeed(path, self.config, self.comparator)
            self.feeds[path].poll()
        if self.digests is not None:
            self.digests.poll()
        done = sum(feed.values_read for feed in self.feeds.values())
        return done + (self.digests.offset if self.digests is not None else 0)

    def _files(self) -> list[Path]:
        """The files the run's metrics are read from afterwards (see runs/run_judge.RunJudge.load)."""
        if self.config.files:
            return metric_files(self.run_dir, self.config.format, self.config.files)
        if self.config.format == "jsonl":
            return jsonl_files(self.run_dir)  # each rank's, as they appear
        if self._per_rank:
            return [p for p in run_files(self.run_dir, self.config.format) if rank_from_path(p) is not None]
        try:
            files = run_files(self.run_dir, self.config.format)
        except BisectPrefetchError:
            return []
        if any(rank_from_path(p) is not None for p in files):
            self._per_rank = True
            for stdout in [p for p in self.feeds if rank_from_path(p) is None]:
                del self.feeds[stdout]
        return files
