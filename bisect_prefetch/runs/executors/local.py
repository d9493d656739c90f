"""Up to `slots` jobs at once on this machine.

Each job runs the launcher's run_job (process group, timeouts, live early
stop) in a thread of its own, so the caller only submits and polls. Each slot
has its own device set (devices_per_slot devices, exported as
CUDA_VISIBLE_DEVICES and ASCEND_RT_VISIBLE_DEVICES); every job gets its own
rendezvous port from the Runner and the same pinned thread counts as any other.
"""

from __future__ import annotations

import itertools
import shutil
import socket
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.runs.executors.allocation import (
    RUNNING,
    allocation_id,
    read_allocation,
    this_node,
)
from bisect_prefetch.runs.executors.base import Job
from bisect_prefetch.runs.launcher import JobResult, run_job
from bisect_prefetch.vocab import ERROR

DEVICE_VARIABLES = ("CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES")


@dataclass
class _Running:
    slot: int
    thread: threading.Thread
    cancelled: threading.Event = field(default_factory=threading.Event)
    result: JobResult | None = None
    error: BaseException | None = None


def slot_env(slot: int, devices_per_slot: int | None) -> dict[str, str]:
    """The device set of one slot: slot i holds devices i*d .. i*d+d-1."""
    if not devices_per_slot:
        return {}
    first = slot * devices_per_slot
    devices = ",".join(str(d) for d in range(first, first + devices_per_slot))
    return {name: devices for name in DEVICE_VARIABLES}


class LocalExecutor:
    kind = "local"
    reattachable = False  # its jobs die with the orchestrator

    def __init__(self, *, slots: int = 1, devices_per_slot: int | None = None) -> None:
        self.slots = slots
        self.devices_per_slot = devices_per_slot
        self._free = list(range(slots))
        self._jobs: dict[str, _Running] = {}
        self._ids = itertools.count(1)
        self.lines: list[str] = []

    def check(self, state_path: Path) -> None:
        """Inside a Slurm allocation, this machine must be one of its nodes: from a login
        node (salloc's shell) local runs would train there, beside the allocation."""
        job_id = allocation_id()
        if job_id is None or shutil.which("scontrol") is None:
            return
        try:
            allocation = read_allocation(job_id)
        except BisectPrefetchError:
            return  # an allocation Slurm no longer knows holds nothing back
        if allocation.state == RUNNING and this_node(allocation) is None:
            raise BisectPrefetchError(
                f"this shell holds Slurm allocation {job_id} ({','.join(allocation.nodes)}), but "
                f"the tool runs on {socket.gethostname()}, which is not one of its nodes: "
                "--executor local would train here, not on the allocation; use --executor "
                "slurm (each run a job step of the allocation) or start the tool on one of its "
                "nodes (srun --pty)")

    def submit(self, job: Job) -> str:
        # Beyond the slots (a reference run the search needs at once) a job gets a slot
        # number of its own: the driver, not the executor, keeps to `slots`.
        taken = {running.slot for running in self._jobs.values()}
        slot = self._free.pop(0) if self._free else max(taken | {self.slots - 1}) + 1
        spec = replace(job.spec, env={**job.spec.env, **slot_env(slot, self.devices_per_slot)})
        job_id = f"local-{next(self._ids)}"
        running = _Running(slot=slot, thread=threading.Thread(daemon=True))

        def stop() -> bool:
            return running.cancelled.is_set() or (job.should_stop is not None and job.should_stop())

        def target() -> None:
            try:
                running.result = run_job(spec, should_stop=stop, progress=job.progress)
            except BaseException as exc:  # handed to the caller by poll
                running.error = exc

        running.thread = threading.Thread(target=target, name=job_id, daemon=True)
        self._jobs[job_id] = running
        running.thread.start()
        return job_id

    def attach(self, job_id: str, job: Job) -> bool:
        return False  # a dead orchestrator's local jobs died with it (or were killed as leftovers)

    def poll(self, job_id: str) -> JobResult | None:
        running = self._jobs[job_id]
        if running.thread.is_alive():
            return None
        del self._jobs[job_id]
        if running.slot < self.slots:
            self._free.append(running.slot)
            self._free.sort()
        if running.error is not None:
            raise running.error
        result = running.result
        if running.cancelled.is_set():
            result.outcome, result.reason = ERROR, "cancelled"
        return result

    def cancel(self, job_id: str) -> None:
        running = self._jobs.get(job_id)
        if running is not None:
            running.cancelled.set()
            running.thread.join()

    def cancel_ids(self, job_ids: list[str]) -> None:
        return None  # nothing of a dead orchestrator's outlives it here

    def close(self) -> None:
        for running in self._jobs.values():
            running.cancelled.set()
        for running in list(self._jobs.values()):
            running.thread.join()
