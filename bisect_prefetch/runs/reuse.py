"""Whether a finished run may be reused: everything it read is still the same.

The job records what it read (adapters/manifest.py, ``manifest.*.json`` in the run dir);
``collect`` merges its processes' manifests into the run's journal record, with the
numerics variables the orchestrator started it with. ``ReuseCheck.why_not`` then says,
for a journaled run, the first thing that changed since it finished, or None:

- a file in its manifest hashes differently now (only files whose size or mtime changed
  are hashed again; files the job judged by size and mtime, over its hash limit, by those),
  or cannot be read;
- a distribution in the directories the job loaded them from has another version, is
  new or is gone;
- a numerics variable the job would start with (vocab.ENV_VARIABLES) has another value;
- it has no manifest (journaled before manifests, or its job never ran the adapter), or
  its run dir was deleted;
- the run it was compared with is not reused.

The experiment's fingerprint and the command's own files are part of the run key
(runs/execute.Runner.key), so a run whose key matches already ran the same experiment.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bisect_prefetch.adapters.manifest import dists_in
from bisect_prefetch.runs.envprint import read_env
from bisect_prefetch.vocab import ENV_VARIABLES, MANIFEST_FILES

MANIFEST_FIELD = "manifest"  # the journal record's field
_CONFLICT = "differs between ranks"


def collect(run_dir: Path) -> dict[str, Any] | None:
    """The run's manifest for its journal record: its processes' manifests merged, and the
    numerics variables it was started with (env.json). None when no process wrote one."""
    parts = []
    for path in sorted(Path(run_dir).glob(MANIFEST_FILES)):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("files"), dict):
            parts.append(data)
    if not parts:
        return None
    files: dict[str, Any] = {}
    dists: dict[str, str] = {}
    site_dirs: list[str] = []
    for part in parts:
        for path, entry in part["files"].items():
            # Two processes that read different bytes of one file: never the same again.
            files[path] = entry if files.get(path, entry) == entry else [-1, -1, _CONFLICT]
        for name, version in (part.get("dists") or {}).items():
            dists[name] = version if dists.get(name, version) == version else _CONFLICT
        site_dirs += [d for d in part.get("site_dirs") or [] if d not in site_dirs]
    launched = (read_env(run_dir) or {}).get("orchestrator", {}).get("variables")
    return {
        "files": files,
        "dists": dists,
        "site_dirs": site_dirs,
        "env": launched if isinstance(launched, dict) else parts[0].get("env", {}),
        "job_env": parts[0].get("env", {}),
        "processes": len(parts),
        "by_stat": sorted({p for part in parts for p in part.get("by_stat") or []}),
        "opened_limit": parts[0].get("opened_limit"),
        "opened_truncated": any(part.get("opened_truncated") for part in parts),
    }


def summary(manifest: Mapping[str, Any] | None) -> str:
    """One line for reports: what the run's manifest holds."""
    if not manifest:
        return "no manifest (not reusable)"
    files = manifest.get("files") or {}
    text = (f"{len(files)} file(s) read, {len(manifest.get('dists') or {})} distribution(s), "
            f"{sum(v is not None for v in (manifest.get('env') or {}).values())} numerics "
            "variable(s) set")
    if manifest.get("by_stat"):
        text += f"; {len(manifest['by_stat'])} large file(s) by size and mtime"
    if manifest.get("opened_truncated"):
        text += f"; opened files bounded at {manifest.get('opened_limit')}"
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


class ReuseCheck:
    """Decides reuse for one command: file checks and directory listings are cached."""

    def __init__(self, env: Mapping[str, str], *, records: list[dict[str, Any]],
                 runs_path: Path | None = None) -> None:
        self.env = {name: env.get(name) for name in ENV_VARIABLES}
        self.runs_path = runs_path  # where run dirs are: a deleted one is never reused
        self._by_run = {r.get("run_id"): r for r in records}
        self._files: dict[tuple[str, int, int], str | None] = {}  # -> reason or None
        self._dists: dict[tuple[str, ...], dict[str, str]] = {}
        self._decided: dict[str, str | None] = {}

    def why_not(self, record: Mapping[str, Any]) -> str | None:
        """The first reason this run cannot be reused now, or None."""
        run_id = str(record.get("run_id"))
        if run_id not in self._decided:
            self._decided[run_id] = None  # a reference loop must end
            self._decided[run_id] = self._why_not(record)
        return self._decided[run_id]

    def _why_not(self, record: Mapping[str, Any]) -> str | None:
        if self.runs_path is not None and not (self.runs_path / str(record.get("run_id"))).is_dir():
            return f"the run dir of {_when(record)} was deleted"  # its metrics went with it
        manifest = record.get(MANIFEST_FIELD)
        if not isinstance(manifest, dict):
            return (f"{_when(record)} without a manifest of what it read (an older "
                    "journal, or its job never started the adapter)")
        for path, entry in sorted((manifest.get("files") or {}).items()):
            if (why := self._file_changed(path, entry)) is not None:
                return f"{_shown(path)} {why} since {_when(record)}"
        if (why := self._dists_changed(manifest)) is not None:
            return why
        for name in ENV_VARIABLES:
            then, now = (manifest.get("env") or {}).get(name), self.env.get(name)
            if then != now:
                return f"{name} {'unset' if then is None else then} -> {'unset' if now is None else now}"
        reference = record.get("reference")
        if reference is not None and reference in self._by_run:
            if self.why_not(self._by_run[reference]) is not None:
                return f"the run it was compared with, {reference}, is not reused"
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
            return "was read with different contents by different ranks"
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

    def _dists_changed(self, manifest: Mapping[str, Any]) -> str | None:
        then = manifest.get("dists") or {}
        where = tuple(manifest.get("site_dirs") or ())
        if where not in self._dists:
            self._dists[where] = dists_in(list(where))
        now = self._dists[where]
        for name in sorted(set(then) | set(now)):
            if then.get(name) != now.get(name):
                return f"{name} {then.get(name, 'not installed')} -> {now.get(name, 'not installed')}"
        return None
