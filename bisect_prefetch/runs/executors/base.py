"""What an executor is: submit a job, poll it, cancel it.

The Runner prepares a run (plan, environment, argument list) the same way
whoever executes it; an executor only starts the job somewhere, says when it
ended and how (a launcher.JobResult), and stops it on request. The search,
the journal and the comparison never know which executor ran a job.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from bisect_prefetch.runs.launcher import JobResult, JobSpec

# A run's reason starts with this when the scheduler took its job away (cancelled,
# preempted, a node lost): the run says nothing about drift and is retried.
LOST = "lost"
LOST_RETRIES = 2  # a run lost this often is run again; beyond, it counts as a failed run


@dataclass
class Job:
    """One run to execute: the launcher's spec and the live hooks polled while it runs."""

    spec: JobSpec
    # Polled while the job runs: True stops it (outcome stopped-early).
    should_stop: Callable[[], bool] | None = None
    # A counter that grows with the job's steps; a job that stops growing it hangs.
    progress: Callable[[], int] | None = None


class Executor(Protocol):
    kind: str  # local | slurm
    slots: int  # the most jobs in flight at once
    reattachable: bool  # whether a job outlives the orchestrator (journaled at submission)
    lines: list[str]  # what the command says once the executor is checked (where runs go)

    def check(self, state_path: Path) -> None:
        """Raise BisectPrefetchError when jobs cannot run (before anything is journaled)."""

    def submit(self, job: Job) -> str:
        """Start the job (or queue it); returns its job id. The caller keeps to `slots`."""

    def poll(self, job_id: str) -> JobResult | None:
        """None while the job is pending or running; its result once it ended."""

    def cancel(self, job_id: str) -> None:
        """Stop the job, whatever state it is in; poll then says error (cancelled)."""

    def attach(self, job_id: str, job: Job) -> bool:
        """Follow a job a previous orchestrator submitted; False when it cannot be found."""

    def cancel_ids(self, job_ids: list[str]) -> None:
        """Cancel jobs this orchestrator does not follow (a dead one's)."""

    def close(self) -> None:
        """Cancel every job still in flight."""
