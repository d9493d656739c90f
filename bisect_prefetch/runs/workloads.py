"""The argument list of a run: a built-in reference workload, or the user's command.

Templates are argument lists; `{run_dir}`, `{config}`, `{port}`,
`{rank_log_dir}`, `{steps}` and `{seed}` are replaced inside an argument, and a value never becomes
more than that one argument (no shell, no splitting); `{{steps}}` is a literal `{steps}`
(vocab.fill_placeholders). Other braces are left alone, so JSON in an argument survives.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.experiment import Experiment, apply_overrides
from bisect_prefetch.vocab import fill_placeholders
from bisect_prefetch.workloads import mindformers

# Workers that do not find each other within this many seconds give up (msrun).
MSRUN_CLUSTER_TIMEOUT_S = 60


def _fault_args(experiment: Experiment) -> list[str]:
    fault = experiment.workload.fault
    if fault is None:
        return []
    args = ["--fault-edge", fault.edge]
    if fault.hazard is not None:
        args += ["--fault-hazard", repr(fault.hazard)]
    if experiment.workload.builtin == "mindspore" or fault.mode == "race":
        args += ["--fault-mode", fault.mode]
    return args


def _workload_args(experiment: Experiment, steps: int) -> list[str]:
    w = experiment.workload
    planted = []  # fsdp2's options to plant suspect edges for the audit
    if w.checkpoint:
        planted.append("--checkpoint")
    if w.backward_prefetch_depth != 1:
        planted += ["--backward-prefetch-depth", str(w.backward_prefetch_depth)]
    for edge in w.extra_edges:
        planted += ["--extra-edge", edge]
    if w.async_unshard:
        planted.append("--async-unshard")
    if "dim" in w.model_fields_set:
        planted += ["--dim", str(w.dim)]
    if "batch" in w.model_fields_set:
        planted += ["--batch", str(w.batch)]
    if w.compute_ms:
        planted += ["--compute-ms", repr(w.compute_ms)]
    if w.tp > 1:
        planted += ["--tp", str(w.tp)]
    return ["--layers", str(w.layers), "--steps", str(steps), "--seed", str(experiment.seed),
            *_fault_args(experiment), *planted]


def argv_template(experiment: Experiment, *, steps: int) -> list[str]:
    """The run's argv with placeholders still in it."""
    if experiment.command is not None:
        return list(experiment.command)
    w = experiment.workload
    if w.builtin == "fsdp2":
        # Its ranks start as torchrun would start them, without torchrun's agent (about 2 s a
        # run: docs/benchmarks.md); users' jobs keep their own launcher.
        return [
            sys.executable, "-m", "bisect_prefetch.workloads.local_ranks",
            f"--nproc={w.world_size}", "--master-addr=127.0.0.1", "--master-port={port}", "--",
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
    if w.builtin == "mindformers":
        return mindformers.argv_template(world_size=w.world_size)
    raise BisectPrefetchError(f"unknown built-in workload {w.builtin!r}")


def workload_env(experiment: Experiment) -> dict[str, str]:
    """Environment a built-in workload needs on top of the job's."""
    if experiment.workload is not None and experiment.workload.builtin == "mindspore":
        # msrun starts `python` from PATH: make it this interpreter.
        here = str(Path(sys.executable).parent)
        return {"PATH": os.pathsep.join([here, os.environ.get("PATH", "")])}
    if experiment.workload is not None and experiment.workload.builtin == "mindformers":
        return mindformers.job_env()
    return {}


def runs_in_tool_env(experiment: Experiment) -> bool:
    """Whether the job runs in this program's interpreter and imports the whole package
    (the fsdp2 and mindspore workloads); a user's command and the MindFormers workload run
    in their own environment and get the adapter alone (runs/job_path.py)."""
    return experiment.workload is not None and experiment.workload.builtin in ("fsdp2", "mindspore")


def has_prefetch_graph(experiment: Experiment) -> bool:
    """False for a built-in workload with no FSDP prefetch to find (mindformers: no hyper-parallel)."""
    return experiment.workload is None or experiment.workload.builtin != "mindformers"


def require_prefetch_graph(experiment: Experiment) -> None:
    """Refuse, before any run, a command that needs prefetch edges on a workload without any."""
    if not has_prefetch_graph(experiment):
        raise BisectPrefetchError(mindformers.NO_PREFETCH_GRAPH)


def is_mindformers_config(experiment: Experiment) -> bool:
    """Whether the run's config is a MindFormers YAML (its overrides must name existing keys)."""
    w = experiment.workload
    return (w is not None and w.builtin == "mindformers") or experiment.metrics.format == "mindformers"


def config_overrides(experiment: Experiment, *, steps: int, index: int = 0) -> dict[str, Any]:
    """What is written into run `index`'s config: a built-in's own settings, then the experiment's overrides."""
    w = experiment.workload
    if w is not None and w.builtin == "mindformers":
        own = mindformers.builtin_overrides(seed=experiment.seed + index * w.seed_step, steps=steps,
                                            layers=w.layers, world_size=w.world_size)
        return {**own, **experiment.overrides}
    return dict(experiment.overrides)


def render_config(experiment: Experiment, *, steps: int, index: int = 0) -> tuple[Path, str] | None:
    """The run's config file (its source path and text, overrides applied), if it has one."""
    source = experiment.config_path()
    if source is None:
        return None
    try:
        text = source.read_text()
    except OSError as exc:
        raise BisectPrefetchError(f"cannot read config {source}: {exc.strerror}") from None
    overrides = config_overrides(experiment, steps=steps, index=index)
    if not overrides:
        return source, text
    is_json = source.suffix.lower() == ".json"
    if not is_json and source.suffix.lower() not in (".yaml", ".yml"):
        raise BisectPrefetchError(f"overrides apply to YAML or JSON configs, not {source.name}")
    try:
        data = json.loads(text) if is_json else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise BisectPrefetchError(f"config {source} cannot be read: {exc}") from None
    if not isinstance(data, dict):
        raise BisectPrefetchError(f"config {source} is not a mapping: cannot apply overrides")
    if is_mindformers_config(experiment):
        data = mindformers.apply_known_overrides(data, overrides, source=str(source))
    else:
        data = apply_overrides(data, overrides)
    return source, json.dumps(data, indent=1) if is_json else yaml.safe_dump(data, sort_keys=False)


def render_argv(template: list[str], values: Mapping[str, str | int | Path]) -> list[str]:
    """Replace the known placeholders; each stays inside the argument it was in."""
    def replace(name: str) -> str:
        if name not in values:
            raise BisectPrefetchError(f"the command uses {{{name}}} but this run has no {name}")
        return str(values[name])

    return [fill_placeholders(arg, replace) for arg in template]
