"""One run from start to journal: plan, environment, launch, live comparison.

The Runner is what the A/A group, the search's oracle and graph discovery
share. A run is identified by its RunKey; when the journal already holds it and
the command's scope takes it (runs/sessions.py: the runs it made itself; with
--resume its session's, with --reuse any earlier command's, after the checks of
runs/reuse.py), the finished run is returned as it was (reused), never run again.
A finished run is judged (its files turned into a verdict) by runs/run_judge.py.

While a run goes, its metrics (any format) and gradient digests are followed
(metrics/live.py) and compared with the reference run; at the first differing
step the run is decided and stopped (a divergence is conclusive; only a clean
verdict needs the full length).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bisect_prefetch.experiment import Experiment
from bisect_prefetch.files import write_text_atomic
from bisect_prefetch.judge.faults import RANK_LOG_DIR
from bisect_prefetch.metrics.compare import StreamingComparator
from bisect_prefetch.metrics.live import LiveMetrics
from bisect_prefetch.metrics.trajectory import Trajectory
from bisect_prefetch.runs import envprint
from bisect_prefetch.runs.code_print import code_fingerprint
from bisect_prefetch.runs.executors import Executor, Job, make_executor
from bisect_prefetch.runs.job_path import ADAPTER_TREE, write_adapter_tree
from bisect_prefetch.runs.launcher import (
    STATUS_FILE,
    JobSpec,
    check_command,
    free_port,
    job_env,
    user_env,
)
from bisect_prefetch.runs.outcome import RunOutcome
from bisect_prefetch.runs.plan import PLAN_ENV, PLAN_FILE, build_plan, plan_hash, write_plan
from bisect_prefetch.runs.procs import kill_leftovers
from bisect_prefetch.runs.reuse import ReuseCheck
from bisect_prefetch.runs.run_judge import RunJudge
from bisect_prefetch.runs.sessions import NOT_IN_SCOPE, Scope
from bisect_prefetch.runs.store import RunKey, StateDir
from bisect_prefetch.runs.workloads import (
    argv_template,
    render_argv,
    render_config,
    runs_in_tool_env,
    workload_env,
)
from bisect_prefetch.vocab import USABLE_OUTCOMES, Mask

POLL_S = 0.05  # how often a waiting run asks its executor


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
    """Runs of one experiment in one (locked) state dir.

    Making one does nothing but hold what it is given; `open()` does the checks and
    the work a first run needs (and may fail), before any run is keyed or started.
    """

    def __init__(self, experiment: Experiment, state: StateDir, *,
                 executor: Executor | None = None, scope: Scope | None = None) -> None:
        self.experiment = experiment
        self.state = state
        workload = experiment.workload
        self.judge = RunJudge(state, experiment.metrics,
                              ranks=workload.world_size if workload is not None else None,
                              digest_every=experiment.record.every)
        # Where jobs execute (local slots or Slurm); checked by open(), before any run is journaled.
        self.executor: Executor = executor or make_executor(experiment.executor)
        self.reattached: list[str] = []
        # Told of the first usable run, once (with its run dir): commands say in one line
        # what it measured (judge/signals.py) and what a static graph got wrong.
        self.on_first_usable: Callable[[RunOutcome, Path], None] | None = None
        self._first_said = False
        self.killed_leftovers: list[int] = []  # pids open() stopped
        self.code: str | None = None  # what the job runs (open(): runs/code_print.py)
        # Which journaled runs may be taken (runs/sessions.py; default: only those this
        # runner made), decided by open(); those it made; the earlier ones it took (when
        # each finished); refused: (run id, first reason) of earlier ones it ran again.
        self.scope = scope or Scope("runner")
        self.made: set[str] = set()
        self.reused: dict[str, float | None] = {}  # run id -> finished_at
        self.launched_ids: list[str] = []  # runs this runner submitted (re-attached ones not)
        self.reuse_check: ReuseCheck | None = None  # open()
        self.refused: list[tuple[str, str]] = []
        # Whether runs keyed from now on run under stress (adapters/stress.py); a key can
        # also say it itself (the stress calibration of `bisect --stress auto`).
        self.stress = False
        # The graph's edge ids, once known (runs/discover.py): a run whose mask switches
        # one off must show that its mask was applied (judge/merge.mask_not_applied).
        self.graph_edges: frozenset[str] = frozenset()

    def open(self) -> Runner:
        """Check that runs can start and learn what they run; returns the runner.

        In order: the executor can run jobs; leftovers of a killed orchestrator stopped;
        the program exists and the config's overrides apply; the job's code fingerprinted.
        """
        experiment, state = self.experiment, self.state
        self.executor.check(state.path)
        # An orchestrator killed hard (SIGKILL) leaves its job running; we hold the
        # lock now, so whatever still runs under this state dir is such a leftover.
        # (A Slurm job is not: it is re-attached or scancelled by its journaled id.)
        if not self.executor.reattachable:
            self.killed_leftovers = kill_leftovers(f"{PLAN_ENV}={state.runs_path}{os.sep}")
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
        records = state.records()
        # A command killed before its first run finished left only its submissions (Slurm):
        # --resume continues it too, re-attaching to them.
        self.scope.decide(records + state.unfinished_submissions(),
                          fingerprint=experiment.fingerprint())
        # What a run would start with now: each earlier run is checked against it, and
        # every run this runner journals keeps it (runs/launch_env.py).
        self.reuse_check = ReuseCheck(
            user_env(experiment_env=experiment.env, workload_env=workload_env(experiment)),
            cwd=self._job_cwd(), records=records, runs_path=state.runs_path,
            admit=self.scope.admits)
        return self

    def _job_cwd(self) -> Path | None:
        """A user's command starts where the user started the tool, as if typed there
        (`python train.py` works); built-in workloads start in their run dir (None), so
        whatever a framework drops in its working directory stays with the run."""
        return None if self.experiment.workload is not None else Path.cwd()

    def _opened(self) -> tuple[str, ReuseCheck]:
        if self.code is None or self.reuse_check is None:
            raise RuntimeError("Runner.open() must be called before its first run")
        return self.code, self.reuse_check

    # -- keys -------------------------------------------------------------
    def key(self, purpose: str, *, mask: Iterable[str] | None, guard: str, steps: int,
            index: int, attempt: int = 0, stress: bool | None = None,
            schedule: Iterable[tuple[int, Iterable[str]]] | None = None) -> RunKey:
        """A run's identity; the experiment's fingerprint keeps edited experiments apart.

        stress None: the runner's setting. schedule: several masks by step (RunKey)."""
        code, _ = self._opened()
        return RunKey.of(variant=f"{purpose}+{code}@{self.experiment.fingerprint()}", mask=mask,
                         guard=guard, steps=steps, index=index, attempt=attempt,
                         stress=self.stress if stress is None else stress, schedule=schedule)

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
        found = self._taken(key)
        if found is not None:
            if found.get("run_id") not in self.made:
                self.reused[str(found.get("run_id"))] = found.get("finished_at")
            return self._said(RunOutcome.from_record(found))
        mask = key.mask
        submitted = self.state.submitted(key)
        if (submitted is not None and submitted.get("executor") == self.executor.kind
                and self.scope.admits(submitted) is None):
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
        self.launched_ids.append(run_id)
        if self.executor.reattachable:
            # Journaled before waiting on it: a resumed orchestrator re-attaches to it.
            self.state.append_submitted(key, run_id=run_id, job_id=started.job_id,
                                        executor=self.executor.kind, session=self.scope.session)
        return started

    def holds(self, key: RunKey) -> dict[str, Any] | None:
        """The journal record a run of this key would be taken from (None: it would run):
        for a command's narration ("discovering..." only before a run) and its reading of
        a run it made or took."""
        return self._taken(key, say=False)

    def _taken(self, key: RunKey, *, say: bool = True) -> dict[str, Any] | None:
        """The finished run of this key to take instead of running it, if any: one this
        runner made (if usable), else the latest earlier one the scope and the checks allow.
        Where none is, the first reason is kept (say): a check's over the scope's."""
        refusals = []
        for record in self.state.find_all(key):
            if record.get("run_id") in self.made:
                if record.get("outcome") in USABLE_OUTCOMES:
                    return record
                continue  # a failed run of its own runs again (as a retry would)
            why = self._why_not(record)
            if why is None:
                return record
            refusals.append((record, why))
        if refusals and say:
            record, why = next(((r, w) for r, w in refusals if w != NOT_IN_SCOPE), refusals[0])
            self._refuse(record, why)
        return None

    def reusable(self, record: dict[str, Any] | None) -> dict[str, Any] | None:
        """The journal record if its run may be taken now; a refusal is kept with its reason."""
        if record is None:
            return None
        if record.get("run_id") in self.made:
            return record if record.get("outcome") in USABLE_OUTCOMES else None
        why = self._why_not(record)
        if why is None:
            return record
        self._refuse(record, why)
        return None

    def _refuse(self, record: dict[str, Any], why: str) -> None:
        if all(run_id != record.get("run_id") for run_id, _ in self.refused):
            self.refused.append((str(record.get("run_id")), why))

    def reusable_records(self) -> list[dict[str, Any]]:
        """The journal's finished runs that may be reused now; the refusals of this
        experiment's runs (same code and fingerprint) are kept with their reasons."""
        code, _ = self._opened()
        tail = f"+{code}@{self.experiment.fingerprint()}"
        return [r for r in self.state.records()
                if (self.reusable(r) if r["variant"].endswith(tail)
                    else self._why_not(r) is None)]

    def _why_not(self, record: dict[str, Any]) -> str | None:
        if record.get("run_id") in self.made:
            return None if record.get("outcome") in USABLE_OUTCOMES else "it failed"
        return self._opened()[1].why_not(record)

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
        self.judge.collect(out, started.run_dir, plan_hash=started.plan_hash,
                           steps=started.key.steps, reference=started.ref_trajectory,
                           comparator=started.comparator, schedule=started.key.schedule,
                           masks_off=self.masks_edges_off(started.key))
        out.launched = self._opened()[1].launched
        out.session = self.scope.session
        write_text_atomic(started.run_dir / STATUS_FILE,
                          json.dumps(out.to_record(), indent=1, allow_nan=True) + "\n")
        self.state.append(started.key, out.to_record())
        self.made.add(out.run_id)
        return self._said(out)

    def masks_edges_off(self, key: RunKey) -> bool:
        """Whether the run's mask (any segment's) switches off an edge of the graph."""
        if key.schedule is not None:
            masks = [mask for _, mask in key.schedule]
        else:
            masks = [] if key.mask is None else [key.mask]  # None: change nothing
        return any(self.graph_edges - mask for mask in masks)

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

        ref_trajectory = self.judge.trajectory(reference) if reference is not None else None
        comparator = (StreamingComparator(ref_trajectory, self.judge.names)
                      if ref_trajectory else None)
        ref_dir = self.state.run_dir(reference) if reference is not None else None
        live = LiveMetrics(run_dir, exp.metrics, comparator, reference_dir=ref_dir)
        spec = JobSpec(argv=argv, run_dir=run_dir, env=env, timeout_s=exp.timeout_s,
                       no_progress_timeout_s=exp.no_progress_timeout_s, cwd=self._job_cwd())
        # A run compared with a reference stops at its first difference.
        should_stop = (lambda: live.diverged) if comparator is not None else (
            (lambda: stop(run_dir)) if stop is not None else None)
        return StartedRun(key=key, run_id=run_id, run_dir=run_dir,
                          job=Job(spec=spec, should_stop=should_stop, progress=live.progress),
                          reference=reference, ref_trajectory=ref_trajectory,
                          comparator=comparator, plan_hash=plan_hash(plan))


def write_config(experiment: Experiment, run_dir: Path, *, steps: int, index: int = 0) -> Path | None:
    """Copy the experiment's config into the run dir, overrides applied; its path is {config}."""
    rendered = render_config(experiment, steps=steps, index=index)
    if rendered is None:
        return None
    source, text = rendered
    target = run_dir / source.name
    write_text_atomic(target, text)
    return target.resolve()
