"""Each run one Slurm batch job: sbatch a generated script, follow it, scancel it.

Slurm's own CLI is the interface every cluster has: sbatch to submit,
squeue and `scontrol show job` for states (accounting may be off), sacct
when the controller has forgotten a job, scancel to stop one. The batch
script runs the experiment's command (under srun for multi-node jobs, so it
starts once per node) with the run's plan in its environment, and leaves the
command's exit code in the run dir: a job Slurm no longer knows still tells
how it ended. The state dir must be on a filesystem the nodes share, since
the job writes its metrics there and the orchestrator follows them live.

State mapping: COMPLETED is judged by exit code (and steps, by the Runner);
FAILED and OUT_OF_MEMORY are errors; TIMEOUT is a timeout; CANCELLED,
PREEMPTED, NODE_FAIL, BOOT_FAIL and DEADLINE are errors the caller retries
(the job was lost, the run says nothing). None is ever clean.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.runs.executors.base import LOST, Job
from bisect_prefetch.runs.executors.slurm_cli import (
    fields,
    no_list,
    one_line,
    require_clients,
    run_client,
)
from bisect_prefetch.runs.launcher import JobResult
from bisect_prefetch.vocab import (
    ERROR,
    EXIT_FILE,
    OK,
    SCRIPT_FILE,
    STDERR_FILE,
    STDOUT_FILE,
    STOPPED_EARLY,
    TIMEOUT,
)

CLIENTS = ("sbatch", "squeue", "scontrol", "scancel")
IN_FLIGHT = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED",
             "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED"}
LOST_STATES = {"CANCELLED", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "DEADLINE", "REVOKED"}
# Pending for a reason that waiting will not cure: the job can never start as asked.
NEVER_RUNS = {"PartitionNodeLimit", "PartitionTimeLimit", "PartitionConfig", "BadConstraints",
              "InvalidAccount", "InvalidQOS", "AccountNotAllowed", "QOSNotAllowed",
              "PartitionDown", "PartitionInactive", "ReqNodeNotAvail, UnavailableNodes"}
CHECK_TIMEOUT_S = 600.0  # the shared-filesystem check job may wait in the queue
_checked: set[tuple[str, ...]] = set()  # (state dir, options) already checked in this process


@dataclass
class SlurmOptions:
    """The executor keys of an experiment file (see experiment.ExecutorConfig)."""

    slots: int = 1
    partition: str | None = None
    nodes: int = 1
    ntasks_per_node: int | None = None
    gpus_per_node: int | None = None
    gres: str | None = None
    time: str | None = None
    account: str | None = None
    qos: str | None = None
    sbatch_args: tuple[str, ...] = ()
    expand_env: tuple[str, ...] = ()  # names whose $NAME / ${NAME} expand on the node
    poll_s: float = 0.5


@dataclass
class Tracked:
    """A job followed by a Slurm executor: its live hooks and what its polls saw."""

    job: Job
    run_dir: Path
    started: float | None = None  # when first seen running (timeouts count from there)
    last_count: int = 0
    last_change: float = 0.0
    first_progress: float | None = None
    last_poll: float = 0.0
    ended: JobResult | None = None  # decided by us (stop, timeout, cancel); Slurm still ends it

    def wall(self, now: float) -> float:
        return now - self.started if self.started is not None else 0.0

    def watch(self, now: float) -> JobResult | None:
        """The launcher's live checks for a running job (early stop, timeouts, progress):
        the result that ends it, or None while it may go on. The caller stops the job."""
        job, spec = self.job, self.job.spec
        if self.started is None:
            self.started = self.last_change = now
        count = job.progress() if job.progress is not None else 0
        if count != self.last_count:
            self.last_count, self.last_change = count, now
            if self.first_progress is None:
                self.first_progress = now - self.started
        wall = now - self.started
        if job.should_stop is not None and job.should_stop():
            return JobResult(STOPPED_EARLY, None, wall, "stopped early: decided", self.first_progress)
        if wall > spec.timeout_s:
            return JobResult(TIMEOUT, None, wall, f"timed out after {spec.timeout_s:g}s",
                             self.first_progress)
        if spec.no_progress_timeout_s is not None and now - self.last_change > spec.no_progress_timeout_s:
            return JobResult(TIMEOUT, None, wall, f"no progress for {spec.no_progress_timeout_s:g}s",
                             self.first_progress)
        return None

    def finished(self, wall: float) -> JobResult:
        """A job that exited 0 by itself: ok, or an error when it wrote no metrics."""
        job = self.job
        if self.first_progress is None and job.progress is not None and job.progress():
            self.first_progress = wall
        if job.progress is not None and job.progress() == 0:
            return JobResult(ERROR, 0, wall, "no metrics written", self.first_progress)
        return JobResult(OK, 0, wall, "finished", self.first_progress)


@dataclass(frozen=True)
class JobState:
    """A batch job as Slurm (or its exit file) tells it."""

    state: str
    exit_code: int | None
    ran: bool | None = None  # whether it ever got a node (None: not known)
    reason: str = ""  # why it is pending


def shell_word(word: str, expand: tuple[str, ...] = ()) -> str:
    """word for bash, exactly as given, except `$NAME` and `${NAME}` for the names in
    expand (executor.expand_env), which expand on the node. Nothing else ever runs or
    expands: no `$(...)`, no other `$`, no backslash games."""
    if not expand:
        return shlex.quote(word)
    names = "|".join(re.escape(name) for name in expand)
    pieces = re.split(rf"(\$(?:{names})(?![A-Za-z0-9_])|\$\{{(?:{names})\}})", word)
    return "".join(f'"${{{piece.strip("${}")}}}"' if i % 2 else shlex.quote(piece)
                   for i, piece in enumerate(pieces) if piece) or "''"


def sbatch_word(word: str) -> str:
    """word for an `#SBATCH` line, as sbatch's own parser reads it (not bash): in double
    quotes, with `\\` and `"` escaped by a backslash, which that parser drops anywhere, even
    in single quotes (so shlex.quote loses a path's backslashes). `$`, backquotes and `#` mean
    nothing there. A line cannot hold a control character: such a word is refused."""
    if any(ord(c) < 32 or ord(c) == 127 for c in word):
        raise BisectPrefetchError(f"{word!r} holds a control character, which a batch script "
                                  "line cannot pass to sbatch (a state dir path with a newline?)")
    if _PLAIN.fullmatch(word):
        return word  # nothing to quote: the line reads as written
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


_PLAIN = re.compile(r"[A-Za-z0-9_=:,./+@%-]+")


def minutes(seconds: float) -> str:
    """Slurm's --time for a run of this timeout: a minute's slack over the tool's own."""
    return str(max(1, math.ceil(seconds / 60)) + 1)


def job_name(run_dir: Path) -> str:
    """The Slurm job (or step) name of a run: squeue shows which run each is."""
    return f"bisect-prefetch-{run_dir.name}"


class SlurmExecutor:
    kind = "slurm"
    reattachable = True  # a job outlives its orchestrator; the journal holds its id

    def __init__(self, options: SlurmOptions) -> None:
        self.options = options
        self.slots = options.slots
        self._jobs: dict[str, Tracked] = {}
        self.lines: list[str] = []

    # -- the batch script -------------------------------------------------
    def header(self, *, name: str, out: Path, err: Path, time_limit: str | None) -> list[str]:
        o = self.options
        # Slurm expands %j and the like in these paths: a % of the path itself is %%.
        lines = [f"--job-name={name}", f"--output={str(out).replace('%', '%%')}",
                 f"--error={str(err).replace('%', '%%')}", f"--nodes={o.nodes}"]
        for flag, value in (("partition", o.partition), ("ntasks-per-node", o.ntasks_per_node),
                            ("gpus-per-node", o.gpus_per_node), ("gres", o.gres),
                            ("account", o.account), ("qos", o.qos),
                            ("time", o.time or time_limit)):
            if value is not None:
                lines.append(f"--{flag}={value}")
        return [f"#SBATCH {sbatch_word(line)}" for line in lines]

    def script(self, job: Job) -> str:
        spec = job.spec
        # What the run needs beyond the orchestrator's own environment (which sbatch
        # passes on anyway): the plan, the pins, the adapter on PYTHONPATH.
        exports = [f"export {k}={shlex.quote(v)}" for k, v in sorted(spec.env.items())
                   if os.environ.get(k) != v and k.isidentifier()]
        command = " ".join(shell_word(w, self.options.expand_env) for w in spec.argv)
        if self.options.nodes > 1 or self.options.ntasks_per_node:
            # One launcher per node (torchrun, msrun): srun starts it on each, where
            # $SLURM_NODEID says which node it is.
            command = f"srun --kill-on-bad-exit=1 bash -c {shlex.quote(command)}"
        exit_file = spec.run_dir.resolve() / EXIT_FILE
        return "\n".join([
            "#!/bin/bash",
            *self.header(name=job_name(spec.run_dir),
                         out=spec.run_dir.resolve() / STDOUT_FILE,
                         err=spec.run_dir.resolve() / STDERR_FILE,
                         time_limit=minutes(spec.timeout_s)),
            f"#SBATCH {sbatch_word(f'--chdir={(spec.cwd or spec.run_dir).resolve()}')}",
            "# Generated by bisect-prefetch: one run of the experiment.",
            *exports,
            'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
            "export MASTER_ADDR",
            command,
            "code=$?",
            f"echo $code > {shlex.quote(str(exit_file))}",
            "exit $code",
            "",
        ])

    # -- submit -----------------------------------------------------------
    def _sbatch(self, script: Path, env: dict[str, str] | None = None) -> str:
        done = run_client(["sbatch", "--parsable", *self.options.sbatch_args, str(script)], env)
        if done.returncode != 0:
            raise BisectPrefetchError(
                f"Slurm rejected the job ({script}): {one_line(done.stderr or done.stdout)}")
        return done.stdout.strip().split(";")[0]

    def submit(self, job: Job) -> str:
        path = job.spec.run_dir / SCRIPT_FILE
        path.write_text(self.script(job))
        job_id = self._sbatch(path)
        self._jobs[job_id] = Tracked(job=job, run_dir=job.spec.run_dir)
        return job_id

    def attach(self, job_id: str, job: Job) -> bool:
        if self._state(job_id, job.spec.run_dir) is None:
            return False
        self._jobs[job_id] = Tracked(job=job, run_dir=job.spec.run_dir)
        return True

    # -- states -----------------------------------------------------------
    def _state(self, job_id: str, run_dir: Path) -> JobState | None:
        """The job's state from scontrol, else sacct, else the exit file; None: unknown."""
        shown = run_client(["scontrol", "show", "job", "-o", job_id])
        if shown.returncode == 0 and "JobState=" in shown.stdout:
            job = fields(shown.stdout)
            state = job.get("JobState", "UNKNOWN")
            if state == "PENDING" and job.get("Reason") in NEVER_RUNS:
                raise BisectPrefetchError(
                    f"Slurm will never start job {job_id} as asked (pending: {job['Reason']}); "
                    "check the executor's partition, nodes, time, account and qos")
            code = job.get("ExitCode", "0:0").split(":")[0]
            return JobState(state, int(code) if code.isdigit() else None,
                            ran=not no_list(job.get("NodeList")), reason=job.get("Reason", ""))
        if shutil.which("sacct"):
            acct = run_client(["sacct", "-n", "-P", "-X", "-j", job_id, "-o",
                               "State,ExitCode,NodeList"])
            line = acct.stdout.strip().splitlines()[:1]
            if acct.returncode == 0 and line and line[0].count("|") == 2:
                state, code, nodes = line[0].split("|")
                code = code.split(":")[0]
                return JobState(state.split()[0], int(code) if code.isdigit() else None,
                                ran=not no_list(nodes) and nodes != "None assigned")
        try:
            return JobState("COMPLETED", int((run_dir / EXIT_FILE).read_text().strip()), ran=True)
        except (OSError, ValueError):
            return None

    def poll(self, job_id: str) -> JobResult | None:
        tracked = self._jobs[job_id]
        now = time.monotonic()
        if now - tracked.last_poll < self.options.poll_s:
            return None
        tracked.last_poll = now
        found = self._state(job_id, tracked.run_dir)
        if found is None:
            return self._end(job_id, JobResult(ERROR, None, tracked.wall(now),
                                               f"Slurm job {job_id} vanished (state unknown)"))
        if found.state in IN_FLIGHT:
            if tracked.ended is None and found.state == "RUNNING":
                tracked.ended = tracked.watch(now)
                if tracked.ended is not None:
                    run_client(["scancel", job_id])
            return None
        if tracked.ended is not None:
            return self._end(job_id, tracked.ended)
        return self._end(job_id, self._result(found, tracked, now))

    def _result(self, found: JobState, tracked: Tracked, now: float) -> JobResult:
        wall, code = tracked.wall(now), found.exit_code
        state = found.state.split()[0].rstrip("+")
        if state == "COMPLETED" and code == 0:
            return tracked.finished(wall)
        if state == "TIMEOUT":
            return JobResult(TIMEOUT, code, wall, f"Slurm job {tracked.run_dir.name} hit its time limit",
                             tracked.first_progress)
        if state in LOST_STATES:
            # No exit code of its own: the job was taken away, it did not end by itself.
            before = " before it started" if found.ran is False else ""
            return JobResult(ERROR, None, wall, f"{LOST}: Slurm state {state}{before}",
                             tracked.first_progress)
        if state == "OUT_OF_MEMORY":
            return JobResult(ERROR, code, wall, "out of memory (Slurm)", tracked.first_progress)
        return JobResult(ERROR, code, wall, f"Slurm state {state}, exit code {code}",
                         tracked.first_progress)

    def _end(self, job_id: str, result: JobResult) -> JobResult:
        tracked = self._jobs.pop(job_id)
        result.argv = list(tracked.job.spec.argv)
        return result

    # -- cancel -----------------------------------------------------------
    def cancel(self, job_id: str) -> None:
        tracked = self._jobs.get(job_id)
        if tracked is not None and tracked.ended is None:
            tracked.ended = JobResult(ERROR, None, tracked.wall(time.monotonic()), "cancelled")
        run_client(["scancel", job_id])

    def cancel_ids(self, job_ids: list[str]) -> None:
        """scancel jobs this orchestrator does not follow (a dead one's)."""
        if job_ids:
            run_client(["scancel", *job_ids])

    def close(self) -> None:
        self.cancel_ids(list(self._jobs))
        self._jobs.clear()

    # -- checks before any run --------------------------------------------
    def check(self, state_path: Path) -> None:
        """sbatch on PATH, the options accepted, the state dir seen by the job's node."""
        require_clients(CLIENTS)
        if "\\" in str(state_path):
            # slurmd takes a backslash in --output as "expand no %" and fails the job's start.
            raise BisectPrefetchError(f"state dir {state_path} holds a backslash, which Slurm "
                                      "cannot take in a job's log path: use another --state-dir")
        done = (str(state_path), repr(self.options), os.environ.get("SLURM_CONF", ""))
        if done in _checked:
            return  # one check job per state dir and options is enough (matrix cells)
        check_dir = state_path / "slurm-check"
        check_dir.mkdir(parents=True, exist_ok=True)
        token = uuid.uuid4().hex
        token_path = check_dir / f"token-{token}"
        script = check_dir / "check.sbatch"
        # The same options as every run, so a partition or account Slurm refuses is said now.
        script.write_text("\n".join([
            "#!/bin/bash",
            *self.header(name="bisect-prefetch-check", out=check_dir / "check.out",
                         err=check_dir / "check.err", time_limit="2"),
            f"echo {token} > {shlex.quote(str(token_path))}",
            "",
        ]))
        job_id = self._sbatch(script)
        time.sleep(0.5)  # let the scheduler look at it once: a reason it never runs shows then
        found = self._check_ended(job_id, check_dir)
        if found.ran is False:
            raise BisectPrefetchError(
                f"the Slurm check job {job_id} ended before it started (Slurm state {found.state}): "
                "nothing was checked; run the command again")
        try:
            seen = token_path.read_text().strip() == token
        except OSError:
            seen = False
        if not seen:
            raise BisectPrefetchError(
                f"state dir {state_path} is not shared with the Slurm nodes: a job wrote "
                f"{token_path} there and it did not appear here; use a --state-dir on a shared filesystem")
        token_path.unlink()
        _checked.add(done)

    def _check_ended(self, job_id: str, check_dir: Path) -> JobState:
        """The check job once it ended; one line when it did not start (or end) in time."""
        deadline = time.monotonic() + CHECK_TIMEOUT_S
        found = None
        try:
            while time.monotonic() < deadline:
                found = self._state(job_id, check_dir)
                if found is not None and found.state not in IN_FLIGHT:
                    return found
                time.sleep(0.2)
        finally:
            run_client(["scancel", job_id])
        if found is not None and found.state == "PENDING":
            raise BisectPrefetchError(
                f"the Slurm check job {job_id} did not start within {CHECK_TIMEOUT_S:g}s (pending: "
                f"{found.reason or 'no reason given'}), so it was cancelled: nothing was checked")
        raise BisectPrefetchError(
            f"the Slurm check job {job_id} did not end within {CHECK_TIMEOUT_S:g}s "
            f"(Slurm state {found.state if found else 'unknown'}), so it was cancelled")
