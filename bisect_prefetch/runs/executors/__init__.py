"""Executors: where a run's job executes (local slots, one Slurm batch job per run, or job
steps of the Slurm allocation the tool runs in)."""

from __future__ import annotations

from bisect_prefetch.experiment import ExecutorConfig, Experiment
from bisect_prefetch.runs.executors.allocation import allocation_id
from bisect_prefetch.runs.executors.base import Executor, Job
from bisect_prefetch.runs.executors.local import LocalExecutor
from bisect_prefetch.runs.executors.slurm import SlurmExecutor, SlurmOptions
from bisect_prefetch.runs.executors.slurm_steps import SlurmStepExecutor


def with_executor(experiment: Experiment, *, kind: str | None = None,
                  slots: int | None = None) -> Experiment:
    """The experiment with --executor / --slots from the command line applied."""
    config = experiment.executor
    if kind is not None and kind != config.kind:
        given = {"slots": config.slots} if "slots" in config.model_fields_set else {}
        config = ExecutorConfig(kind=kind, **given)
    if slots is not None:
        config = config.model_copy(update={"slots": slots})
    return experiment.model_copy(update={"executor": config})


def make_executor(config: ExecutorConfig) -> Executor:
    """The executor of these keys. slurm inside an allocation (SLURM_JOB_ID set): each run a
    job step of it, as many at once as its nodes hold runs (`slots` given: at most that)."""
    if config.kind == "local":
        return LocalExecutor(slots=config.slots, devices_per_slot=config.devices_per_slot)
    options = SlurmOptions(
        slots=config.slots, partition=config.partition, nodes=config.nodes,
        ntasks_per_node=config.ntasks_per_node, gpus_per_node=config.gpus_per_node,
        gres=config.gres, time=config.time, account=config.account, qos=config.qos,
        sbatch_args=tuple(config.sbatch_args), expand_env=tuple(config.expand_env),
    )
    job_id = allocation_id()
    if job_id is not None:
        given = config.slots if "slots" in config.model_fields_set else None
        return SlurmStepExecutor(options, job_id=job_id, slots=given)
    return SlurmExecutor(options)


__all__ = ["Executor", "Job", "LocalExecutor", "SlurmExecutor", "SlurmStepExecutor",
           "make_executor", "with_executor"]
