"""Files the tool writes: atomically (temp file beside the target, fsync, rename).

A reader (or a resumed run after SIGKILL) sees the old file or the new one,
never half of one. Files get the mode any program's new file gets (0666
less the umask), not the private 0600 of a temp file, so a CI job running as
another user can read the state dir and the reports.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.vocab import JOURNAL_FILE, LOCK_FILE, RUNS_DIR

_umask_lock = threading.Lock()


def new_file_mode() -> int:
    """0666 less the process umask: what open() would give a new file."""
    return 0o666 & ~_umask()


def _umask() -> int:
    # Linux says it in /proc: setting the umask to read it would hand a job forked
    # meanwhile the wrong umask for life.
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _umask_lock:  # elsewhere: set it straight back, one thread at a time
        umask = os.umask(0o022)
        os.umask(umask)
    return umask


# Files no output may land on (the state dir's journal and lock): `--json journal.jsonl`
# would replace the journal.
_protected: dict[Path, str] = {}


def protect(path: str | Path, what: str) -> None:
    """Refuse from now on every atomic write that resolves onto path."""
    _protected[Path(path).resolve()] = what


# The second line of every state dir's lock (the first: the holder's pid): any command
# knows a lock by it, held or not, whoever's it is.
LOCK_MARKER = "bisect-prefetch state dir lock"
STATE_JOURNAL, STATE_LOCK, STATE_RUNS = JOURNAL_FILE, LOCK_FILE, RUNS_DIR


def state_file(path: Path) -> str | None:
    """What path is when it is any state dir's journal or lock (known by content, or by
    name beside the other and a runs dir), else None: no output may replace one."""
    path = path.resolve()
    try:
        if not path.is_file():
            return None
        with open(path, "rb") as f:
            head = f.read(1 << 16)
    except OSError:
        return None
    lines = head.split(b"\n", 2)
    if len(lines) > 1 and lines[1].decode(errors="replace").strip() == LOCK_MARKER:
        return f"the lock of state dir {path.parent}"
    try:
        first = json.loads(lines[0].decode())
    except ValueError:
        first = None
    if isinstance(first, dict) and "v" in first and "variant" in first:
        return f"the journal of state dir {path.parent}"
    siblings = {STATE_JOURNAL, STATE_LOCK} - {path.name}
    if path.name in (STATE_JOURNAL, STATE_LOCK) and all(
            (path.parent / s).exists() for s in (*siblings, STATE_RUNS)):
        return f"the {'journal' if path.name == STATE_JOURNAL else 'lock'} of state dir {path.parent}"
    return None


def run_dir_of(path: Path) -> Path | None:
    """The run dir of a state dir that path lies in (a runs/<run id>/ beside a journal or a
    lock), else None: the files there are the evidence of a run, and no output may land on
    one (`--json stdout.log` would replace a run's log, `--html plan.json` its plan)."""
    path = path.resolve()
    for ancestor in path.parents:
        if ancestor.name == STATE_RUNS and any(
                (ancestor.parent / name).exists() for name in (STATE_JOURNAL, STATE_LOCK)):
            return ancestor / path.relative_to(ancestor).parts[0]
    return None


def _refuse_state_files(path: Path) -> None:
    if (what := _protected.get(path.resolve()) or state_file(path)) is not None:
        raise BisectPrefetchError(f"refusing to write {path}: it is {what}")


def check_writable(path: str | Path) -> None:
    """Refuse now an output file that could not be written later: on a protected file, a
    directory, or in a directory this process cannot write (checked before any run starts)."""
    path = Path(path)
    _refuse_state_files(path)
    if (run_dir := run_dir_of(path)) is not None:
        raise BisectPrefetchError(f"refusing to write {path}: it is inside run dir {run_dir}, "
                                  "whose files are a run's evidence (write outputs elsewhere)")
    if path.is_dir():
        raise BisectPrefetchError(f"cannot write {path}: it is a directory")
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise BisectPrefetchError(f"cannot write {path}: {ancestor} is not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise BisectPrefetchError(f"cannot write {path}: {ancestor} is not writable")


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    path = Path(path)
    _refuse_state_files(path)
    try:
        _write_then_rename(path, data)
    except OSError as exc:
        # A place that cannot be written (a file in the way, a full disk): one line, no traceback.
        raise BisectPrefetchError(f"cannot write {path}: {exc.strerror or exc}") from None
    _fsync_dir(path.parent)


def _write_then_rename(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, new_file_mode())  # mkstemp makes 0600
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | Path, text: str) -> None:
    write_bytes_atomic(path, text.encode())


def save_figure_atomic(figure: Any, path: str | Path, **savefig_options: Any) -> Path:
    """Save a matplotlib figure like any other file here: the old image or the new one."""
    path = Path(path)
    _refuse_state_files(path)  # before the drawing, not after it
    # The name's suffix chooses the format where matplotlib knows it; else PNG
    # (`--out graph.out` is a PNG, not a crash).
    kind = path.suffix.lstrip(".").lower()
    if kind not in figure.canvas.get_supported_filetypes():
        kind = "png"
    buffer = io.BytesIO()
    figure.savefig(buffer, format=kind, **savefig_options)
    write_bytes_atomic(path, buffer.getvalue())
    return path


def _fsync_dir(directory: Path) -> None:
    # The rename itself is durable only once the directory entry is synced.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
