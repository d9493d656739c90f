"""What a job's processes read, recorded inside the job: the manifest reuse is checked against.

A journaled run is taken again (`--reuse`, `--resume`) only while everything it read is the
same (Bazel's action key, ccache's manifest of included headers), so the manifest is taken
where the reading happens, by every process of the job. Each one appends to its own file,
``manifest.{HOST}-{PID}.jsonl`` in the run dir (every writer owns its file: ranks, a
launcher's agent, a forked worker). A line holds what is new since the process's previous
line, and the process's header; a line at a step end says the ``step`` (alone when nothing is
new); the last line of a process that ended by itself (exit, ``os._exit``, a SIGTERM it left
at its default) says ``"closed": true``. A file without it is a process that was killed: its
run is not reused, unless the orchestrator stopped it at its first differing step and the
process had recorded every step before that one.

Entries (each path once a process):

- ``files``: path -> ``[size, mtime_ns, sha256]`` of every source file of a module the process
  imported outside installed distributions (the script's siblings, the project's packages,
  editable installs, PYTHONPATH), of the interpreter, and of every regular file it opened to
  read (``r``, ``r+``, ``a+``, a ``numpy.memmap`` in ``r+``: the ``open`` audit event) under its
  directories: those of its modules, of the command's path arguments, and its working
  directory. Over ``HASH_LIMIT_BYTES`` the hash is ``null``: judged by size and mtime (listed
  in ``by_stat``). A file whose size or mtime moved between its first open and its hashing
  (the job wrote into it) has the hash ``CHANGED_IN_RUN``. Files under the run dir are left out.
- ``links``: a path through a symlink -> the path it led to (``os.path.realpath``), for each
  file above reached through one, and each link under its directories it resolved itself
  (``os.readlink``, ``os.path.realpath``): a retargeted ``latest`` link is a change.
- ``absent``: paths under its directories the process looked for and did not find, and that
  were still missing when it ended (an open or an ``os.stat``, as ``os.path.exists`` does,
  that failed), and where each module it failed to import would have been found: an
  override file or module created later is a change. What the job created itself is not.
- ``installed``: path -> ``[size, mtime_ns]`` of every module file it imported from installed
  distributions or the standard library: a package edited in place is a change.

The header: ``rank``, ``pid``, ``site_dirs`` and ``dists`` (the directories on sys.path, and
name -> version of every distribution in them), ``env`` (the numerics variables,
vocab.ENV_VARIABLES, as the process saw them), ``opened_limit`` and ``opened_truncated``
(it opened or looked for more than ``OPENED_LIMIT`` files: its manifest is not complete, and
its run is never reused).

Written when the process starts (a file that says it began), at each step end (only what is
new), and when it ends: at exit, in ``os._exit`` (wrapped), and on SIGTERM where the job
left it at its default (the orchestrator stops a job at its first difference that way). A
forked process keeps recording (the audit hook survives a fork) into a file of its own.

What it cannot see: files read by other programs (``cat``, a shell) or by native code
(SQLite), files outside its directories (a data dir named only by an environment variable or
a config value), and an edit that keeps a file's size and mtime. Standard library only,
Python 3.9 and later.
"""

from __future__ import annotations

import atexit
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

from bisect_prefetch.vocab import ENV_VARIABLES, manifest_process_file

HASH_LIMIT_BYTES = 16 << 20  # larger files (data, checkpoints) by size and mtime
OPENED_LIMIT = 10_000  # distinct files opened (or looked for) that are kept
MANIFEST_VERSION = 2
CHANGED_IN_RUN = "changed during the run"  # a file's hash when the job wrote into it
# Opens that never read the file's old bytes: write-only, or truncating.
_NOT_READ = os.O_WRONLY | os.O_TRUNC

# The real functions, before the wrappers below replace them on the os module.
_real_stat = os.stat
_real_readlink = os.readlink
_real_exit = os._exit
_current: Manifest | None = None  # this process's manifest: the wrappers report to it


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


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "host"


def _both(path: str) -> set[str]:
    """A directory as written and resolved, each with a trailing separator."""
    return {os.path.join(os.path.abspath(path), ""), os.path.join(os.path.realpath(path), "")}


class Manifest:
    """One process's record of what it read; ``start()`` hooks the audit events."""

    def __init__(self, *, out_dir: str, argv: list[str] | None = None, rank: int = 0) -> None:
        self.out_dir = os.path.join(os.path.realpath(out_dir), "")
        self.argv = list(sys.argv if argv is None else argv)
        self.cwd = os.getcwd()
        self.rank = rank
        self.env = {name: os.environ.get(name) for name in ENV_VARIABLES}
        self.installed = _installed_roots()
        self._arg_dirs = self._argument_dirs()
        self._lock = threading.RLock()
        self._begin(set())

    def _begin(self, modules_seen: set[str]) -> None:
        """This process's own record, from nothing: at start, and in a forked child (whose
        parent records the modules it had)."""
        self.pid = os.getpid()
        self.path = os.path.join(self.out_dir, manifest_process_file(_host(), self.pid))
        # path as opened -> (size, mtime_ns) at its first open; None: it did not exist
        self.opened: dict[str, tuple[int, int] | None] = {}
        self.looked_for: dict[str, None] = {}  # os.stat failed: not there
        self.links_read: dict[str, None] = {}  # links it resolved itself (os.readlink)
        self.imports: dict[str, None] = {}  # every module name the process went to import
        self.opened_truncated = False
        self._order: list[str] = []  # opened paths in order; written up to _done
        self._done = 0
        self._waiting: list[str] = []  # opened, not (yet) under a watched directory
        self._watched_last: tuple[str, ...] = ()
        self._modules = set(modules_seen)
        self._modules_count = -1
        self._dirs: set[str] = set()  # directories of its own modules
        self._written: set[str] = set()  # paths this process's file has an entry for
        self._dists_of: tuple[tuple[str, ...], dict[str, str]] | None = None
        self._lines = 0
        self._busy = False
        self._writer = 0  # the thread writing now: its own opens and stats are not the job's
        self.signal_after_write: int | None = None  # a SIGTERM that came inside a write
        self.closed = False

    def start(self) -> None:
        """Record from now on, and write the first line: a process killed before it ends
        leaves a file that says it began and never closed."""
        global _current
        _current = self
        sys.addaudithook(self._audit)
        _install_wrappers()
        self.write()

    # -- what the process does ------------------------------------------------------------
    def _audit(self, event: str, args: tuple) -> None:
        # Runs on every audit event of the process: the cheap tests first, and never raise
        # (an exception here would fail the job's own open or import).
        try:
            if event == "open":
                self._opening(*args[:3])
            elif event == "import":
                self.imports[args[0]] = None
        except Exception:
            return

    def _opening(self, path: Any, _mode: Any, flags: Any) -> None:
        if (path is None or isinstance(path, int) or (flags or 0) & _NOT_READ
                or self._writer == threading.get_ident()):
            return
        path = os.path.abspath(os.fsdecode(path))
        if path in self.opened or not self._the_jobs(path):
            return
        if len(self.opened) >= OPENED_LIMIT:
            self.opened_truncated = True
            return
        try:
            info = _real_stat(path)
        except OSError:
            self.opened[path] = None
        else:
            if not stat.S_ISREG(info.st_mode):
                return  # a directory, a device: no bytes of a file
            self.opened[path] = (info.st_size, info.st_mtime_ns)
        self._order.append(path)

    def _the_jobs(self, path: str) -> bool:
        """Whether a path is the job's input: not bytecode, the run dir or an installed
        module (those have checks of their own)."""
        return not (path.endswith(".pyc") or path.startswith(self.out_dir)
                    or _under(path, self.installed))

    def _looked(self, path: Any) -> None:
        """os.stat found nothing there (os.path.exists, isfile, pathlib's exists)."""
        if self._writer == threading.get_ident():
            return
        path = os.path.abspath(os.fsdecode(path))
        if path in self.looked_for or not self._the_jobs(path):
            return
        if len(self.looked_for) >= OPENED_LIMIT:
            self.opened_truncated = True
            return
        self.looked_for[path] = None

    def _link_read(self, path: Any) -> None:
        if len(self.links_read) < OPENED_LIMIT and self._writer != threading.get_ident():
            self.links_read.setdefault(os.path.abspath(os.fsdecode(path)), None)

    def forked(self) -> None:
        """In a forked child: record on into a file of its own (its parent writes what it
        had), closed when the child ends."""
        self._lock = threading.RLock()  # the parent's was held across the fork
        self._begin(set(sys.modules))
        atexit.register(self.write, closed=True)
        self.write()

    # -- writing --------------------------------------------------------------------------
    def write(self, *, closed: bool = False, step: int | None = None) -> None:
        """Append what is new since the last line (closed: the last line of the process;
        step: the step that just ended, said even when nothing is new, in a line of its own).
        A SIGTERM that came inside this write (``signal_after_write``) closes the file once
        the write is done, then ends the process as the signal would have."""
        self._write(closed=closed, step=step)
        if self.signal_after_write is not None and not self._busy:
            signum, self.signal_after_write = self.signal_after_write, None
            self._write(closed=True)
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def writing_here(self) -> bool:
        """Whether this thread is inside a write (a signal handler running on top of it)."""
        return self._busy and self._writer == threading.get_ident()

    def _write(self, *, closed: bool = False, step: int | None = None) -> None:
        with self._lock:
            if self.closed or self._busy:
                return  # closed, or called from a signal handler on top of a write (write())
            self._busy, self._writer = True, threading.get_ident()
            try:
                line = self._new(final=closed)
                if line or closed or not self._lines:
                    line.update(self._header(final=closed))
                elif step is None:
                    return
                if step is not None:
                    line["step"] = step
                if closed:
                    line["closed"] = True
                data = (json.dumps(line, sort_keys=True) + "\n").encode()
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    while data:
                        data = data[os.write(fd, data):]
                finally:
                    os.close(fd)
                self._lines += 1
                self.closed = closed
            finally:
                self._busy, self._writer = False, 0

    def _header(self, *, final: bool) -> dict[str, Any]:
        site_dirs = _site_dirs()
        if final or self._dists_of is None or self._dists_of[0] != tuple(site_dirs):
            self._dists_of = (tuple(site_dirs), dists_in(site_dirs))
        return {"v": MANIFEST_VERSION, "pid": self.pid, "rank": self.rank,
                "hash_limit_bytes": HASH_LIMIT_BYTES, "opened_limit": OPENED_LIMIT,
                "opened_truncated": self.opened_truncated, "site_dirs": site_dirs,
                "dists": self._dists_of[1], "env": self.env,
                "python": sys.version.split()[0], "executable": sys.executable}

    def _new(self, *, final: bool) -> dict[str, Any]:
        files: dict[str, Any] = {}
        links: dict[str, str] = {}
        installed: dict[str, list[int]] = {}
        if final or len(sys.modules) != self._modules_count:
            self._modules_count = len(sys.modules)
            self._new_modules(files, links, installed)
        if sys.executable and not self._lines:
            self._file(os.path.realpath(sys.executable), None, files)
        watched = self._watched()
        # Paths that waited for a watched directory are looked at again only when there is
        # a new one (a module imported from it), or at the end: a step end stays cheap.
        again = final or watched != self._watched_last
        self._watched_last = watched
        waiting = (self._waiting if again else []) + self._order[self._done:]
        if again:
            self._waiting = []
        self._done = len(self._order)
        absent: list[str] = []
        for path in waiting:
            self._opened_file(path, watched, files, links, absent, final=final)
        if final:
            absent += self._absent(watched)
            for link in list(self.links_read):  # realpath reads links too: a copy
                if _under(link, watched) and link not in self._written:
                    self._written.add(link)
                    links[link] = os.path.realpath(link)
        out: dict[str, Any] = {}
        for name, value in (("files", files), ("links", links), ("absent", sorted(absent)),
                            ("installed", installed)):
            if value:
                out[name] = value
        return out

    def _new_modules(self, files: dict, links: dict, installed: dict) -> None:
        for name, module in list(sys.modules.items()):
            if name in self._modules:
                continue
            self._modules.add(name)
            if name.startswith("bisect_prefetch") and not name.startswith("bisect_prefetch.workloads"):
                continue  # the adapter is the tool's code, not the job's
            origin = getattr(getattr(module, "__spec__", None), "origin", None) or getattr(
                module, "__file__", None)
            if not isinstance(origin, str) or not os.path.isabs(origin):
                continue  # built-in, frozen, namespace
            if os.path.basename(origin) == "sitecustomize.py" and "bisect_prefetch" in origin:
                continue
            if _under(origin, self.installed):
                if origin not in self._written:
                    self._written.add(origin)
                    try:
                        info = _real_stat(origin)
                        installed[origin] = [info.st_size, info.st_mtime_ns]
                    except OSError:
                        pass
                continue
            real = os.path.realpath(origin)
            if real.startswith(self.out_dir) or _under(real, self.installed):
                continue
            self._dirs |= _both(os.path.dirname(origin))
            if real != origin and origin not in self._written:
                self._written.add(origin)
                links[origin] = real
            self._file(real, None, files)

    def _opened_file(self, path: str, watched: tuple[str, ...], files: dict, links: dict,
                     absent: list[str], *, final: bool) -> None:
        first = self.opened.get(path)
        if first is None:  # it was not there when opened
            if final and _under(path, watched) and not os.path.lexists(path):
                absent.append(path)  # still not there: not something the job made
            elif not final:
                self._waiting.append(path)
            return
        real = os.path.realpath(path)
        if not (_under(path, watched) or _under(real, watched)):
            if not final:
                self._waiting.append(path)  # a module imported later may make it watched
            return
        if real.startswith(self.out_dir):
            return
        if real != path and path not in self._written:
            self._written.add(path)
            links[path] = real
        self._file(real, first, files)

    def _file(self, path: str, first: tuple[int, int] | None, files: dict) -> None:
        if path in self._written:
            return
        self._written.add(path)
        entry = _file_entry(path)
        if entry is None:
            return
        if first is not None and tuple(entry[:2]) != first:
            entry[2] = CHANGED_IN_RUN  # the job wrote into it after reading
        files[path] = entry

    def _absent(self, watched: tuple[str, ...]) -> list[str]:
        """What the process looked for, did not find, and is still not there now (what the
        job created itself, an output dir, is not), and where its failed imports would have
        been found."""
        out = [p for p in self.looked_for
               if p not in self._written and _under(p, watched) and not os.path.lexists(p)]
        for name in self.imports:
            if name not in sys.modules:
                out += [p for p in self._import_candidates(name) if not os.path.lexists(p)]
        self._written.update(out)
        return out

    def _import_candidates(self, name: str) -> list[str]:
        import importlib.machinery

        parent, _, leaf = name.rpartition(".")
        if parent:
            dirs = list(getattr(sys.modules.get(parent), "__path__", None) or [])
        else:
            dirs = [entry or os.curdir for entry in sys.path]
        out = []
        for entry in dirs:
            if not isinstance(entry, str):
                continue
            where = os.path.join(os.path.abspath(entry), "")
            if where.startswith(self.out_dir) or _under(where, self.installed) or not os.path.isdir(where):
                continue
            out += [where + leaf + suffix for suffix in importlib.machinery.all_suffixes()]
            out.append(where + leaf)  # a package, or a namespace package's directory
        return [p for p in out if p not in self._written]

    # -- where the job's own files are ------------------------------------------------------
    def _argument_dirs(self) -> set[str]:
        dirs = _both(self.cwd)
        for word in self.argv:
            for candidate in {word, word.partition("=")[2]} - {""}:
                path = os.path.abspath(candidate)
                if os.path.isdir(path):
                    dirs |= _both(path)
                elif os.path.isfile(path):
                    dirs |= _both(os.path.dirname(path))
        return dirs

    def _watched(self) -> tuple[str, ...]:
        return tuple(sorted(d for d in self._dirs | self._arg_dirs if not d.startswith(self.out_dir)))


def _file_entry(path: str) -> list[Any] | None:
    """[size, mtime_ns, sha256 or None (over the limit)]; None for what is no regular file."""
    try:
        info = _real_stat(path)
        if not stat.S_ISREG(info.st_mode):
            return None
        if info.st_size > HASH_LIMIT_BYTES:
            return [info.st_size, info.st_mtime_ns, None]
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        return [info.st_size, info.st_mtime_ns, digest.hexdigest()]
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


# -- the wrappers: what no audit event says --------------------------------------------
def _stat_noting_misses(path: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return _real_stat(path, *args, **kwargs)
    except (FileNotFoundError, NotADirectoryError):
        manifest = _current
        if manifest is not None and not isinstance(path, int) and kwargs.get("dir_fd") is None:
            try:
                manifest._looked(path)
            except Exception:
                pass
        raise


def _readlink_noting(path: Any, *args: Any, **kwargs: Any) -> Any:
    target = _real_readlink(path, *args, **kwargs)
    manifest = _current
    if manifest is not None and not isinstance(path, int) and kwargs.get("dir_fd") is None:
        try:
            manifest._link_read(path)
        except Exception:
            pass
    return target


def _exit_closing(code: int) -> None:
    """os._exit skips atexit: the manifest is closed first (a forked worker ends this way)."""
    manifest = _current
    if manifest is not None and manifest.pid == os.getpid():
        try:
            manifest.write(closed=True)
        except BaseException:
            pass
    _real_exit(code)


def _before_fork() -> None:
    if _current is not None:
        _current._lock.acquire()  # no write is half-done in the child


def _after_fork_in_parent() -> None:
    if _current is not None:
        _current._lock.release()


def _after_fork_in_child() -> None:
    if _current is not None:
        try:
            _current.forked()
        except Exception:
            pass


_wrapped = False


def _install_wrappers() -> None:
    """os.stat (misses), os.readlink and os._exit, and the fork hooks; once a process."""
    global _wrapped
    if _wrapped:
        return
    _wrapped = True
    for real, wrapper in ((_real_stat, _stat_noting_misses), (_real_readlink, _readlink_noting)):
        # What a function supports is asked of the os module by identity (shutil.rmtree
        # keeps its safe, descriptor-based walk only while os.stat is in these sets).
        for supports in (os.supports_dir_fd, os.supports_fd, os.supports_follow_symlinks,
                         os.supports_effective_ids):
            if real in supports:
                supports.add(wrapper)
    os.stat = _stat_noting_misses
    os.readlink = _readlink_noting
    os._exit = _exit_closing
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_after_fork_in_child)


def attach(session: Any) -> Manifest | None:
    """Record what this process reads: written at start, at each step end and when it ends."""
    plan = session.plan
    if plan is None or not plan.out_dir:
        return None
    manifest = Manifest(out_dir=plan.out_dir, rank=session.rank)

    def write(closed: bool = False, step: int | None = None) -> None:
        try:
            manifest.write(closed=closed, step=step)
        except Exception as e:  # a manifest must never stop the job; the run is not reused
            session.note_error(f"manifest not written: {e!r}")

    try:
        manifest.start()
    except Exception as e:
        session.note_error(f"manifest not written: {e!r}")
    session.add_step_end_listener(lambda step: write(step=step))
    session.add_exit_listener(lambda: write(closed=True))
    _write_on_sigterm(manifest, lambda: write(closed=True))
    return manifest


def _write_on_sigterm(manifest: Manifest, write: Any) -> None:
    """A job stopped early (SIGTERM, at its first difference) runs no exit handler: close
    the manifest then, and die of the signal as before. Only where the job left SIGTERM
    at its default; a handler the job sets later replaces this one."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def on_term(signum: int, _frame: Any) -> None:
        if manifest.writing_here():  # the signal came inside a write (at exit, at a step end):
            manifest.signal_after_write = signum  # it ends, closes the file, then dies
            return
        try:
            write()
        finally:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, on_term)
