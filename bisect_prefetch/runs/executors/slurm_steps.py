"""Each run one job step of the Slurm allocation the tool runs in (salloc, a batch script).

Inside an allocation (SLURM_JOB_ID set) the slurm executor submits no batch job: a run is
`srun --jobid=ALLOCATION --overlap --nodes=N --nodelist=...` on nodes of its own (a slot:
`nodes` nodes the allocation holds that no other step of the tool uses), named
bisect-prefetch-<run dir> so that `squeue --steps` says which run each step is. --overlap:
a step never waits for CPUs the allocation already gives another step (the tool itself,
when a batch script starts it under srun); no --exact: a step gets every CPU the allocation
holds on its nodes, as a training run wants. Slots: the allocation's nodes divided by
`nodes` (an explicit `slots` lowers that). The shared-filesystem check is a step too, one
task on every node.

srun is the tool's child: its stdout and stderr (every task's, forwarded) are the run's
stdout.log and stderr.log, one writer each, and its exit code is the run's. A step ends
with its srun (checked on Slurm 22.05: gone within 3 s of srun's SIGKILL), so a resumed
tool has nothing to re-attach: no submission is journaled, runs that were in flight run
again, and an srun a killed tool left on this machine is stopped by the leftovers search
(runs/procs.py: the run's plan in its environment) before any run starts.

A node lost mid-run: srun exits 0 after "srun: error: Node failure on NODE", and the
controller takes the node out of an allocation made with --no-kill. Until the controller
gives up on a dead node (SlurmdTimeout, 300 s by default) it counts it as up: a step sent
there fails to launch, a step running there loses its tasks' output or stops making
progress. A step that failed so is followed by a probe step (`true`) on each of its nodes;
one that runs none makes the run lost (retried, never evidence). Later steps leave out a
node that ran no probe (until a later probe runs there, every 30 s), one the controller
cannot reach (until it answers) and one that left the allocation; the slots shrink. When
too few nodes remain for one run, or the allocation ended (without --no-kill a node failure
ends it), the command stops with one line that says how to resume elsewhere.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from bisect_prefetch.errors import BisectPrefetchError, ResumableError
from bisect_prefetch.runs.executors.allocation import (
    RUNNING,
    Allocation,
    check_fits,
    read_allocation,
    unresponsive,
)
from bisect_prefetch.runs.executors.base import LOST, Job
from bisect_prefetch.runs.executors.slurm import (
    SlurmOptions,
    Tracked,
    job_name,
    minutes,
    shell_word,
)
from bisect_prefetch.runs.executors.slurm_cli import one_line, require_clients, run_client
from bisect_prefetch.runs.launcher import JobResult
from bisect_prefetch.vocab import ERROR, STDERR_FILE, STDOUT_FILE, STEP_FILE, TIMEOUT

CLIENTS = ("srun", "squeue", "scontrol", "scancel")
PROBE_EVERY_S = 30.0  # a node that ran no probe step: how often a probe tries it again
PROBE_TIMEOUT_S = 20.0
CHECK_TIMEOUT_S = 60.0  # the check step starts at once (--overlap): a minute is plenty
STOP_WAIT_S = 30.0  # for srun to end once its step was cancelled; then srun is killed
NEW_ALLOCATION = " in a new allocation"
_checked: set[tuple[str, ...]] = set()  # (state dir, allocation, its nodes) checked in this process


@dataclass
class _Step:
    tracked: Tracked
    name: str  # the step's --job-name
    nodes: tuple[str, ...]
    proc: subprocess.Popen
    logs: tuple[IO[bytes], IO[bytes]]
    result: JobResult | None = None  # once srun ended; poll hands it out


class SlurmStepExecutor:
    kind = "slurm"
    reattachable = False  # a step ends with its srun, the tool's child: nothing to re-attach

    def __init__(self, options: SlurmOptions, *, job_id: str, slots: int | None = None) -> None:
        self.options = options
        self.job_id = job_id
        self.slots_cap = slots  # an explicit slots (or --slots); None: as many as nodes allow
        self.allocation: Allocation | None = None  # check() reads it; refreshed on each step
        self.first_nodes: tuple[str, ...] = ()
        self.lines: list[str] = []
        self._steps: dict[str, _Step] = {}
        self._read_at = 0.0
        # Nodes that ran no probe step -> when a probe may try one again.
        self._suspect: dict[str, float] = {}

    @property
    def slots(self) -> int:
        held = len(self.allocation.nodes) if self.allocation else self.options.nodes
        fit = held // self.options.nodes
        if self.slots_cap is not None:
            fit = min(fit, self.slots_cap)
        return max(1, fit)  # none left: the next submit says so

    @property
    def lost_nodes(self) -> list[str]:
        """Nodes the allocation held at the check and holds no more (failed)."""
        held = self.allocation.nodes if self.allocation else self.first_nodes
        return [node for node in self.first_nodes if node not in held]

    # -- the allocation -----------------------------------------------------
    def _read(self, *, fresh: bool = False) -> Allocation:
        """The allocation now (at most one scontrol a poll interval unless fresh); stops the
        command when it ended."""
        now = time.monotonic()
        if fresh or self.allocation is None or now - self._read_at >= self.options.poll_s:
            self.allocation, self._read_at = read_allocation(self.job_id), now
        allocation = self.allocation
        if allocation.state != RUNNING:
            failed = (" after a node failed; an allocation made with --no-kill goes on without "
                      "the node" if allocation.state == "NODE_FAIL" else "")
            raise ResumableError(f"Slurm allocation {self.job_id} ended ({allocation.state}"
                                 f"{failed}): finished runs are in the journal",
                                 where=NEW_ALLOCATION)
        return allocation

    def _place(self) -> tuple[str, ...]:
        """Nodes for the next step: `nodes` the allocation holds that no step of ours uses.
        Beyond the free slots (a reference run the search needs at once) it waits for a step
        to end, following the others meanwhile, as a batch job would wait in the queue."""
        need = self.options.nodes
        looked = 0.0
        while True:
            allocation = self._read(fresh=not looked)
            if len(allocation.nodes) < need:
                lost = ",".join(self.lost_nodes) or "none"
                raise ResumableError(
                    f"Slurm allocation {self.job_id} holds {len(allocation.nodes)} node(s) now "
                    f"(failed: {lost}), too few for a run of {need}: finished runs are in the "
                    "journal", where=NEW_ALLOCATION)
            if time.monotonic() - looked >= self.options.poll_s:
                # A node the controller or srun could not reach is not used until it answers
                # (a probe step runs there) or leaves the allocation.
                looked = time.monotonic()
                down = unresponsive(allocation.nodes) | {
                    node for node in allocation.nodes if not self._answers(node, looked)}
            busy = {node for step in self._steps.values() if step.result is None
                    for node in step.nodes}
            free = [node for node in allocation.nodes if node not in busy | down]
            if len(free) >= need:
                return tuple(free[:need])
            for step in list(self._steps.values()):
                self._follow(step, time.monotonic())
            time.sleep(0.05)

    def _answers(self, node: str, now: float) -> bool:
        """False for a node that ran no probe step, until a later probe (at most every
        PROBE_EVERY_S) runs there: the controller counts a dead node as up for SlurmdTimeout
        (300 s by default), and every step sent there meanwhile would be lost."""
        until = self._suspect.get(node)
        if until is None:
            return True
        return now >= until and self._probe(node)

    def _probe(self, node: str) -> bool:
        """Whether a step runs on the node (`true`, within PROBE_TIMEOUT_S). One that does not
        is left out of steps until a probe PROBE_EVERY_S later runs there."""
        argv = [*self.srun(name=job_name(Path(f"probe-{node}")), nodes=(node,), tasks_per_node=1,
                           time_limit="1", resources=False), "true"]
        try:
            answered = subprocess.run(argv, capture_output=True, timeout=PROBE_TIMEOUT_S,
                                      start_new_session=True).returncode == 0
        except subprocess.TimeoutExpired:
            answered = False  # subprocess.run killed srun; its step ends with it
        if answered:
            self._suspect.pop(node, None)
        else:
            self._suspect[node] = time.monotonic() + PROBE_EVERY_S
        return answered

    # -- the step -----------------------------------------------------------
    def srun(self, *, name: str, nodes: tuple[str, ...], tasks_per_node: int, time_limit: str,
             resources: bool = True) -> list[str]:
        """srun's options for one step of the allocation on these nodes."""
        o = self.options
        argv = ["srun", f"--jobid={self.job_id}", f"--job-name={name}", "--overlap",
                f"--nodes={len(nodes)}", f"--nodelist={','.join(nodes)}",
                f"--ntasks={len(nodes) * tasks_per_node}", f"--ntasks-per-node={tasks_per_node}",
                f"--time={time_limit}", "--kill-on-bad-exit=1"]
        if resources and o.gpus_per_node is not None:
            argv.append(f"--gpus-per-node={o.gpus_per_node}")
        if resources and o.gres is not None:
            argv.append(f"--gres={o.gres}")
        return argv

    def submit(self, job: Job) -> str:
        spec = job.spec
        nodes = self._place()
        name = job_name(spec.run_dir)
        # One launcher per node (torchrun, msrun), as in a batch job: $SLURM_NODEID says which.
        command = " ".join(shell_word(word, self.options.expand_env) for word in spec.argv)
        argv = [*self.srun(name=name, nodes=nodes, tasks_per_node=self.options.ntasks_per_node or 1,
                           time_limit=self.options.time or minutes(spec.timeout_s)),
                "bash", "-c", command]
        (spec.run_dir / STEP_FILE).write_text(
            f"# Generated by bisect-prefetch: one run, a step of Slurm allocation {self.job_id}.\n"
            f"MASTER_ADDR={shlex.quote(nodes[0])} {shlex.join(argv)}\n")
        try:
            logs = (open(spec.run_dir / STDOUT_FILE, "wb"), open(spec.run_dir / STDERR_FILE, "wb"))
        except OSError as exc:
            raise BisectPrefetchError(f"run dir {spec.run_dir} is not writable: {exc.strerror}") from None
        try:
            # A session of its own: Ctrl-C reaches the tool, which cancels the step (scancel).
            proc = subprocess.Popen(argv, env={**spec.env, "MASTER_ADDR": nodes[0]},
                                    cwd=spec.cwd or spec.run_dir, stdin=subprocess.DEVNULL,
                                    stdout=logs[0], stderr=logs[1], start_new_session=True)
        except OSError as exc:
            for log in logs:
                log.close()
            raise BisectPrefetchError(f"cannot start srun: {exc.strerror or exc}") from None
        now = time.monotonic()
        tracked = Tracked(job=job, run_dir=spec.run_dir, started=now, last_change=now)
        self._steps[name] = _Step(tracked=tracked, name=name, nodes=nodes, proc=proc, logs=logs)
        return name

    def attach(self, job_id: str, job: Job) -> bool:
        return False  # steps end with the srun that started them: none outlives its tool

    # -- following a step -----------------------------------------------------
    def poll(self, job_id: str) -> JobResult | None:
        step = self._steps[job_id]
        self._follow(step, time.monotonic())
        if step.result is None:
            return None
        del self._steps[job_id]
        step.result.argv = list(step.tracked.job.spec.argv)
        return step.result

    def _follow(self, step: _Step, now: float) -> None:
        """The step's result once its srun ended; meanwhile the live checks, every poll_s."""
        if step.result is not None:
            return
        code = step.proc.poll()
        tracked = step.tracked
        if code is None:
            if tracked.ended is None and now - tracked.last_poll >= self.options.poll_s:
                tracked.last_poll = now
                tracked.ended = tracked.watch(now)
                if tracked.ended is not None and tracked.ended.outcome == TIMEOUT:
                    self._timed_out(step)
                elif tracked.ended is not None:
                    self._stop([step])  # srun ends soon after; a later poll hears it
            return
        self._close_logs(step)
        step.result = tracked.ended or self._ended(step, code, now)

    def _timed_out(self, step: _Step) -> None:
        """A step that hangs: lost when a node of it runs no probe step (the controller
        takes SlurmdTimeout, 300 s by default, to call that a node failure), and then its
        srun is killed at once, as srun waits for the controller; else a timeout, cancelled."""
        unreachable = [node for node in step.nodes if not self._probe(node)]
        self._stop([step])
        if unreachable:
            ended = step.tracked.ended
            step.tracked.ended = JobResult(ERROR, None, ended.wall_s,
                                           f"{LOST}: node failure ({','.join(unreachable)} runs "
                                           f"no step; {ended.reason})", ended.first_progress_s)
            step.proc.kill()  # the step dies with it; the controller cleans up the node's part

    def _ended(self, step: _Step, code: int, now: float) -> JobResult:
        """How a step that srun saw to its end ended: lost when a node of it left the
        allocation (srun then exits 0), or when srun failed and a node of it runs no probe
        step; else by srun's exit code."""
        tracked = step.tracked
        wall = tracked.wall(now)
        gone = [node for node in step.nodes if node not in self._read(fresh=True).nodes]
        if gone:
            return JobResult(ERROR, None, wall, f"{LOST}: node failure ({','.join(gone)} left "
                             f"Slurm allocation {self.job_id})", tracked.first_progress)
        if code == 0:
            return tracked.finished(wall)
        # A node that died is counted up for SlurmdTimeout: srun then fails to launch there,
        # or loses its tasks' output. Whether the run failed or its node did, a probe tells.
        unreachable = [node for node in step.nodes if not self._probe(node)]
        if unreachable:
            return JobResult(ERROR, None, wall, f"{LOST}: node failure ({','.join(unreachable)} "
                             f"runs no step; srun exit code {code})", tracked.first_progress)
        how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        return JobResult(ERROR, code, wall, f"srun {how}", tracked.first_progress)

    # -- stopping steps -------------------------------------------------------
    def _step_ids(self) -> dict[str, str]:
        """JOBID.STEPID of each running step of the allocation, by step name."""
        shown = run_client(["squeue", "--steps", "-h", "-j", self.job_id, "-o", "%i %j"])
        pairs = (line.split(None, 1) for line in shown.stdout.splitlines())
        return {pair[1].strip(): pair[0] for pair in pairs if len(pair) == 2}

    def _stop(self, steps: list[_Step]) -> None:
        """scancel JOBID.STEPID each step; a step squeue does not show (not started yet, or
        ending) is stopped through its srun (SIGTERM: srun cancels its step)."""
        ids = self._step_ids()
        known = [ids[step.name] for step in steps if step.name in ids]
        if known:
            run_client(["scancel", *known])
        for step in steps:
            if step.name not in ids and step.proc.poll() is None:
                step.proc.send_signal(signal.SIGTERM)

    def _reap(self, steps: list[_Step]) -> None:
        """Wait for each stopped step's srun to end (killed after STOP_WAIT_S)."""
        deadline = time.monotonic() + STOP_WAIT_S
        for step in steps:
            try:
                step.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                step.proc.kill()  # the step dies with it
                step.proc.wait()
            self._close_logs(step)
            step.result = step.tracked.ended

    @staticmethod
    def _close_logs(step: _Step) -> None:
        for log in step.logs:
            log.close()

    def cancel(self, job_id: str) -> None:
        step = self._steps.get(job_id)
        if step is None or step.result is not None:
            return
        if step.tracked.ended is None:
            step.tracked.ended = JobResult(ERROR, None, step.tracked.wall(time.monotonic()),
                                           "cancelled")
        self._stop([step])
        self._reap([step])  # its nodes are free once this returns

    def cancel_ids(self, job_ids: list[str]) -> None:
        """scancel batch jobs a dead orchestrator submitted (before the tool ran in an
        allocation); steps journal nothing."""
        if job_ids:
            run_client(["scancel", *job_ids])

    def close(self) -> None:
        live = [step for step in self._steps.values() if step.result is None]
        now = time.monotonic()
        for step in live:
            if step.tracked.ended is None:
                step.tracked.ended = JobResult(ERROR, None, step.tracked.wall(now), "cancelled")
        if live:
            self._stop(live)
            self._reap(live)
        self._steps.clear()

    # -- checks before any run ------------------------------------------------
    def check(self, state_path: Path) -> None:
        """srun on PATH, a running allocation a run fits in, the state dir seen by every node."""
        require_clients(CLIENTS)
        o = self.options
        allocation = read_allocation(self.job_id)
        check_fits(allocation, nodes=o.nodes, partition=o.partition, account=o.account, qos=o.qos)
        self.allocation, self._read_at = allocation, time.monotonic()
        self.first_nodes = allocation.nodes
        self.lines = [f"runs are job steps of Slurm allocation {self.job_id} "
                      f"({','.join(allocation.nodes)}): {self.slots} slot(s) of {o.nodes} node(s)"]
        if o.sbatch_args:
            self.lines.append("note: executor.sbatch_args are not used inside an allocation "
                              "(each run is a job step, started by srun)")
        done = (str(state_path), self.job_id, *allocation.nodes, os.environ.get("SLURM_CONF", ""))
        if done not in _checked:
            self._check_shared(state_path, allocation)
            _checked.add(done)

    def _check_shared(self, state_path: Path, allocation: Allocation) -> None:
        """One task on every node writes a token into the state dir; each must appear here."""
        check_dir = (state_path / "slurm-check").resolve()
        check_dir.mkdir(parents=True, exist_ok=True)
        token = uuid.uuid4().hex
        # mkdir: on a node that does not share the state dir the write still succeeds there.
        write = (f"mkdir -p {shlex.quote(str(check_dir))} && echo {token} > "
                 f"{shlex.quote(str(check_dir / f'token-{token}-'))}\"$SLURMD_NODENAME\"")
        name = job_name(check_dir)
        argv = [*self.srun(name=name, nodes=allocation.nodes, tasks_per_node=1, time_limit="2",
                           resources=False), "bash", "-c", write]
        proc = subprocess.Popen(argv, cwd=check_dir, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        try:
            said, _ = proc.communicate(timeout=CHECK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            started = name in self._step_ids()
            proc.kill()  # its step dies with it
            proc.communicate()
            raise BisectPrefetchError(
                f"the check step on Slurm allocation {self.job_id} did not "
                f"{'end' if started else 'start'} within {CHECK_TIMEOUT_S:g}s, so it was "
                "cancelled: nothing was checked") from None
        if proc.returncode != 0:
            last = one_line((said.strip().splitlines() or ["no output"])[-1])
            raise BisectPrefetchError(
                f"the check step on Slurm allocation {self.job_id} failed (srun exit code "
                f"{proc.returncode}: {last}): nothing was checked")
        tokens = {node: check_dir / f"token-{token}-{node}" for node in allocation.nodes}
        missing = [node for node, path in tokens.items() if not _holds(path, token)]
        if missing:
            raise BisectPrefetchError(
                f"state dir {state_path} is not shared with node(s) {','.join(missing)} of Slurm "
                f"allocation {self.job_id}: a step wrote {tokens[missing[0]]} there and it did "
                "not appear here; use a --state-dir on a shared filesystem")
        for path in tokens.values():
            path.unlink()


def _holds(path: Path, token: str) -> bool:
    try:
        return path.read_text().strip() == token
    except OSError:
        return False
