"""The argument list of a run: a built-in reference workload, or the user's command.

Templates are argument lists; `{run_dir}`, `{config}`, `{port}`,
`{rank_log_dir}`, `{steps}` and `{seed}` are replaced inside an argument, and a value never becomes
more than that one argument (no shell, no splitting). Other braces are left
alone, so JSON in an argument survives.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.experiment import Experiment

PLACEHOLDERS = ("run_dir", "config", "port", "rank_log_dir", "steps", "seed")
_PLACEHOLDER = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")

# Workers that do not find each other within this many seconds give up (msrun).
MSRUN_CLUSTER_TIMEOUT_S = 60


def _fault_args(experiment: Experiment) -> list[str]:
    fault = experiment.workload.fault
    if fault is None:
        return []
    args = ["--fault-edge", fault.edge, "--fault-hazard", repr(fault.hazard)]
    if experiment.workload.builtin == "mindspore":
        args += ["--fault-mode", fault.mode]
    return args


def _workload_args(experiment: Experiment, steps: int) -> list[str]:
    w = experiment.workload
    return ["--layers", str(w.layers), "--steps", str(steps), "--seed", str(experiment.seed),
            *_fault_args(experiment)]


def argv_template(experiment: Experiment, *, steps: int) -> list[str]:
    """The run's argv with placeholders still in it."""
    if experiment.command is not None:
        return list(experiment.command)
    w = experiment.workload
    if w.builtin == "fsdp2":
        return [
            sys.executable, "-m", "torch.distributed.run",
            f"--nproc_per_node={w.world_size}", "--master_addr=127.0.0.1",
            "--master_port={port}",
            "-m", "bisect_prefetch.workloads.fsdp2", *_workload_args(experiment, steps),
        ]
    if w.builtin == "mindspore":
        module = ["-m", "bisect_prefetch.workloads.mindspore", *_workload_args(experiment, steps)]
        if w.world_size == 1:
            return [sys.executable, *module]  # one rank needs no launcher
        # msrun runs its task as `python TASK ARGS` unless TASK is itself
        # `python`: then it runs `python ARGS`, which lets us pass `-m MODULE`.
        return [
            sys.executable, "-m", "mindspore.parallel.cluster.run",
            f"--worker_num={w.world_size}", f"--local_worker_num={w.world_size}",
            "--master_addr=127.0.0.1", "--master_port={port}",
            "--log_dir={rank_log_dir}", "--join=True",
            f"--cluster_time_out={MSRUN_CLUSTER_TIMEOUT_S}",
            "python", *module,
        ]
    raise BisectPrefetchError(f"unknown built-in workload {w.builtin!r}")


def workload_env(experiment: Experiment) -> dict[str, str]:
    """Environment a built-in workload needs on top of the job's."""
    if experiment.workload is not None and experiment.workload.builtin == "mindspore":
        # msrun starts `python` from PATH: make it this interpreter.
        here = str(Path(sys.executable).parent)
        return {"PATH": os.pathsep.join([here, os.environ.get("PATH", "")])}
    return {}


def render_argv(template: list[str], values: Mapping[str, str | int | Path]) -> list[str]:
    """Replace the known placeholders; each stays inside the argument it was in."""
    def replace(match: re.Match) -> str:
        name = match.group(1)
        if name not in values:
            raise BisectPrefetchError(f"the command uses {{{name}}} but this run has no {name}")
        return str(values[name])

    return [_PLACEHOLDER.sub(replace, arg) for arg in template]
