"""MindFormers reference workload: real MindFormers 1.9 on CPU, the orchestrator's side.

``workload: {builtin: mindformers, layers: N, world_size: 1|2}`` trains a tiny
legacy LlamaForCausalLM with MindFormers' own trainer. MindFormers 1.9 needs
MindSpore 2.9 (the project's venv has 2.10), so the job runs in its own venv,
``.venv-mindformers`` at the repository root (``make mindformers-venv``), or
where BISECT_PREFETCH_MINDFORMERS_VENV points.

Each run gets a real MindFormers YAML in its run dir: the packaged
``mindformers_job/llama_tiny.yaml`` (or the experiment's ``config``) with the
experiment's seed, steps, layers and world size written in, then its
``overrides``. An override key the YAML does not have is an input error that
names the nearest keys it does have. One rank runs the entry point directly;
two run under msrun (data parallel).

MindFormers 1.9 has no hyper-parallel, so there is no FSDP prefetch to graph or
mask on this path: ``aa``, ``matrix`` and ``compare`` are real here, ``graph``
says there is nothing to find.

This module only builds the command line and the YAML; it never imports
MindSpore or MindFormers (they live in the other venv).
"""

from __future__ import annotations

import copy
import difflib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from bisect_prefetch.errors import BisectPrefetchError

JOB_DIR = Path(__file__).resolve().parent / "mindformers_job"
TRAIN_SCRIPT = JOB_DIR / "train.py"
DEFAULT_CONFIG = JOB_DIR / "llama_tiny.yaml"

VENV_ENV = "BISECT_PREFETCH_MINDFORMERS_VENV"
DEFAULT_VENV = Path(__file__).resolve().parents[2] / ".venv-mindformers"
VENV_STAMP = ".installed"  # the Makefile touches it once the install finished

NO_PREFETCH_GRAPH = (
    "the mindformers workload has no prefetch graph to find: MindFormers 1.9 has no "
    "hyper-parallel (no FSDP prefetch); aa, matrix and compare work on it"
)

MSRUN_CLUSTER_TIMEOUT_S = 60  # workers that do not find each other within this give up


def venv_dir() -> Path:
    return Path(os.environ.get(VENV_ENV) or DEFAULT_VENV)


def venv_bin() -> Path:
    """The MindFormers venv's bin dir; an error naming the make target when it is missing."""
    venv = venv_dir()
    if not (venv / VENV_STAMP).is_file():
        raise BisectPrefetchError(
            f"the mindformers workload needs its own venv at {venv} (MindFormers 1.9, MindSpore 2.9): "
            f"run `make mindformers-venv`, or point {VENV_ENV} at one"
        )
    return venv / "bin"


def argv_template(*, world_size: int) -> list[str]:
    """One rank: the entry point itself; more: msrun, which starts `python` from PATH."""
    train = [str(TRAIN_SCRIPT), "--config", "{config}"]
    if world_size == 1:
        return [str(venv_bin() / "python"), *train]
    return [
        str(venv_bin() / "msrun"),
        f"--worker_num={world_size}", f"--local_worker_num={world_size}",
        "--master_addr=127.0.0.1", "--master_port={port}",
        "--log_dir={rank_log_dir}", "--join=True",
        f"--cluster_time_out={MSRUN_CLUSTER_TIMEOUT_S}",
        *train,
    ]


def job_env() -> dict[str, str]:
    """The MindFormers venv first on PATH: msrun runs its workers with `python` from PATH."""
    return {"PATH": os.pathsep.join([str(venv_bin()), os.environ.get("PATH", "")])}


def builtin_overrides(*, seed: int, steps: int, layers: int, world_size: int) -> dict[str, Any]:
    """The experiment's own settings as MindFormers YAML keys (applied before its overrides)."""
    return {
        "seed": seed,
        "runner_config.stop_step": steps,  # the entry point's data set is exactly this long
        "model.model_config.num_layers": layers,
        "use_parallel": world_size > 1,
        "parallel_config.data_parallel": world_size,
    }


# -- overrides on a MindFormers YAML ----------------------------------------------------
def dotted_keys(data: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    """Every key path of a nested mapping, dotted: `model.model_config.num_layers`."""
    for key, value in data.items():
        path = f"{prefix}{key}"
        yield path
        if isinstance(value, Mapping):
            yield from dotted_keys(value, f"{path}.")


def apply_known_overrides(data: dict[str, Any], overrides: Mapping[str, Any], *,
                          source: str) -> dict[str, Any]:
    """A copy of data with dotted keys set; each key must already exist in the YAML.

    A MindFormers YAML takes only keys its code reads: a misspelt key would be
    ignored silently and the run would not be what the user asked for.
    """
    out = copy.deepcopy(data)
    for dotted, value in overrides.items():
        node: Any = out
        parts = str(dotted).split(".")
        for part in parts[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or parts[-1] not in node:
            nearest = difflib.get_close_matches(str(dotted), list(dotted_keys(data)), n=3, cutoff=0.5)
            hint = f"nearest: {', '.join(nearest)}" if nearest else "no similar key"
            raise BisectPrefetchError(
                f"{source}: override key {dotted!r} is not in this MindFormers YAML ({hint})"
            )
        node[parts[-1]] = copy.deepcopy(value)
    return out
