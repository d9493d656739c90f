"""Environment fingerprint of a run (env.json), and drift between runs of a group.

Runs in one A/A group must differ in nothing but the chance under test: on CPU,
torch's results change with the thread count alone. A fingerprint that differs
inside a group is reported as environment drift, apart from prefetch drift.
"""

from __future__ import annotations

import json
import platform
import socket
from collections.abc import Mapping
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

from bisect_prefetch.files import write_text_atomic

ENV_FILE = "env.json"

LIBRARIES = ("torch", "mindspore", "numpy", "hyper-parallel", "mindformers", "torchtitan")

# Thread counts and determinism switches that change results or their order.
VARIABLES = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "PYTHONHASHSEED",
    "CUBLAS_WORKSPACE_CONFIG",
    "CUDA_LAUNCH_BLOCKING",
    "NCCL_ALGO",
    "NCCL_PROTO",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "HCCL_DETERMINISTIC",
    "ASCEND_LAUNCH_BLOCKING",
    "MS_DEV_RUNTIME_CONF",
    "MS_ALLOC_CONF",
    "TE_PARALLEL_COMPILER",
)


@cache
def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def fingerprint(env: Mapping[str, str], *, world_size: int) -> dict[str, Any]:
    """What a run's numbers may depend on besides the seed and the mask.

    Library versions are those of the orchestrator's interpreter (the built-in
    workloads run in it); env is the environment the job is started with.
    """
    return {
        "python": platform.python_version(),
        "libraries": {name: _version(name) for name in LIBRARIES},
        "variables": {name: env.get(name) for name in VARIABLES},
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "world_size": world_size,
    }


def write_env(run_dir: Path, print_: dict[str, Any]) -> None:
    write_text_atomic(Path(run_dir) / ENV_FILE, json.dumps(print_, indent=1, sort_keys=True) + "\n")


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

    Empty when every run saw the same environment.
    """
    flat = {run: _flatten(p) for run, p in prints.items()}
    fields = sorted({f for p in flat.values() for f in p})
    lines = []
    for field in fields:
        values = {run: p.get(field) for run, p in flat.items()}
        if len({json.dumps(v) for v in values.values()}) > 1:
            shown = ", ".join(f"{run}={value!r}" for run, value in values.items())
            lines.append(f"{field}: {shown}")
    return lines
