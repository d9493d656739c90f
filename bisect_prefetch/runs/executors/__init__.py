"""Executors: where a run's job executes (local slots, or one Slurm job per run)."""

from __future__ import annotations

from bisect_prefetch.experiment import ExecutorConfig, Experiment
from bisect_prefetch.runs.executors.base import Executor, Job
from bisect_prefetch.runs.executors.local import LocalExecutor
from bisect_prefetch.runs.executors.slurm import SlurmExecutor, SlurmOptions


def with_executor(experiment: Experiment, *, kind: str | None = None,
                  slots: int | None = None) -> Experiment:
    """The experiment with --executor / --slots from the command line applied."""
    config = experiment.executor
    if kind is not None and kind != config.kind:
        config = ExecutorConfig(kind=kind, slots=config.slots)
    if slots is not None:
        config = config.model_copy(update={"slots": slots})
    return experiment.model_copy(update={"executor": config})


def make_executor(config: ExecutorConfig) -> Executor:
    if config.kind == "local":
        return LocalExecutor(slots=config.slots, devices_per_slot=config.devices_per_slot)
    return SlurmExecutor(SlurmOptions(
        slots=config.slots, partition=config.partition, nodes=config.nodes,
        ntasks_per_node=config.ntasks_per_node, gpus_per_node=config.gpus_per_node,
        gres=config.gres, time=config.time, account=config.account, qos=config.qos,
        sbatch_args=tuple(config.sbatch_args), expand_env=tuple(config.expand_env),
    ))


__all__ = ["Executor", "Job", "LocalExecutor", "SlurmExecutor", "make_executor", "with_executor"]
