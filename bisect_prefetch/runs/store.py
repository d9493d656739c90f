"""The run store: `<state-dir>/<experiment>/` with its lock, run dirs and journal.

The journal (`journal.jsonl`) is the raw record: one JSON line per finished
run, format version "v": 1, flushed and fsynced before the next run starts.
Everything else (verdicts, search state, reports) is rebuilt from it, so a
resumed command re-runs nothing that finished. A SIGKILL can tear only the
last line; that line is reported and cut off, never fatal.

One orchestrator at a time: the state dir holds an exclusive flock, released
by the kernel when the process dies, however it dies.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.files import LOCK_MARKER, STATE_JOURNAL, STATE_LOCK, protect
from bisect_prefetch.vocab import RUNS_DIR, Mask

JOURNAL_VERSION = 1
JOURNAL = STATE_JOURNAL
# A line holding this key records a job at submission, not a finished run.
SUBMITTED = "submitted"
LOCK = STATE_LOCK


@dataclass(frozen=True)
class RunKey:
    """What makes two runs the same run: a finished one is never run again.

    variant says which protocol asked for the run (aa, search, golden, a
    matrix cell) and the experiment fingerprint; index is the run's place in
    its group (the k-th request for that mask); attempt counts retries.
    """

    variant: str
    mask: Mask | None
    guard: str
    steps: int
    index: int
    attempt: int = 0
    stress: bool = False  # delays before each prefetch is issued (adapters/stress.py)
    # Several masks by step (search/segments.py): (first step, mask) per segment; mask is
    # then the first segment's. None: one mask for the whole run.
    schedule: tuple[tuple[int, Mask], ...] | None = None

    @classmethod
    def of(cls, *, variant: str, mask: Iterable[str] | None, guard: str, steps: int,
           index: int, attempt: int = 0, stress: bool = False,
           schedule: Iterable[tuple[int, Iterable[str]]] | None = None) -> RunKey:
        if schedule is not None:
            schedule = tuple((int(first), Mask(m)) for first, m in schedule)
        return cls(variant, None if mask is None else Mask(mask), guard, steps, index, attempt,
                   stress, schedule)

    def to_json(self) -> dict[str, Any]:
        out = {"variant": self.variant, "mask": None if self.mask is None else sorted(self.mask),
               "guard": self.guard, "steps": self.steps, "index": self.index,
               "attempt": self.attempt}
        if self.stress:  # written only when on: journals from before stress read the same
            out["stress"] = True
        if self.schedule is not None:  # likewise: journals from before segments read the same
            out["schedule"] = [[first, sorted(m)] for first, m in self.schedule]
        return out

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> RunKey:
        return cls.of(variant=record["variant"], mask=record["mask"], guard=record["guard"],
                      steps=record["steps"], index=record["index"],
                      attempt=record.get("attempt", 0), stress=record.get("stress") is True,
                      schedule=record.get("schedule"))


@dataclass
class Journal:
    records: list[dict[str, Any]]
    torn_line: str | None  # the unparsable last line, if a kill tore it


def open_regular(path: Path, flags: int) -> int:
    """A descriptor of path, never through a symlink, and only of a regular file.

    The state dir may sit on a shared filesystem where others can write: a `lock` or
    `journal.jsonl` planted as a link must not make us truncate or append to its target.
    """
    try:
        # O_NONBLOCK: a planted FIFO must not hang the open; cleared once it is a file
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise BisectPrefetchError(f"{path} is a symlink; refusing to follow it "
                                      "(move it away)") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise BisectPrefetchError(f"{path} is not a regular file (move it away)")
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return fd


def read_journal(path: Path) -> Journal:
    """All records; a torn last line is returned apart, a bad line elsewhere is an error."""
    try:
        with os.fdopen(open_regular(path, os.O_RDONLY), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return Journal([], None)
    except OSError as exc:
        raise BisectPrefetchError(f"cannot read journal {path}: {exc.strerror or exc}") from None
    lines = data.split(b"\n")
    # The file ends with "\n" when every write completed: the last piece is then empty.
    records, torn = [], None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            # Lines are written as ASCII JSON: bytes that are not UTF-8 are damage too.
            record = json.loads(line.decode("utf-8"))
            if not isinstance(record, dict):
                raise ValueError("not an object")
        except ValueError:
            if number == len(lines):
                torn = line.decode("utf-8", errors="replace")
                continue
            raise BisectPrefetchError(
                f"journal {path} line {number} is corrupt (not a JSON object); "
                "move the file away to start over"
            ) from None
        if record.get("v") != JOURNAL_VERSION:
            raise BisectPrefetchError(
                f"journal {path} line {number} has format version {record.get('v')!r}; "
                f"this tool reads version {JOURNAL_VERSION}"
            )
        records.append(record)
    return Journal(records, torn)


def _has_run_key(record: dict[str, Any]) -> bool:
    """Whether a record holds the fields of a RunKey, with their types."""
    def whole(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    def edges(value: Any) -> bool:
        return isinstance(value, list) and all(isinstance(e, str) for e in value)

    mask, schedule = record.get("mask"), record.get("schedule")
    return (
        isinstance(record.get("variant"), str) and isinstance(record.get("guard"), str)
        and (mask is None or edges(mask))
        and whole(record.get("steps")) and whole(record.get("index"))
        and whole(record.get("attempt", 0))
        and (schedule is None or isinstance(schedule, list) and all(
            isinstance(s, list) and len(s) == 2 and whole(s[0]) and edges(s[1]) for s in schedule))
    )


_SLUG = re.compile(r"[^A-Za-z0-9._-]+")
# A run dir's number: its leading digits, at least RUN_NUMBER_WIDTH of them (zero-padded),
# more past 9999; compared as numbers, never as text.
RUN_NUMBER_WIDTH = 4
_RUN_NUMBER = re.compile(r"(\d+)(?:-|$)")


def run_number(run_id: str) -> int | None:
    """The number a run id starts with (`0042-aa-k0` -> 42, `10000-aa-k1` -> 10000)."""
    match = _RUN_NUMBER.match(run_id)
    return int(match.group(1)) if match else None


class StateDir:
    """One experiment's state. Use as a context manager to hold its lock."""

    def __init__(self, root: str | Path, name: str) -> None:
        self.path = Path(root).resolve() / name
        self.journal_path = self.path / JOURNAL
        self.runs_path = self.path / RUNS_DIR
        protect(self.journal_path, f"the journal of {self.path}")
        protect(self.path / LOCK, f"the lock of {self.path}")
        self.torn_line: str | None = None
        self._lock_fd: int | None = None
        self._index: dict[RunKey, list[dict[str, Any]]] = {}  # every finished run of a key
        self._submitted: dict[RunKey, list[dict[str, Any]]] = {}
        self._finished_ids: set[str] = set()
        self._records: list[dict[str, Any]] = []

    # -- lock -------------------------------------------------------------
    def lock(self) -> StateDir:
        """Take the exclusive lock, then load the journal (repairing a torn tail)."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            fd = open_regular(self.path / LOCK, os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            raise BisectPrefetchError(
                f"cannot use state dir {self.path}: {exc.strerror or exc}"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").split("\n")[0].strip() or "?"
            os.close(fd)
            raise BisectPrefetchError(
                f"state dir {self.path} is in use by another bisect-prefetch (pid {holder}); "
                "wait for it to finish or give a different --state-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n{LOCK_MARKER}\n".encode(), 0)
        self._lock_fd = fd
        try:
            self._load()
        except BaseException:
            self.unlock()  # a journal we cannot use: do not keep the state dir locked
            raise
        return self

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    def __enter__(self) -> StateDir:
        return self.lock()

    def __exit__(self, *exc: object) -> None:
        self.unlock()

    def _require_lock(self) -> None:
        if self._lock_fd is None:
            raise RuntimeError("StateDir used without holding its lock")

    # -- journal ----------------------------------------------------------
    def _load(self) -> None:
        journal = read_journal(self.journal_path)
        index: dict[RunKey, list[dict[str, Any]]] = {}
        submitted: dict[RunKey, list[dict[str, Any]]] = {}
        finished = []
        for number, record in enumerate(journal.records, start=1):
            if not _has_run_key(record):
                raise BisectPrefetchError(
                    f"journal {self.journal_path} record {number} is not a run record "
                    "(missing or bad key fields); move the file away to start over"
                )
            if SUBMITTED in record:
                submitted.setdefault(RunKey.from_record(record), []).append(record)
                continue
            index.setdefault(RunKey.from_record(record), []).append(record)
            finished.append(record)
        self.torn_line = journal.torn_line
        self._repair_tail()
        self._records, self._index, self._submitted = finished, index, submitted
        self._finished_ids = {str(r.get("run_id")) for r in finished}

    def _repair_tail(self) -> None:
        """End the journal with a whole line: appending after a partial one would glue onto it.

        A kill can leave a torn last line (cut off: its run never counted as
        finished) or a whole record short of its newline (the newline is added).
        """
        try:
            with os.fdopen(open_regular(self.journal_path, os.O_RDONLY), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return
        if not data or data.endswith(b"\n"):
            return
        with os.fdopen(open_regular(self.journal_path, os.O_RDWR), "r+b") as f:
            if self.torn_line is not None:
                f.truncate(data.rfind(b"\n") + 1)
            else:
                f.seek(0, os.SEEK_END)
                f.write(b"\n")
            f.flush()
            os.fsync(f.fileno())

    def records(self) -> list[dict[str, Any]]:
        return list(self._records)

    def find(self, key: RunKey) -> dict[str, Any] | None:
        """The journal record of the latest finished run with this key, if there is one."""
        found = self._index.get(key)
        return found[-1] if found else None

    def find_all(self, key: RunKey) -> list[dict[str, Any]]:
        """Every finished run with this key, the latest first (sessions may repeat a key)."""
        return list(reversed(self._index.get(key, [])))

    def submitted(self, key: RunKey) -> dict[str, Any] | None:
        """The submission record of a run with this key whose job may still run."""
        left = [r for r in self._submitted.get(key, []) if r.get("run_id") not in self._finished_ids]
        return left[-1] if left else None

    def unfinished_submissions(self) -> list[dict[str, Any]]:
        """Submission records with no finished run: jobs a dead orchestrator may have left."""
        return [r for records in self._submitted.values() for r in records
                if r.get("run_id") not in self._finished_ids]

    def append_submitted(self, key: RunKey, *, run_id: str, job_id: str,
                         executor: str, session: str | None = None) -> dict[str, Any]:
        """Journal a job at submission, before waiting on it (lines with `submitted`)."""
        full = self._write({"v": JOURNAL_VERSION, SUBMITTED: job_id, "job_id": job_id,
                            "run_id": run_id, "executor": executor, **key.to_json(),
                            **({"session": session} if session is not None else {})})
        self._submitted.setdefault(key, []).append(full)
        return full

    def append(self, key: RunKey, record: dict[str, Any]) -> dict[str, Any]:
        """Journal one finished run: one line, flushed and fsynced before returning."""
        full = self._write({"v": JOURNAL_VERSION, "finished_at": round(time.time(), 3),
                            **record, **key.to_json()})
        self._records.append(full)
        self._index.setdefault(key, []).append(full)
        self._finished_ids.add(str(full.get("run_id")))
        return full

    def _write(self, full: dict[str, Any]) -> dict[str, Any]:
        self._require_lock()
        line = json.dumps(full, sort_keys=True, allow_nan=True) + "\n"
        new_file = not self.journal_path.exists()
        try:
            fd = open_regular(self.journal_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            with os.fdopen(fd, "a", encoding="utf-8") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:  # a full disk, a journal made read-only: one line, exit 2
            raise BisectPrefetchError(
                f"cannot append to journal {self.journal_path}: {exc.strerror or exc}; "
                "the run's files are in its run dir, the same command runs it again") from None
        if new_file:
            _fsync_dir(self.path)
        return full

    # -- run dirs ---------------------------------------------------------
    def new_run_dir(self, label: str) -> tuple[str, Path]:
        """A fresh run dir `runs/<NNNN>-<label>/`; numbers never repeat, even after a kill."""
        self._require_lock()
        path = self.runs_path
        try:
            self.runs_path.mkdir(parents=True, exist_ok=True)
            taken = [n for p in self.runs_path.iterdir() if (n := run_number(p.name)) is not None]
            number = max(taken, default=0) + 1
            run_id = f"{number:0{RUN_NUMBER_WIDTH}d}-{_SLUG.sub('_', label).strip('_') or 'run'}"
            path = self.runs_path / run_id
            path.mkdir()
        except OSError as exc:
            raise BisectPrefetchError(f"cannot create run dir {path}: {exc.strerror}") from None
        return run_id, path

    def run_dir(self, run_id: str) -> Path:
        return self.runs_path / run_id


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
