"""The slurm executor inside an allocation, in the parts that need no Slurm: which executor a
shell holding an allocation gets and its slots, the srun line of a step, what fits an
allocation, and the one line a command says when runs cannot go on there. The steps
themselves run against a real Slurm in tests/e2e/test_slurm_allocation.py.
"""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from bisect_prefetch.commands.common import resume_hint_on_interrupt
from bisect_prefetch.errors import BisectPrefetchError, ResumableError
from bisect_prefetch.experiment import ExecutorConfig, Experiment
from bisect_prefetch.runs.executors import (
    SlurmExecutor,
    SlurmStepExecutor,
    make_executor,
    with_executor,
)
from bisect_prefetch.runs.executors.allocation import Allocation, check_fits

ALLOCATION = Allocation(job_id="81", state="RUNNING", nodes=("n1", "n2", "n3", "n4", "n5"),
                        partition="gpu", account="proj", qos=None)


def test_inside_an_allocation_slurm_runs_are_steps_and_slots_follow_its_nodes(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert isinstance(make_executor(ExecutorConfig(kind="slurm")), SlurmExecutor)
    monkeypatch.setenv("SLURM_JOB_ID", "81")
    executor = make_executor(ExecutorConfig(kind="slurm", nodes=2))
    assert isinstance(executor, SlurmStepExecutor) and executor.job_id == "81"
    executor.allocation = ALLOCATION
    assert executor.slots == 2  # 5 nodes hold two runs of 2
    exp = Experiment(name="x", command=["true"], executor=ExecutorConfig(kind="slurm", nodes=2))
    capped = make_executor(with_executor(exp, slots=1).executor)
    capped.allocation = ALLOCATION
    assert capped.slots == 1  # --slots lowers it
    raised = make_executor(with_executor(exp, slots=8).executor)
    raised.allocation = ALLOCATION
    assert raised.slots == 2  # and never raises it
    # --executor slurm over a local file: the file's default slots is no cap.
    local = Experiment(name="x", command=["true"], executor=ExecutorConfig(kind="local"))
    assert make_executor(with_executor(local, kind="slurm").executor).slots_cap is None


def test_a_step_is_an_srun_of_the_allocation_on_nodes_of_its_own(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "81")
    executor = make_executor(ExecutorConfig(kind="slurm", nodes=2, gpus_per_node=8))
    argv = executor.srun(name="bisect-prefetch-0003-search-k0", nodes=("n3", "n4"),
                         tasks_per_node=1, time_limit="11")
    assert argv == ["srun", "--jobid=81", "--job-name=bisect-prefetch-0003-search-k0", "--overlap",
                    "--nodes=2", "--nodelist=n3,n4", "--ntasks=2", "--ntasks-per-node=1",
                    "--time=11", "--kill-on-bad-exit=1", "--gpus-per-node=8"]


@pytest.mark.parametrize("keys, words", [
    ({"nodes": 6}, "a run needs 6 nodes (executor.nodes) but Slurm allocation 81 holds 5 "
                   "(n1,n2,n3,n4,n5): allocate at least 6 (salloc -N 6) or lower executor.nodes"),
    ({"partition": "debug"}, "executor.partition is debug but Slurm allocation 81 has partition gpu"),
    ({"account": "other"}, "executor.account is other but Slurm allocation 81 has account proj"),
    ({"qos": "high"}, "executor.qos is high but Slurm allocation 81 has qos none"),
])
def test_what_does_not_fit_the_allocation_is_one_line(keys, words):
    wanted = {"nodes": 1, "partition": None, "account": None, "qos": None, **keys}
    with pytest.raises(BisectPrefetchError) as error:
        check_fits(ALLOCATION, **wanted)
    assert str(error.value).startswith(words) and "\n" not in str(error.value)


def test_what_fits_the_allocation_passes():
    check_fits(ALLOCATION, nodes=5, partition="debug,gpu", account="proj", qos=None)


def test_runs_that_cannot_go_on_there_end_in_one_line_with_the_command_that_resumes():
    with pytest.raises(BisectPrefetchError) as error, \
            resume_hint_on_interrupt(Console(file=io.StringIO()), "bisect-prefetch bisect x.yaml --resume"):
        raise ResumableError("Slurm allocation 81 holds 1 node(s) now", where=" in a new allocation")
    assert not isinstance(error.value, ResumableError)
    assert str(error.value) == ("Slurm allocation 81 holds 1 node(s) now; to resume in a new "
                                "allocation, run again: bisect-prefetch bisect x.yaml --resume")
