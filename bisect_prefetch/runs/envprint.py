"""Environment fingerprint of a run (env.json), and drift between runs of a group.

Runs in one A/A group must differ in nothing but the chance under test: on CPU,
torch's results change with the thread count alone. A fingerprint that differs
inside a group is reported as environment drift, apart from prefetch drift.

env.json holds two prints kept apart: ``job``, the job's own environment as its ranks
saw it (adapters/environment.py writes env.rank{R}.json inside the job; merged here:
fields every rank agrees on once, the others under ``by_rank``), and ``orchestrator``,
this program's interpreter and the variables it started the job with. Drift is the
job's: a change of the job's venv between runs is environment drift, a change of the
tool's venv is not. A run whose job wrote no print (it never finished a step, or an
older run) is compared by the orchestrator's.
"""

from __future__ import annotations

import json
import platform
import re
import socket
from collections.abc import Mapping
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

from bisect_prefetch.files import write_text_atomic
from bisect_prefetch.vocab import ENV_FILE, ENV_LIBRARIES, ENV_VARIABLES, env_rank_file

_RANK_FILE = re.compile(r"env\.rank(\d+)\.json")


@cache
def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def fingerprint(env: Mapping[str, str], *, world_size: int) -> dict[str, Any]:
    """The orchestrator's print: its interpreter and libraries, and the variables it
    starts the job with (env). Not the job's: see job_print."""
    return {
        "python": platform.python_version(),
        "libraries": {name: _version(name) for name in ENV_LIBRARIES},
        "variables": {name: env.get(name) for name in ENV_VARIABLES},
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "world_size": world_size,
    }


def job_print(run_dir: Path) -> dict[str, Any] | None:
    """The job's ranks' prints merged: common fields once, differing ones under by_rank."""
    ranks: dict[int, dict[str, Any]] = {}
    for path in Path(run_dir).glob(env_rank_file("*")):
        match = _RANK_FILE.fullmatch(path.name)
        if match is None:
            continue
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            data.pop("rank", None)
            ranks[int(match.group(1))] = data
    if not ranks:
        return None
    fields = sorted({f for p in ranks.values() for f in p})
    merged: dict[str, Any] = {"ranks": len(ranks)}
    by_rank: dict[str, dict[str, Any]] = {}
    for field in fields:
        values = {rank: p.get(field) for rank, p in sorted(ranks.items())}
        if len({json.dumps(v, sort_keys=True) for v in values.values()}) == 1:
            merged[field] = next(iter(values.values()))
        else:
            by_rank[field] = {str(rank): value for rank, value in values.items()}
    if by_rank:
        merged["by_rank"] = by_rank
    return merged


def write_env(run_dir: Path, orchestrator: dict[str, Any], job: dict[str, Any] | None = None) -> None:
    print_ = {"orchestrator": orchestrator, **({"job": job} if job is not None else {})}
    write_text_atomic(Path(run_dir) / ENV_FILE, json.dumps(print_, indent=1, sort_keys=True) + "\n")


def add_job_print(run_dir: Path) -> dict[str, Any] | None:
    """Merge the job's ranks' prints into env.json (after the job ended); the job's print."""
    job = job_print(run_dir)
    current = read_env(run_dir)
    if job is None or current is None:
        return job
    write_env(run_dir, current.get("orchestrator", current), job)
    return job


def summary(job: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What the journal keeps of a job's print: enough to say which environment ran."""
    if not job:
        return None
    return {
        "python": job.get("python"),
        "executable": job.get("executable"),
        "libraries": {k: v for k, v in (job.get("libraries") or {}).items() if v is not None},
        "installed": (job.get("installed") or {}).get("hash"),
        "world_size": job.get("world_size"),
        "ranks": job.get("ranks"),
    }


def read_env(run_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((Path(run_dir) / ENV_FILE).read_text())
    except (OSError, ValueError):
        return None


def _flatten(print_: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in print_.items():
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def drift(prints: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line per fingerprint field that differs between runs (keyed by run id).

    Empty when every run saw the same environment. The job's prints are compared when
    every run has one; else every run's orchestrator print.
    """
    every_job = all("job" in p for p in prints.values())
    parts = {run: (p["job"] if every_job else p.get("orchestrator", p)) for run, p in prints.items()}
    flat = {run: _flatten(p) for run, p in parts.items()}
    fields = sorted({f for p in flat.values() for f in p})
    lines = []
    for field in fields:
        values = {run: p.get(field) for run, p in flat.items()}
        if len({json.dumps(v) for v in values.values()}) > 1:
            shown = ", ".join(f"{run}={value!r}" for run, value in values.items())
            lines.append(f"{field}: {shown}")
    return lines
