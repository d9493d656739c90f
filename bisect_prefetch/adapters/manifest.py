"""What the job read, recorded inside the job: the manifest a reused run is checked against.

A run is reused from the journal only when everything it read is still the same (Bazel's
action key, ccache's manifest of included headers), so the manifest is taken where the
reading happens, per process (``manifest.rank{R}.json`` in the run dir; a process that saw
no step and no prefetch, such as a launcher's agent, writes ``manifest.proc.{HOST}-{PID}.json``):

- ``files``: path -> ``[size, mtime_ns, sha256]`` of every source file of every module the
  process imported that is not part of an installed distribution (the script's siblings,
  the project's packages, editable installs, anything on PYTHONPATH), and of every regular
  file it opened for reading (the ``open`` audit event) under the directories of those
  files, of the command's arguments and of its working directory. A file over
  ``HASH_LIMIT_BYTES`` has ``null`` for its hash: it is judged by size and mtime (said in
  ``by_stat``). Files under the run dir are left out (a job may write what it reads there).
- ``opened_limit``: the most opened files kept (``OPENED_LIMIT``); ``opened_truncated``: the
  job opened more, and the manifest holds only the first ones.
- ``site_dirs`` and ``dists``: the directories on sys.path, and name -> version of every
  distribution in them (by their dist-info and egg-info names, the same listing the
  orchestrator redoes to check them). The interpreter's own file is in ``files``.
- ``env``: the variables that change numerics or their order (vocab.ENV_VARIABLES), as
  this process saw them when it started.

Written after the first step (a run stopped early still has one), again at exit (a
module imported late counts), and on SIGTERM where the job left it at its default (the
orchestrator stops a job at its first difference that way). Standard library only, Python 3.9 and later.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import site
import socket
import stat
import sys
import sysconfig
import threading
from typing import Any

from bisect_prefetch.vocab import ENV_VARIABLES, manifest_process_file, manifest_rank_file

HASH_LIMIT_BYTES = 16 << 20  # larger files (data, checkpoints) by size and mtime
OPENED_LIMIT = 10_000  # distinct files opened for reading that are kept
MANIFEST_VERSION = 1
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR


def manifest_file(rank: int, *, trained: bool) -> str:
    """The manifest's file name: a rank's, or, for a process that trained nothing, its host's
    and pid's (a launcher's agent inherits the rank of nobody and must not clobber rank 0's;
    agents on two nodes may share a pid)."""
    if trained:
        return manifest_rank_file(rank)
    host = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "host"
    return manifest_process_file(host, os.getpid())


def _installed_roots() -> tuple[str, ...]:
    """Where installed, non-editable code lives: the standard library and site dirs."""
    roots = set()
    paths = sysconfig.get_paths()
    for name in ("stdlib", "platstdlib", "purelib", "platlib"):
        if paths.get(name):
            roots.add(paths[name])
    try:
        roots.update(site.getsitepackages())
    except AttributeError:  # a virtualenv's old site module
        pass
    user = getattr(site, "USER_SITE", None)
    if user:
        roots.add(user)
    for entry in sys.path:
        if os.path.basename(entry) in ("site-packages", "dist-packages"):
            roots.add(entry)
    # As written and resolved: a module's path is tested as found first (realpath is a
    # syscall per path component, and a big job imports thousands of installed modules).
    return tuple({os.path.join(f(r), "") for r in roots if r for f in (os.path.abspath,
                                                                          os.path.realpath)})


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return path.startswith(roots)


class Manifest:
    """One process's record of what it read; ``start()`` hooks the open audit event."""

    def __init__(self, *, out_dir: str, argv: list[str] | None = None) -> None:
        self.out_dir = os.path.join(os.path.realpath(out_dir), "")
        self.argv = list(sys.argv if argv is None else argv)
        self.cwd = os.getcwd()
        self.env = {name: os.environ.get(name) for name in ENV_VARIABLES}
        self.installed = _installed_roots()
        self.opened: dict[str, None] = {}  # in order, each once
        self.opened_truncated = False

    def start(self) -> None:
        sys.addaudithook(self._audit)

    def _audit(self, event: str, args: tuple) -> None:
        # Runs on every audit event of the process: the cheap test first, and never raise
        # (an exception here would fail the job's own open).
        if event != "open":
            return
        try:
            path, _mode, flags = args
            if flags & _WRITE_FLAGS or isinstance(path, int):
                return
            path = os.path.abspath(os.fsdecode(path))
            if path.endswith(".pyc") or path in self.opened or _under(path, self.installed):
                return
            if len(self.opened) >= OPENED_LIMIT:
                self.opened_truncated = True
                return
            self.opened[path] = None
        except Exception:
            return

    # -- what to record ---------------------------------------------------------------
    def _module_files(self) -> list[str]:
        out = []
        for name, module in list(sys.modules.items()):
            if name.startswith("bisect_prefetch") and not name.startswith("bisect_prefetch.workloads"):
                continue  # the adapter is the tool's code, not the job's
            origin = getattr(getattr(module, "__spec__", None), "origin", None) or getattr(
                module, "__file__", None)
            if not isinstance(origin, str) or not os.path.isabs(origin):
                continue  # built-in, frozen, namespace
            if os.path.basename(origin) == "sitecustomize.py" and "bisect_prefetch" in origin:
                continue
            if not _under(origin, self.installed):
                out.append(os.path.realpath(origin))
        return out

    def _argument_dirs(self) -> list[str]:
        dirs = [self.cwd]
        for word in self.argv:
            for candidate in {word, word.partition("=")[2]} - {""}:
                path = os.path.abspath(candidate)
                if os.path.isdir(path):
                    dirs.append(path)
                elif os.path.isfile(path):
                    dirs.append(os.path.dirname(path))
        return dirs

    def record(self) -> dict[str, Any]:
        modules = [p for p in self._module_files()
                   if not _under(p, self.installed) and not p.startswith(self.out_dir)]
        dirs = {os.path.join(os.path.realpath(d), "")
                for d in [os.path.dirname(p) for p in modules] + self._argument_dirs()}
        watched = tuple(d for d in dirs if not d.startswith(self.out_dir))
        opened = [os.path.realpath(p) for p in list(self.opened)]
        opened = [p for p in opened if _under(p, watched) and not p.startswith(self.out_dir)]
        files: dict[str, Any] = {}
        by_stat = []
        interpreter = [os.path.realpath(sys.executable)] if sys.executable else []
        for path in sorted(set(modules) | set(opened) | set(interpreter)):
            entry = _file_entry(path)
            if entry is None:
                continue
            files[path] = entry
            if entry[2] is None:
                by_stat.append(path)
        site_dirs = _site_dirs()
        return {"v": MANIFEST_VERSION, "pid": os.getpid(), "files": files, "by_stat": by_stat,
                "hash_limit_bytes": HASH_LIMIT_BYTES, "opened_limit": OPENED_LIMIT,
                "opened_truncated": self.opened_truncated, "site_dirs": site_dirs,
                "dists": dists_in(site_dirs), "env": self.env,
                "python": sys.version.split()[0], "executable": sys.executable}

    def write(self, rank: int, *, trained: bool) -> None:
        text = json.dumps(self.record(), sort_keys=True) + "\n"
        target = os.path.join(self.out_dir, manifest_file(rank, trained=trained))
        tmp = f"{target}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, target)


def _file_entry(path: str) -> list[Any] | None:
    """[size, mtime_ns, sha256 or None (over the limit)]; None for what is no regular file."""
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            return None
        if info.st_size > HASH_LIMIT_BYTES:
            return [info.st_size, info.st_mtime_ns, None]
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        return [info.st_size, info.st_mtime_ns, digest]
    except OSError:
        return None


def _site_dirs() -> list[str]:
    """The directories on sys.path, where distributions are found (one installed later
    into a directory that held none counts too)."""
    out = []
    for entry in sys.path:
        path = os.path.realpath(entry or os.curdir)
        if os.path.isdir(path) and path not in out:
            out.append(path)
    return out


def dists_in(site_dirs: list[str]) -> dict[str, str]:
    """name -> version of the distributions in these directories, the first one found
    winning as at import. A name from its metadata directory's: `torch-2.13.0.dist-info`."""
    out: dict[str, str] = {}
    for path in site_dirs:
        try:
            names = sorted(os.listdir(path))
        except OSError:
            continue
        for name in names:
            stem, dot, kind = name.rpartition(".")
            if not dot or kind not in ("dist-info", "egg-info"):
                continue
            dist, _, rest = stem.partition("-")
            version = rest.partition("-")[0] or "?"
            out.setdefault(dist.lower().replace("-", "_").replace(".", "_"), version)
    return out


def attach(session: Any) -> Manifest | None:
    """Record what this process reads, written after the first step and at exit."""
    plan = session.plan
    if plan is None or not plan.out_dir:
        return None
    manifest = Manifest(out_dir=plan.out_dir)
    manifest.start()

    def write() -> None:
        trained = session.last_step is not None or bool(session.tally.edges)
        try:
            manifest.write(session.rank, trained=trained)
        except Exception as e:  # a manifest must never stop the job; the run is not reused
            session.note_error(f"manifest not written: {e!r}")

    def first_step(step: int) -> None:
        if not written:
            written.append(step)
            write()

    written: list[int] = []
    session.add_step_end_listener(first_step)
    session.add_exit_listener(write)
    _write_on_sigterm(write)
    return manifest


def _write_on_sigterm(write: Any) -> None:
    """A job stopped early (SIGTERM, at its first difference) runs no exit handler: write
    the manifest then, and die of the signal as before. Only where the job left SIGTERM
    at its default; a handler the job sets later replaces this one."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def on_term(signum: int, _frame: Any) -> None:
        try:
            write()
        finally:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, on_term)
