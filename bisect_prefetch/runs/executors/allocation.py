"""The Slurm allocation the tool runs in (salloc, a batch script): its nodes, and what fits it.

Inside an allocation SLURM_JOB_ID names it. What it holds is read from the controller
(`scontrol show job`), never from the environment: a node that failed leaves the
allocation's node list (an allocation made with --no-kill goes on without it), while
SLURM_JOB_NODELIST keeps naming it. The shell of `salloc` usually runs on a login node,
outside the allocation; a batch script and `srun --pty` run on one of its nodes.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.runs.executors.slurm_cli import fields, no_list, one_line, run_client

ALLOCATION_ENV = "SLURM_JOB_ID"  # set by salloc, sbatch and srun for everything they start
NODE_ENV = "SLURMD_NODENAME"  # set on an allocated node (batch script, a step), not on a login node
RUNNING = "RUNNING"


@dataclass(frozen=True)
class Allocation:
    job_id: str
    state: str  # RUNNING while it can start steps
    nodes: tuple[str, ...]  # those it holds now, in Slurm's order
    partition: str | None
    account: str | None
    qos: str | None


def allocation_id() -> str | None:
    """The job id of the allocation this process runs in, or None."""
    return os.environ.get(ALLOCATION_ENV) or None


def read_allocation(job_id: str) -> Allocation:
    """The allocation as the controller knows it now; one line when it knows none."""
    shown = run_client(["scontrol", "show", "job", "-o", job_id])
    line = next((line for line in shown.stdout.splitlines() if "JobState=" in line), None)
    if shown.returncode != 0 or line is None:
        why = one_line(shown.stderr or shown.stdout) or "no such job"
        raise BisectPrefetchError(
            f"{ALLOCATION_ENV}={job_id} names no Slurm allocation that is still known ({why}): "
            f"start the tool inside a running allocation, or without {ALLOCATION_ENV} to submit "
            "one batch job per run")
    job = fields(line)

    def named(key: str) -> str | None:
        return None if no_list(job.get(key)) else job[key]

    nodes = hostnames(job.get("NodeList", ""))
    return Allocation(job_id=job_id, state=job.get("JobState", "UNKNOWN"), nodes=tuple(nodes),
                      partition=named("Partition"), account=named("Account"), qos=named("QOS"))


def hostnames(node_list: str) -> list[str]:
    """`bpnode[1-2]` as [bpnode1, bpnode2] (scontrol show hostnames)."""
    if no_list(node_list):
        return []
    shown = run_client(["scontrol", "show", "hostnames", node_list])
    if shown.returncode != 0:
        raise BisectPrefetchError(f"scontrol cannot expand the node list {node_list}: "
                                  f"{one_line(shown.stderr)}")
    return shown.stdout.split()


def this_node(allocation: Allocation) -> str | None:
    """The allocation's node this process runs on, or None (a login node, or any host the
    allocation does not hold): by SLURMD_NODENAME, else by this host's name against each
    node's name, host name and address."""
    named = os.environ.get(NODE_ENV)
    if named in allocation.nodes:
        return named
    if not allocation.nodes:
        return None
    host = socket.gethostname()
    here = {host, host.split(".")[0]}
    shown = run_client(["scontrol", "show", "node", "-o", ",".join(allocation.nodes)])
    for line in shown.stdout.splitlines():
        node = fields(line)
        host_name = node.get("NodeHostName") or ""
        names = {node.get("NodeName"), host_name, host_name.split(".")[0], node.get("NodeAddr")}
        if here & names:
            return node.get("NodeName")
    return None


def check_fits(allocation: Allocation, *, nodes: int, partition: str | None,
               account: str | None, qos: str | None) -> None:
    """One line when a run of the experiment's executor cannot be a step of this allocation."""
    where = f"Slurm allocation {allocation.job_id}"
    if allocation.state != RUNNING:
        raise BisectPrefetchError(f"{where} is {allocation.state}, not running: start the tool "
                                  "inside a running allocation")
    if nodes > len(allocation.nodes):
        held = ",".join(allocation.nodes) or "none"
        raise BisectPrefetchError(
            f"a run needs {nodes} nodes (executor.nodes) but {where} holds {len(allocation.nodes)} "
            f"({held}): allocate at least {nodes} (salloc -N {nodes}) or lower executor.nodes")
    for key, wanted, held in (("partition", partition, allocation.partition),
                              ("account", account, allocation.account),
                              ("qos", qos, allocation.qos)):
        if wanted is not None and held not in wanted.split(","):
            raise BisectPrefetchError(
                f"executor.{key} is {wanted} but {where} has {key} {held or 'none'}: runs are job "
                f"steps of the allocation, so they run under its {key}; allocate with "
                f"--{key}={wanted}, or drop executor.{key}")


def unresponsive(nodes: tuple[str, ...]) -> set[str]:
    """Those of the nodes the controller cannot reach now (DOWN or NOT_RESPONDING): a node
    that died stays in the allocation until the controller gives up on it (SlurmdTimeout)."""
    if not nodes:
        return set()
    shown = run_client(["scontrol", "show", "node", "-o", ",".join(nodes)])
    found = set()
    for line in shown.stdout.splitlines():
        node = fields(line)
        flags = {flag.rstrip("*") for flag in node.get("State", "").split("+")}
        if flags & {"DOWN", "NOT_RESPONDING"}:
            found.add(node.get("NodeName", ""))
    return found

