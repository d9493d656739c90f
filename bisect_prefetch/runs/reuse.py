"""Whether a journaled run may be taken again: everything it read and was started with is
still the same.

The job's processes record what they read (adapters/manifest.py, ``manifest.*.jsonl`` in the
run dir); ``collect`` merges them into the run's journal record, with the numerics
variables the orchestrator started it with. Which runs a command may take at all is its
scope (runs/sessions.py: its own; with --resume its session's; with --reuse any). For those,
``ReuseCheck.why_not`` says the first thing that stands against taking it again, or None:

- it failed, errored or was truncated: such a run is never taken again (it runs again);
- its run dir was deleted, it has no manifest (journaled before manifests, or its job never
  ran the adapter), or its manifest is not complete: a process was killed before it closed
  its file, or opened more files than a manifest keeps (``OPENED_LIMIT``);
- a numerics variable, any other variable it was started with (a hash each; a short list of
  volatile ones aside, runs/launch_env.py), PYTHONPATH or the working directory differs;
- a file in its manifest hashes differently now (only files whose size or mtime changed are
  hashed again; files over the job's hash limit by size and mtime), or is gone; a symlink
  it went through leads elsewhere; a file or module it looked for and did not find is there;
  an installed module file it imported has another size or mtime;
- a distribution in the directories it loaded them from has another version, is new or gone;
- the run it was compared with is not taken again.

The experiment's fingerprint and the command's program are part of the run key
(runs/execute.Runner.key), so a run whose key matches already ran the same experiment.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from bisect_prefetch.adapters.manifest import CHANGED_IN_RUN, MANIFEST_VERSION, dists_in
from bisect_prefetch.runs.envprint import read_env
from bisect_prefetch.runs.launch_env import launch_differs, launch_print
from bisect_prefetch.vocab import ENV_VARIABLES, MANIFEST_FILES, STOPPED_EARLY, USABLE_OUTCOMES

MANIFEST_FIELD = "manifest"  # the journal record's field
LAUNCHED_FIELD = "launched"
_CONFLICT = "differs between processes"
# What no manifest sees, in one line: said wherever runs of earlier commands are taken.
UNSEEN = ("reuse cannot see: files reached only through an environment variable or a config "
          "value outside the job's directories (its modules', its path arguments', its working "
          "directory); files read by other processes or native code (cat, a shell, SQLite); a "
          "file added to a directory the job lists (a glob); an edit that keeps a file's size "
          "and mtime; what a rank killed at its run's first difference read in that step. "
          "Without --reuse every earlier run runs again")
CHECKED = ("checked unchanged: the experiment and its program, every file its processes imported "
           "or opened in the job's directories (by content), installed modules (by size and "
           "mtime) and packages, the symlinks they went through, the files they looked for and "
           "did not find, and every variable, PYTHONPATH and working directory they started with")


# -- the run's manifest: its processes' files merged -------------------------------------------
def _process(path: Path) -> dict[str, Any] | None:
    """One process's file: its lines merged in order (a last line torn by a kill dropped)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return None
    merged: dict[str, Any] = {"files": {}, "links": {}, "absent": set(), "installed": {},
                              "closed": False}
    for number, line in enumerate(lines, start=1):
        try:
            data = json.loads(line)
        except ValueError:
            if number == len(lines):
                break  # torn: the process was killed while writing
            return None
        if not isinstance(data, dict):
            return None
        for name in ("files", "links", "installed"):
            merged[name].update(data.get(name) or {})
        merged["absent"].update(data.get("absent") or [])
        merged.update({k: v for k, v in data.items()
                       if k not in ("files", "links", "installed", "absent")})
    return merged


def _merge(target: dict[str, Any], entries: Mapping[str, Any], conflict: Any) -> None:
    for key, value in entries.items():
        target[key] = value if target.get(key, value) == value else conflict


def gather(run_dir: Path) -> dict[str, Any] | None:
    """Every process's manifest of a run merged, whole (the absent and installed lists in
    full); None when no process wrote one."""
    parts = [p for p in (_process(path) for path in sorted(Path(run_dir).glob(MANIFEST_FILES)))
             if p is not None]
    if not parts:
        return None
    files: dict[str, Any] = {}
    links: dict[str, Any] = {}
    installed: dict[str, Any] = {}
    absent: set[str] = set()
    # Each process's path and what is installed on it: processes of one job may differ (a
    # launcher started with -m has the working directory first), and each is checked as it was.
    views: list[dict[str, Any]] = []
    unclosed: list[dict[str, Any]] = []  # processes killed before they closed their file
    incomplete = None
    for part in parts:
        # Two processes that read different bytes of one file: never the same again.
        _merge(files, part["files"], [-1, -1, _CONFLICT])
        _merge(links, part["links"], _CONFLICT)
        _merge(installed, part["installed"], [-1, -1])
        absent |= part["absent"]
        view = {"site_dirs": part.get("site_dirs") or [], "dists": part.get("dists") or {}}
        if view not in views:
            views.append(view)
        who = f"process {part.get('pid')} (rank {part.get('rank')})"
        if incomplete is None and part.get("v") != MANIFEST_VERSION:
            incomplete = f"{who} wrote a manifest of another version ({part.get('v')})"
        elif not part["closed"]:
            unclosed.append({"pid": part.get("pid"), "rank": part.get("rank"),
                             "step": part.get("step")})
        if incomplete is None and part.get("opened_truncated"):
            incomplete = (f"{who} opened more files than a manifest keeps "
                          f"({part.get('opened_limit')}): its manifest is not complete")
    return {"v": MANIFEST_VERSION, "files": files, "links": links, "absent": sorted(absent),
            "installed": installed, "dist_views": views,
            "dists": {k: v for view in reversed(views) for k, v in view["dists"].items()},
            "site_dirs": list(dict.fromkeys(d for view in views for d in view["site_dirs"])),
            "job_env": parts[0].get("env", {}), "processes": len(parts),
            "by_stat": sorted({p for p, e in files.items() if isinstance(e, list) and len(e) == 3
                               and e[2] is None}),
            "opened_limit": parts[0].get("opened_limit"),
            "opened_truncated": any(p.get("opened_truncated") for p in parts),
            "incomplete": incomplete, "unclosed": unclosed}


def _digest(value: Any) -> dict[str, Any]:
    text = json.dumps(value, sort_keys=True)
    return {"count": len(value), "sha256": hashlib.sha256(text.encode()).hexdigest()}


def collect(run_dir: Path) -> dict[str, Any] | None:
    """The run's manifest for its journal record: its processes' manifests merged (the long
    lists, absent paths and installed files, by count and digest: the check reads them from
    the run dir), and the numerics variables it was started with (env.json)."""
    whole = gather(run_dir)
    if whole is None:
        return None
    launched = (read_env(run_dir) or {}).get("orchestrator", {}).get("variables")
    return {**whole, "absent": _digest(whole["absent"]), "installed": _digest(whole["installed"]),
            "env": launched if isinstance(launched, dict) else whole["job_env"]}


def summary(manifest: Mapping[str, Any] | None) -> str:
    """One line for reports: what the run's manifest holds."""
    if not manifest:
        return "no manifest (not reusable)"
    files = manifest.get("files") or {}
    text = (f"{len(files)} file(s) read, {len(manifest.get('dists') or {})} distribution(s), "
            f"{sum(v is not None for v in (manifest.get('env') or {}).values())} numerics "
            "variable(s) set")
    for name, words in (("installed", "installed module file(s)"),
                        ("absent", "path(s) looked for and absent")):
        count = (manifest.get(name) or {}).get("count") if isinstance(manifest.get(name), dict) else None
        if count:
            text += f", {count} {words}"
    if manifest.get("links"):
        text += f", {len(manifest['links'])} symlink(s)"
    if manifest.get("by_stat"):
        text += f"; {len(manifest['by_stat'])} large file(s) by size and mtime"
    if manifest.get("incomplete") or manifest.get("v") != MANIFEST_VERSION:
        text += "; not complete (not reusable)"
    return text


def _shown(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith(os.pardir) else rel


def _when(record: Mapping[str, Any]) -> str:
    at = record.get("finished_at")
    stamp = time.strftime(" at %H:%M", time.localtime(at)) if isinstance(at, (int, float)) else ""
    return f"run {record.get('run_id')} finished{stamp}"


Admit = Callable[[Mapping[str, Any]], "str | None"]


class ReuseCheck:
    """Decides reuse for one command: file checks and directory listings are cached.

    env and cwd: what a run would be started with now (runs/launcher.user_env, and the
    working directory; None for the run dir). admit: whether the command may take a record
    at all (runs/sessions.Scope.admits), asked first, the run it was compared with too."""

    def __init__(self, env: Mapping[str, str], *, records: list[dict[str, Any]],
                 runs_path: Path | None = None, cwd: str | Path | None = None,
                 admit: Admit | None = None) -> None:
        self.env = {name: env.get(name) for name in ENV_VARIABLES}
        self.launched = launch_print(env, cwd=cwd)
        self.runs_path = runs_path  # where run dirs are: a deleted one is never reused
        self.admit = admit
        self._by_run = {r.get("run_id"): r for r in records}
        self._files: dict[tuple[str, int, int], str | None] = {}  # -> reason or None
        self._dists: dict[tuple[str, ...], dict[str, str]] = {}
        self._lists: dict[str, str | None] = {}  # run id -> reason from its absent/installed lists
        self._decided: dict[str, str | None] = {}

    def why_not(self, record: Mapping[str, Any]) -> str | None:
        """The first reason this run cannot be taken again now, or None."""
        run_id = str(record.get("run_id"))
        if run_id not in self._decided:
            self._decided[run_id] = None  # a reference loop must end
            self._decided[run_id] = self._why_not(record)
        return self._decided[run_id]

    def _why_not(self, record: Mapping[str, Any]) -> str | None:
        if self.admit is not None and (why := self.admit(record)) is not None:
            return why
        if record.get("outcome") not in USABLE_OUTCOMES:
            return (f"{_when(record)} ended {record.get('outcome')} ({record.get('reason')}): a "
                    "failed, errored or truncated run is never taken again")
        run_dir = None if self.runs_path is None else self.runs_path / str(record.get("run_id"))
        if run_dir is not None and not run_dir.is_dir():
            return f"the run dir of {_when(record)} was deleted"  # its metrics went with it
        manifest = record.get(MANIFEST_FIELD)
        if not isinstance(manifest, dict):
            return (f"{_when(record)} without a manifest of what it read (an older "
                    "journal, or its job never started the adapter)")
        if manifest.get("v") != MANIFEST_VERSION:
            return f"{_when(record)} has a manifest of an older kind (no symlinks, no absent files)"
        if manifest.get("incomplete") or manifest.get("opened_truncated"):
            return f"{_when(record)}: {manifest.get('incomplete') or 'its manifest is not complete'}"
        if (why := _killed(record, manifest.get("unclosed") or [])) is not None:
            return f"{_when(record)}: {why}"
        if (why := self._env_changed(record, manifest)) is not None:
            return why
        for path, entry in sorted((manifest.get("files") or {}).items()):
            if (why := self._file_changed(path, entry)) is not None:
                return f"{_shown(path)} {why} since {_when(record)}"
        for link, then in sorted((manifest.get("links") or {}).items()):
            if (why := _link_moved(link, then)) is not None:
                return f"{_shown(link)} {why} since {_when(record)}"
        if run_dir is not None and (why := self._lists_changed(run_dir, manifest)) is not None:
            return f"{why} since {_when(record)}"
        if (why := self._dists_changed(manifest)) is not None:
            return why
        reference = record.get("reference")
        if reference is not None and reference in self._by_run:
            if self.why_not(self._by_run[reference]) is not None:
                return f"the run it was compared with, {reference}, is not taken again"
        return None

    def _env_changed(self, record: Mapping[str, Any], manifest: Mapping[str, Any]) -> str | None:
        for name in ENV_VARIABLES:
            then, now = (manifest.get("env") or {}).get(name), self.env.get(name)
            if then != now:
                return f"{name} {'unset' if then is None else then} -> {'unset' if now is None else now}"
        launched = record.get(LAUNCHED_FIELD)
        if not isinstance(launched, dict):
            return f"{_when(record)} without a record of the environment it was started with"
        if (why := launch_differs(launched, self.launched)) is not None:
            return f"{why} since {_when(record)}"
        return None

    def _file_changed(self, path: str, entry: Any) -> str | None:
        try:
            size, mtime_ns, digest = entry
        except (TypeError, ValueError):
            return "has a bad manifest entry"
        cached = (path, size, mtime_ns)
        if cached in self._files:
            return self._files[cached]
        if digest == _CONFLICT:
            return "was read with different contents by different processes"
        if digest == CHANGED_IN_RUN:
            return "was written by the job itself after it read it"
        why: str | None = None
        try:
            info = os.stat(path)
            if (info.st_size, info.st_mtime_ns) != (size, mtime_ns):
                if digest is None or info.st_size != size:
                    why = "changed"  # judged by size and mtime (over the job's hash limit)
                else:
                    with open(path, "rb") as f:
                        if hashlib.sha256(f.read()).hexdigest() != digest:
                            why = "changed"
        except FileNotFoundError:
            why = "was deleted"
        except OSError as exc:
            why = f"cannot be read ({exc.strerror or exc})"
        self._files[cached] = why
        return why

    def _lists_changed(self, run_dir: Path, manifest: Mapping[str, Any]) -> str | None:
        """The absent paths and installed module files, read from the run dir's manifests
        (the journal keeps their digests)."""
        listed = [manifest.get("absent") or {}, manifest.get("installed") or {}]
        if not any(part.get("count") for part in listed):
            return None  # nothing looked for, no installed module
        key = json.dumps(listed, sort_keys=True)
        if key in self._lists:
            return self._lists[key]
        why = None
        whole = gather(run_dir)
        if whole is None or (_digest(whole["absent"]), _digest(whole["installed"])) != (
                manifest.get("absent"), manifest.get("installed")):
            why = "its manifest files in its run dir changed"
        else:
            why = next((f"{_shown(p)} was created" for p in whole["absent"]
                        if os.path.lexists(p)), None)
            for path, entry in sorted(whole["installed"].items()):
                if why is not None:
                    break
                try:
                    info = os.stat(path)
                    if [info.st_size, info.st_mtime_ns] != list(entry):
                        why = f"{_shown(path)} (installed) changed"
                except OSError:
                    why = f"{_shown(path)} (installed) was deleted"
        self._lists[key] = why
        return why

    def _dists_changed(self, manifest: Mapping[str, Any]) -> str | None:
        """A distribution on any process's path with another version, new or gone."""
        for view in manifest.get("dist_views") or []:
            then = view.get("dists") or {}
            where = tuple(view.get("site_dirs") or ())
            if where not in self._dists:
                self._dists[where] = dists_in(list(where))
            now = self._dists[where]
            for name in sorted(set(then) | set(now)):
                if then.get(name) != now.get(name):
                    return (f"{name} {then.get(name, 'not installed')} -> "
                            f"{now.get(name, 'not installed')}")
        return None


def _killed(record: Mapping[str, Any], unclosed: list[dict[str, Any]]) -> str | None:
    """Why a process that did not close its manifest leaves the run's record incomplete, or
    None: a run the orchestrator stopped at its first differing step s (SIGTERM; a rank
    blocked in a collective then is killed) stands on what each such process recorded by the
    end of step s - 1, as long as it recorded that far."""
    stopped_at = record.get("first_diff_step")
    for process in unclosed:
        who = f"process {process.get('pid')} (rank {process.get('rank')})"
        recorded = process.get("step")
        if record.get("outcome") != STOPPED_EARLY or not isinstance(stopped_at, int):
            return f"{who} was killed before it ended its manifest"
        if stopped_at <= 1 and recorded is None:
            continue  # stopped in its first step (steps count from 1, runs/plan.py): its start is all
        if not isinstance(recorded, int) or recorded < stopped_at - 1:
            return (f"{who} was killed before it ended its manifest, which ends "
                    + (f"at step {recorded}" if isinstance(recorded, int) else "before any step")
                    + f", before step {stopped_at - 1}")
    return None


def _link_moved(link: str, then: str) -> str | None:
    """Where a path through a symlink (or a link the job resolved) leads now, against then."""
    if then == _CONFLICT:
        return "led to different places in different processes"
    if not os.path.lexists(link):
        return "is gone"
    now = os.path.realpath(link)
    return None if now == then else f"now leads to {_shown(now)} (was {_shown(then)})"
