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
from bisect_prefetch.metrics.digests import DigestRecord, parse_digest_line, read_digests
from bisect_prefetch.metrics.lines import jsonl_reader, regex_reader
from bisect_prefetch.metrics.loading import metric_files, rank_from_path, run_files
from bisect_prefetch.metrics.trajectory import LONG_LINE, MAX_LINE_BYTES, Columns

DIGEST_FILE = "digests.jsonl"
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


class DigestFollower:
    """Compares a running job's digest records with the golden run's, as they are written.

    A record whose (step, rank, param) the golden run lacks cannot be compared: it is
    counted in ``unmatched``, never taken for a difference (H8's digest comparison says
    what such sets mean once the run ended).
    """

    def __init__(self, path: Path, reference: Path, comparator: StreamingComparator) -> None:
        self.lines = NewLines(path)
        self.comparator = comparator
        self.reference = {(r.step, r.rank, r.param): r.digest for r in read_digests(reference)}
        self.unmatched = 0

    def poll(self) -> None:
        for raw in self.lines.read().splitlines():
            record = parse_digest_line(raw)
            if record is not None:
                self._compare(record)

    def _compare(self, record: DigestRecord) -> None:
        expected = self.reference.get((record.step, record.rank, record.param))
        if expected is None:
            self.unmatched += 1
        elif expected != record.digest:
            self.comparator.note_digest_diff(record.step, record.rank, record.param)


class LiveMetrics:
    """Progress and the live comparison of a running job, polled by the launcher.

    progress() reads what is new and returns how much the job has measured so far: the
    metric values read plus the bytes of digest lines (both written only as steps end, so
    a job's other output, its start-up logs, is no progress); diverged and first_diff_step say what the comparison found;
    steps_seen is the highest step compared so far.
    """

    def __init__(self, run_dir: Path, config: MetricsConfig, comparator: StreamingComparator | None,
                 *, reference_digests: Path | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.config = config
        self.comparator = comparator
        self.feeds: dict[Path, _FileFeed] = {}
        self._per_rank = False  # once per-rank logs are followed, stdout.log no longer is
        self._files_at = -FILES_REFRESH_S
        self._paths: list[Path] = []
        self.digests: DigestFollower | None = None
        if comparator is not None and reference_digests is not None and reference_digests.is_file():
            self.digests = DigestFollower(self.run_dir / DIGEST_FILE, reference_digests, comparator)

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
        return done + (self.digests.lines.offset if self.digests is not None else 0)

    def _files(self) -> list[Path]:
        """The files the run's metrics are read from afterwards (see Runner._load)."""
        if self.config.files:
            return metric_files(self.run_dir, self.config.format, self.config.files)
        if self.config.format == "jsonl":
            return [self.run_dir / "metrics.jsonl"]  # the recorder's file, before it exists too
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
