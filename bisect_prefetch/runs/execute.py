"""One run from start to journal: plan, environment, launch, live comparison, collect.

The Runner is what the A/A group, the search's oracle and graph discovery
share. A run is identified by its RunKey; when the journal already holds it,
the finished run is returned as it was (reused), never run again.

While a run goes, its metrics (any format) and gradient digests are followed
(metrics/live.py) and compared with the reference run; at the first differing
step the run is decided and stopped (a divergence is conclusive; only a clean
verdict needs the full length).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.experiment import Experiment
from bisect_prefetch.files import write_text_atomic
from bisect_prefetch.metrics.compare import StreamingComparator, compare_trajectories, earliest
from bisect_prefetch.metrics.completeness import (
    ZERO_BASED_HINT,
    missing_data,
    short_series,
    unlike_ranks,
)
from bisect_prefetch.metrics.live import LiveMetrics
from bisect_prefetch.metrics.loading import load_files, load_run, metric_files
from bisect_prefetch.metrics.localize import judge_digests, units_in_graph
from bisect_prefetch.metrics.precision import at_decimals, coarser_decimals
from bisect_prefetch.metrics.trajectory import Trajectory
from bisect_prefetch.runs import envprint
from bisect_prefetch.runs.code_print import code_fingerprint
from bisect_prefetch.runs.executors import Executor, Job, make_executor
from bisect_prefetch.runs.executors.base import LOST
from bisect_prefetch.runs.faults import RANK_LOG_DIR, find_fault
from bisect_prefetch.runs.faults import describe as describe_fault
from bisect_prefetch.runs.first_error import first_error_line
from bisect_prefetch.runs.job_path import ADAPTER_TREE, write_adapter_tree
from bisect_prefetch.runs.launcher import (
    NO_METRICS,
    STATUS_FILE,
    JobSpec,
    check_command,
    free_port,
    job_env,
)
from bisect_prefetch.runs.merge import GRAPH_FILE, merge_graphs, merge_probes, schedule_problems
from bisect_prefetch.runs.plan import PLAN_ENV, PLAN_FILE, build_plan, plan_hash, write_plan
from bisect_prefetch.runs.procs import kill_leftovers
from bisect_prefetch.runs.reuse import ReuseCheck, collect
from bisect_prefetch.runs.signals import run_signals, signal_problems
from bisect_prefetch.runs.step_time import run_step_time_ms, run_step_times_ms
from bisect_prefetch.runs.store import RunKey, StateDir
from bisect_prefetch.runs.workloads import (
    argv_template,
    render_argv,
    render_config,
    runs_in_tool_env,
    workload_env,
)
from bisect_prefetch.search.oracle import RunResult
from bisect_prefetch.vocab import (
    ERROR,
    OK,
    STOPPED_EARLY,
    TIMEOUT,
    TRUNCATED,
    USABLE_OUTCOMES,
    Mask,
)

POLL_S = 0.05  # how often a waiting run asks its executor


@dataclass
class RunOutcome:
    """How one run ended, as journaled. first_diff_step is against its reference.

    The search sees it as a RunResult (`.result()`); the rest is for the journal
    and the reports.
    """

    run_id: str
    outcome: str  # one of vocab.RUN_OUTCOMES
    reason: str
    first_diff_step: int | None = None
    reference: str | None = None  # run id it was compared with
    steps_done: int = 0  # last step the metrics rank reported
    trajectory_hash: str | None = None  # of the steps up to first_diff_step (all, if none)
    wall_s: float | None = None
    first_progress_s: float | None = None  # launch to first metrics line
    exit_code: int | None = None
    problems: list[str] = field(default_factory=list)
    fault: dict[str, Any] | None = None  # runs.faults record of a failed run, if a log names one
    step_time_ms: float | None = None  # median step time after warm-up (runs/step_time.py)
    # [step, ms] of every step after warm-up (the slowest rank's): costs compare runs over
    # the steps they all ran (runs/step_time.compare_runs).
    step_times_ms: list[list[float]] | None = None
    # The machine's 1-minute load average when the run was collected: step times of runs
    # on a differently busy machine are no cost of a mask (runs/step_time.py).
    load_avg: float | None = None
    # Where the digests first differ from the reference: metrics.localize.Localization's JSON.
    localization: dict[str, Any] | None = None
    # What the run measured (runs/signals.py): step boundaries, digests, order, precision.
    signals: dict[str, Any] | None = None
    # The job's own environment, as its ranks saw it (runs/envprint.summary; None: no print).
    environment: dict[str, Any] | None = None
    # What the job read (runs/reuse.collect): the run is reused only while it is the same.
    manifest: dict[str, Any] | None = None
    reused: bool = False

    @property
    def usable(self) -> bool:
        """Only ok and stopped-early runs enter a verdict."""
        return self.outcome in USABLE_OUTCOMES

    @property
    def diverged(self) -> bool:
        return self.first_diff_step is not None

    def why(self) -> str:
        """The reason it ended, with the fault its logs name: for a run's terminal line."""
        return self.reason + (f"; fault {describe_fault(self.fault)}" if self.fault else "")

    def result(self) -> RunResult:
        """What the search sees of this run."""
        if not self.usable:
            return RunResult(outcome=self.outcome, steps=self.steps_done)
        return RunResult(outcome=self.outcome, diverged=self.diverged,
                         first_diff_step=self.first_diff_step, steps=self.steps_done,
                         unit=None if (self.localization or {}).get("rule") == "every-unit"
                         else (self.localization or {}).get("unit"))

    def to_record(self) -> dict[str, Any]:
        record = asdict(self)
        record.pop("reused")
        return record

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> RunOutcome:
        names = {f for f in cls.__dataclass_fields__ if f != "reused"}
        return cls(**{k: v for k, v in record.items() if k in names}, reused=True)


def trajectory_hash(trajectory: Trajectory, *, upto: int | None = None) -> str:
    """sha256 of every rank's values (bits) up to a step: equal hashes, equal numbers."""
    digest = hashlib.sha256()
    for rank, metrics in sorted(trajectory.per_rank.items()):
        for name in sorted(metrics):
            series = metrics[name]
            keep = series.steps <= upto if upto is not None else slice(None)
            digest.update(f"{rank}:{name}:".encode())
            digest.update(np.ascontiguousarray(series.steps[keep], dtype=np.int64).tobytes())
            digest.update(np.ascontiguousarray(series.values[keep], dtype=np.float64).tobytes())
    return digest.hexdigest()[:16]


def last_step(trajectory: Trajectory) -> int:
    steps = [int(s.steps.max()) for s in trajectory.values() if len(s.steps)]
    return max(steps, default=0)


@dataclass
class StartedRun:
    """A run whose job an executor has: what collecting it needs once it ended."""

    key: RunKey
    run_id: str
    run_dir: Path
    job: Job
    reference: str | None
    ref_trajectory: Trajectory | None
    comparator: StreamingComparator | None
    plan_hash: str
    job_id: str = ""


class Runner:
    """Runs of one experiment in one (locked) state dir."""

    def __init__(self, experiment: Experiment, state: StateDir, *,
                 executor: Executor | None = None) -> None:
        self.experiment = experiment
        self.state = state
        self.names = list(experiment.metrics.names)
        self._trajectories: dict[str, Trajectory] = {}
        # Where jobs execute (local slots or Slurm); checked before any run is journaled.
        self.executor: Executor = executor or make_executor(experiment.executor)
        self.executor.check(state.path)
        self.reattached: list[str] = []
        # Told of the first usable run, once (with its run dir): commands say in one line
        # what it measured (runs/signals.py) and what a static graph got wrong.
        self.on_first_usable: Callable[[RunOutcome, Path], None] | None = None
        self._first_said = False
        # An orchestrator killed hard (SIGKILL) leaves its job running; we hold the
        # lock now, so whatever still runs under this state dir is such a leftover.
        # (A Slurm job is not: it is re-attached or scancelled by its journaled id.)
        self.killed_leftovers = [] if self.executor.reattachable else kill_leftovers(
            f"{PLAN_ENV}={state.runs_path}{os.sep}")
        # A program that does not exist fails now, before a run dir is made for it.
        program = argv_template(experiment, steps=experiment.steps)[:1]
        if "{" not in program[0]:
            check_command(program, {**os.environ, **workload_env(experiment), **experiment.env})
        render_config(experiment, steps=experiment.steps)  # a bad override fails now, not in a run
        # What the job runs (its code files, interpreter, packages) is part of every run key:
        # edited code or a new library never reuses runs of the old (runs/code_print.py).
        self.code = code_fingerprint(
            argv_template(experiment, steps=experiment.steps), cwd=Path.cwd(),
            env_path={**os.environ, **experiment.env}.get("PATH"))
        self.reused_finished_at: list[float | None] = []  # runs taken from the journal
        # A journaled run is reused only while what its job read is the same (runs/reuse.py);
        # no_reuse_before (--no-reuse: the command's start): runs journaled before it are
        # never reused. refused: (run id, first reason).
        self.no_reuse_before: float | None = None
        self.reuse_check = ReuseCheck(
            job_env(plan_path=Path(PLAN_FILE), experiment_env=experiment.env,
                    workload_env=workload_env(experiment)), records=state.records(),
            runs_path=state.runs_path)
        self.refused: list[tuple[str, str]] = []
        self.reused_bounded = ""  # said once: a reused run whose manifest hit its bound
        # Whether runs keyed from now on run under stress (adapters/stress.py); a key can
        # also say it itself (the stress calibration of `bisect --stress auto`).
        self.stress = False

    # -- keys -------------------------------------------------------------
    def key(self, purpose: str, *, mask: Iterable[str] | None, guard: str, steps: int,
            index: int, attempt: int = 0, stress: bool | None = None,
            schedule: Iterable[tuple[int, Iterable[str]]] | None = None) -> RunKey:
        """A run's identity; the experiment's fingerprint keeps edited experiments apart.

        stress None: the runner's setting. schedule: several masks by step (RunKey)."""
        return RunKey.of(variant=f"{purpose}+{self.code}@{self.experiment.fingerprint()}", mask=mask,
                         guard=guard, steps=steps, index=index, attempt=attempt,
                         stress=self.stress if stress is None else stress, schedule=schedule)

    # -- trajectories -----------------------------------------------------
    def trajectory(self, run_id: str) -> Trajectory:
        """The metrics of a finished run (read once, then kept)."""
        if run_id not in self._trajectories:
            stopped_early = any(r.get("run_id") == run_id and r.get("outcome") == STOPPED_EARLY
                                for r in self.state.records())
            self._trajectories[run_id] = self._load(self.state.run_dir(run_id),
                                                    stopped_early=stopped_early)
        return self._trajectories[run_id]

    def _metric_files(self, run_dir: Path) -> list[Path]:
        return metric_files(run_dir, self.experiment.metrics.format, self.experiment.metrics.files)

    def _signals(self, run_dir: Path) -> dict[str, Any]:
        m = self.experiment.metrics
        return run_signals(run_dir, metric_files=self._metric_files(run_dir), fmt=m.format,
                           names=self.names, pattern=m.pattern)

    def _load(self, run_dir: Path, *, stopped_early: bool = False) -> Trajectory:
        """The run's metrics. stopped_early: a run stopped at its first differing digest,
        which may have ended before its first metric line; it then has none."""
        m = self.experiment.metrics
        try:
            if m.files:
                files = self._metric_files(run_dir)
                if not files:
                    raise BisectPrefetchError(
                        f"no file matches metrics.files {m.files!r} in {run_dir}")
                return load_files(files, m.format, names=self.names, pattern=m.pattern)
            return load_run(run_dir, m.format, self.names, pattern=m.pattern)
        except BisectPrefetchError:
            if stopped_early:
                return Trajectory({})
            raise

    # -- one run ----------------------------------------------------------
    def run(
        self,
        key: RunKey,
        *,
        label: str,
        reference: str | None = None,
        stop: Callable[[Path], bool] | None = None,
    ) -> RunOutcome:
        """The run with this key: from the journal if it finished before, else launched now.

        reference is the run id to compare with (None: nothing to compare). stop, for a run
        with no reference, is asked about the run dir while the job goes: True stops it
        (stopped-early), as `init` stops its first run after a few metric lines.
        """
        started = self.start(key, label=label, reference=reference, stop=stop)
        if isinstance(started, RunOutcome):
            return started
        try:
            while (outcome := self.poll(started)) is None:
                time.sleep(POLL_S)
        except BaseException:
            self.executor.cancel(started.job_id)  # Ctrl-C, SIGTERM: no job left behind
            raise
        return outcome

    def start(self, key: RunKey, *, label: str, reference: str | None = None,
              stop: Callable[[Path], bool] | None = None) -> RunOutcome | StartedRun:
        """Submit the run with this key to the executor (a free slot is the caller's care).

        A run the journal holds as finished comes back as its RunOutcome; a job a
        previous orchestrator submitted for this key and that Slurm still knows
        is re-attached, never submitted twice.
        """
        found = self.reusable(self.state.find(key))
        if found is not None:
            self.reused_finished_at.append(found.get("finished_at"))
            return self._said(RunOutcome.from_record(found))
        mask = key.mask
        submitted = self.state.submitted(key)
        if submitted is not None and submitted.get("executor") == self.executor.kind:
            run_id = submitted["run_id"]
            started = self._prepare(key, run_id, self.state.run_dir(run_id), mask=mask,
                                    reference=reference, fresh=False)
            if self.executor.attach(submitted["job_id"], started.job):
                started.job_id = submitted["job_id"]
                self.reattached.append(started.job_id)
                return started
        run_id, run_dir = self.state.new_run_dir(label)
        started = self._prepare(key, run_id, run_dir, mask=mask, reference=reference,
                                fresh=True, stop=stop)
        started.job_id = self.executor.submit(started.job)
        if self.executor.reattachable:
            # Journaled before waiting on it: a resumed orchestrator re-attaches to it.
            self.state.append_submitted(key, run_id=run_id, job_id=started.job_id,
                                        executor=self.executor.kind)
        return started

    def reusable(self, record: dict[str, Any] | None) -> dict[str, Any] | None:
        """The journal record if its run may be reused now; a refusal is kept with its reason."""
        if record is None:
            return None
        why = self._why_not(record)
        if why is None:
            manifest = record.get("manifest") or {}
            if manifest.get("opened_truncated") and not self.reused_bounded:
                # Reused on the files it recorded: say that its job opened more.
                self.reused_bounded = (f"run {record.get('run_id')}'s job opened more files than "
                                       f"its manifest keeps ({manifest.get('opened_limit')}): "
                                       "reused on the first ones")
            return record
        if all(run_id != record.get("run_id") for run_id, _ in self.refused):
            self.refused.append((str(record.get("run_id")), why))
        return None

    def reusable_records(self) -> list[dict[str, Any]]:
        """The journal's finished runs that may be reused now; the refusals of this
        experiment's runs (same code and fingerprint) are kept with their reasons."""
        tail = f"+{self.code}@{self.experiment.fingerprint()}"
        return [r for r in self.state.records()
                if (self.reusable(r) if r["variant"].endswith(tail)
                    else self._why_not(r) is None)]

    def _why_not(self, record: dict[str, Any]) -> str | None:
        if self.no_reuse_before is not None and (record.get("finished_at") or 0) < self.no_reuse_before:
            return "--no-reuse"
        return self.reuse_check.why_not(record)

    def poll(self, started: StartedRun) -> RunOutcome | None:
        """None while the run's job goes; once it ended, the run collected and journaled."""
        job = self.executor.poll(started.job_id)
        if job is None:
            return None
        out = RunOutcome(run_id=started.run_id, outcome=job.outcome, reason=job.reason,
                         reference=started.reference, wall_s=round(job.wall_s, 3),
                         first_progress_s=None if job.first_progress_s is None
                         else round(job.first_progress_s, 3),
                         exit_code=job.exit_code)
        self._collect(out, started.run_dir, started.plan_hash, started.key.steps,
                      started.ref_trajectory, started.comparator, schedule=started.key.schedule)
        write_text_atomic(started.run_dir / STATUS_FILE,
                          json.dumps(out.to_record(), indent=1, allow_nan=True) + "\n")
        self.state.append(started.key, out.to_record())
        return self._said(out)

    def _said(self, out: RunOutcome) -> RunOutcome:
        """Tell on_first_usable of the first usable run."""
        if not self._first_said and out.usable and self.on_first_usable is not None:
            self._first_said = True
            self.on_first_usable(out, self.state.run_dir(out.run_id))
        return out

    def close(self) -> None:
        """Cancel jobs in flight, and those a dead orchestrator left that were not re-attached."""
        self.executor.close()
        orphans = [r["job_id"] for r in self.state.unfinished_submissions()
                   if r.get("executor") == self.executor.kind and r["job_id"] not in self.reattached]
        if orphans:
            self.executor.cancel_ids(orphans)

    def _prepare(self, key: RunKey, run_id: str, run_dir: Path, *, mask: Mask | None,
                 reference: str | None, fresh: bool,
                 stop: Callable[[Path], bool] | None = None) -> StartedRun:
        """The job of one run: plan, environment and argv (written when fresh), live hooks."""
        exp, steps = self.experiment, key.steps
        if fresh:
            plan = build_plan(experiment=exp, run_id=run_id, out_dir=run_dir, mask=mask,
                              guard=key.guard, steps=steps, stress=key.stress,
                              schedule=None if key.schedule is None else list(key.schedule))
            plan_path = write_plan(run_dir, plan)
        else:
            plan_path = run_dir / PLAN_FILE
            plan = json.loads(plan_path.read_text())
        # A job in its own environment gets the adapter alone on its path (runs/job_path.py).
        adapter_paths = None if runs_in_tool_env(exp) else [run_dir.resolve() / ADAPTER_TREE]
        if fresh and adapter_paths is not None:
            write_adapter_tree(run_dir)
        env = job_env(plan_path=plan_path, experiment_env=exp.env, workload_env=workload_env(exp),
                      adapter_paths=adapter_paths)
        rank_log_dir = run_dir / RANK_LOG_DIR
        values = {"run_dir": run_dir.resolve(), "port": free_port(),
                  "rank_log_dir": rank_log_dir.resolve(), "steps": steps, "seed": exp.seed}
        if fresh:
            envprint.write_env(run_dir, envprint.fingerprint(env, world_size=exp.world_size()))
            rank_log_dir.mkdir(exist_ok=True)
            config = write_config(exp, run_dir, steps=steps, index=key.index)
            if config is not None:
                values["config"] = config
        argv = render_argv(argv_template(exp, steps=steps), values)

        ref_trajectory = self.trajectory(reference) if reference is not None else None
        comparator = StreamingComparator(ref_trajectory, self.names) if ref_trajectory else None
        ref_dir = self.state.run_dir(reference) if reference is not None else None
        live = LiveMetrics(run_dir, exp.metrics, comparator, reference_dir=ref_dir)
        # A user's command starts where the user started the tool, as if typed there
        # (`python train.py` works); built-in workloads start in their run dir, so
        # whatever a framework drops in its working directory stays with the run.
        cwd = None if exp.workload is not None else Path.cwd()
        spec = JobSpec(argv=argv, run_dir=run_dir, env=env, timeout_s=exp.timeout_s,
                       no_progress_timeout_s=exp.no_progress_timeout_s, cwd=cwd)
        # A run compared with a reference stops at its first difference.
        should_stop = (lambda: live.diverged) if comparator is not None else (
            (lambda: stop(run_dir)) if stop is not None else None)
        return StartedRun(key=key, run_id=run_id, run_dir=run_dir,
                          job=Job(spec=spec, should_stop=should_stop, progress=live.progress),
                          reference=reference, ref_trajectory=ref_trajectory,
                          comparator=comparator, plan_hash=plan_hash(plan))

    def _collect(self, out: RunOutcome, run_dir: Path, expected_hash: str, steps: int,
                 ref: Trajectory | None, comparator: StreamingComparator | None, *,
                 schedule: Sequence[tuple[int, Mask]] | None = None) -> None:
        """Merge the ranks' files, read the metrics, compare; downgrade a bad run.

        A run that ended by itself (any exit code) after some but fewer steps than
        asked is truncated; a failed run gets the fault its logs name, if any. A run of
        several masks whose ranks did not follow its schedule is never evidence.
        """
        _, graph_problems = merge_graphs(run_dir)
        merged, probe_problems = merge_probes(run_dir, expected_hash)
        out.signals = self._signals(run_dir)
        out.environment = envprint.summary(envprint.add_job_print(run_dir))
        out.manifest = collect(run_dir)
        # A job we stopped at its first difference was killed mid-step: its ranks may
        # have counted different numbers of steps without anything being wrong.
        stopped = out.outcome == STOPPED_EARLY
        out.problems = (graph_problems + probe_problems
                        + ([] if stopped else signal_problems(out.signals)))
        out.step_times_ms = run_step_times_ms(run_dir) or None
        out.load_avg = round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None
        out.step_time_ms = run_step_time_ms(run_dir)
        self._read_metrics(out, run_dir, steps, ref, comparator)
        if schedule is not None and out.usable:
            before = out.first_diff_step or out.steps_done + (out.outcome == OK)
            if problems := schedule_problems(merged, schedule, before):
                out.outcome, out.reason = ERROR, "; ".join(problems)
        if out.outcome == ERROR and out.steps_done == 0:
            line = first_error_line(run_dir)  # why it never reached a step
            if line:
                out.reason = f"{out.reason}: {line}"
        if not out.usable:
            out.fault = find_fault(run_dir, exit_code=out.exit_code, reason=out.reason,
                                   killed_by_us=out.outcome == TIMEOUT)

    def _read_metrics(self, out: RunOutcome, run_dir: Path, steps: int,
                      ref: Trajectory | None, comparator: StreamingComparator | None) -> None:
        try:
            # A run stopped before its first metric line: its digests decide (judged below).
            trajectory = self._load(run_dir,
                                    stopped_early=out.outcome == STOPPED_EARLY and ref is not None)
        except BisectPrefetchError as exc:
            if out.usable or out.reason == NO_METRICS:  # the reader says what it missed
                out.outcome, out.reason = ERROR, f"missing metrics: {exc}"
            return
        out.steps_done = last_step(trajectory)
        # A job the scheduler took away (executors.base.LOST) did not end by itself.
        ended_by_itself = (out.outcome in (OK, ERROR) and not out.problems
                           and not out.reason.startswith(f"{LOST}: "))
        if ended_by_itself and 0 < out.steps_done < steps:
            how = "" if out.exit_code == 0 else f", {out.reason}"
            out.outcome, out.reason = TRUNCATED, f"stopped at step {out.steps_done} of {steps}{how}"
            if ZERO_BASED_HINT in (short := short_series(trajectory, self.names, steps) or ""):
                out.reason += f": {short}"  # the hint why a whole log is one step short
        if not out.usable:
            return
        self._trajectories[out.run_id] = trajectory
        if ref is not None:
            # The metrics decide from the files as they are now, the same numbers the live
            # comparison read; a live difference only stopped the run. Digests: both.
            # Runs that printed a metric at different precisions are compared at the coarser
            # one (the signals line says the precision the comparison holds at).
            coarse = coarser_decimals(self._precision(out.reference), (out.signals or {}).get(
                "precision") or {})
            if coarse:
                out.signals = {**(out.signals or {}), "compared_at_decimals": coarse}
            found = earliest(compare_trajectories(
                at_decimals(ref, coarse) if coarse else ref,
                at_decimals(trajectory, coarse) if coarse else trajectory, self.names))
            live_step = comparator.first_digest_diff_step if comparator is not None else None
            candidates = [s for s in (found[0] if found else None, live_step) if s is not None]
            out.first_diff_step = min(candidates, default=None)
            out.problems += self.judge_digests(out, out.reference)
        if out.first_diff_step is None:
            self._check_complete(out, trajectory, steps, ref)
        out.trajectory_hash = trajectory_hash(trajectory, upto=out.first_diff_step)
        if out.problems:
            out.outcome, out.reason = ERROR, "; ".join(out.problems)

    def _precision(self, run_id: str | None) -> dict[str, Any]:
        """The precision a finished run printed its metrics at (its journaled signals)."""
        for record in self.state.records():
            if record.get("run_id") == run_id:
                return (record.get("signals") or {}).get("precision") or {}
        return {}

    def _check_complete(self, out: RunOutcome, trajectory: Trajectory, steps: int,
                        ref: Trajectory | None) -> None:
        """A run that shows no difference counts only with every metric, step and rank."""
        if short := short_series(trajectory, self.names, steps):
            # A run stopped at a live difference the full comparison does not confirm
            # is no evidence either way.
            why = "" if out.outcome == OK else "stopped early, no difference found; "
            out.outcome = TRUNCATED if out.outcome == OK else ERROR
            out.reason = f"{why}{short}"
            self._trajectories.pop(out.run_id, None)
            return
        problems = [p for p in (missing_data(trajectory, self.names, steps),
                                unlike_ranks(ref, trajectory, self.names) if ref else None) if p]
        if problems:
            out.problems.append("incomplete metrics: " + "; ".join(problems))

    def judge_digests(self, out: RunOutcome, reference: str | None) -> list[str]:
        """A run's digests against a reference run's: an earlier first difference, and where.

        Updates out's first_diff_step and localization. Returns the digest problems (a cut
        file, a silent rank, other parameters) when the run showed no difference: then its
        digests cannot vouch for it, and it must not count as consistent.
        """
        if reference is None:
            return []
        workload = self.experiment.workload
        run_dir = self.state.run_dir(out.run_id)
        verdict = judge_digests(self.state.run_dir(reference), run_dir,
                                units=units_in_graph(run_dir / GRAPH_FILE),
                                ranks=workload.world_size if workload is not None else None,
                                metric_first_diff=out.first_diff_step,
                                labels=(f"reference {reference}", f"run {out.run_id}"))
        if verdict is None:
            return []
        steps = [s for s in (out.first_diff_step, verdict.first_diff_step) if s is not None]
        out.first_diff_step = min(steps, default=None)
        if verdict.localization is not None:
            out.localization = verdict.localization.to_json()
        return verdict.problems if out.first_diff_step is None else []


def write_config(experiment: Experiment, run_dir: Path, *, steps: int, index: int = 0) -> Path | None:
    """Copy the experiment's config into the run dir, overrides applied; its path is {config}."""
    rendered = render_config(experiment, steps=steps, index=index)
    if rendered is None:
        return None
    source, text = rendered
    target = run_dir / source.name
    write_text_atomic(target, text)
    return target.resolve()
