"""One run from start to journal: plan, environment, launch, live comparison, collect.

The Runner is what the A/A group, the search's oracle and graph discovery
share. A run is identified by its RunKey; when the journal already holds it,
the finished run is returned as it was (reused), never run again.

While a run goes, its metrics.jsonl is followed line by line and compared
with the reference trajectory; at the first differing step the run is
decided and stopped (a divergence is conclusive; only a clean verdict needs
the full length).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.experiment import Experiment, apply_overrides
from bisect_prefetch.metrics.compare import StreamingComparator, compare_trajectories, earliest
from bisect_prefetch.metrics.parsers import Trajectory, load_files, load_run
from bisect_prefetch.runs import envprint
from bisect_prefetch.runs.atomic import write_text_atomic
from bisect_prefetch.runs.launcher import (
    STATUS_FILE,
    JobSpec,
    check_command,
    free_port,
    job_env,
    run_job,
)
from bisect_prefetch.runs.merge import merge_graphs, merge_probes
from bisect_prefetch.runs.plan import PLAN_ENV, build_plan, plan_hash, write_plan
from bisect_prefetch.runs.procs import kill_leftovers
from bisect_prefetch.runs.store import RunKey, StateDir
from bisect_prefetch.runs.tail import LineFollower
from bisect_prefetch.runs.workloads import argv_template, render_argv, workload_env

USABLE = ("ok", "stopped-early")
RANK_LOG_DIR = "rank_logs"


@dataclass
class RunOutcome:
    """How one run ended, as journaled. first_diff_step is against its reference."""

    run_id: str
    outcome: str  # ok | error | timeout | stopped-early
    reason: str
    first_diff_step: int | None = None
    reference: str | None = None  # run id it was compared with
    steps_done: int = 0  # last step the metrics rank reported
    trajectory_hash: str | None = None  # of the steps up to first_diff_step (all, if none)
    wall_s: float | None = None
    first_progress_s: float | None = None  # launch to first metrics line
    exit_code: int | None = None
    problems: list[str] = field(default_factory=list)
    reused: bool = False

    @property
    def usable(self) -> bool:
        """Only ok and stopped-early runs enter a verdict."""
        return self.outcome in USABLE

    @property
    def diverged(self) -> bool:
        return self.first_diff_step is not None

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


class Runner:
    """Runs of one experiment in one (locked) state dir."""

    def __init__(self, experiment: Experiment, state: StateDir) -> None:
        self.experiment = experiment
        self.state = state
        self.names = list(experiment.metrics.names)
        self._trajectories: dict[str, Trajectory] = {}
        # An orchestrator killed hard (SIGKILL) leaves its job running; we hold the
        # lock now, so whatever still runs under this state dir is such a leftover.
        self.killed_leftovers = kill_leftovers(f"{PLAN_ENV}={state.runs_path}{os.sep}")
        # A program that does not exist fails now, before a run dir is made for it.
        program = argv_template(experiment, steps=experiment.steps)[:1]
        if "{" not in program[0]:
            check_command(program, {**os.environ, **workload_env(experiment), **experiment.env})

    # -- keys -------------------------------------------------------------
    def key(self, purpose: str, *, mask: Iterable[str] | None, guard: str, steps: int,
            index: int, attempt: int = 0) -> RunKey:
        """A run's identity; the experiment's fingerprint keeps edited experiments apart."""
        return RunKey.of(variant=f"{purpose}@{self.experiment.fingerprint()}", mask=mask,
                         guard=guard, steps=steps, index=index, attempt=attempt)

    # -- trajectories -----------------------------------------------------
    def trajectory(self, run_id: str) -> Trajectory:
        """The metrics of a finished run (read once, then kept)."""
        if run_id not in self._trajectories:
            self._trajectories[run_id] = self._load(self.state.run_dir(run_id))
        return self._trajectories[run_id]

    def _load(self, run_dir: Path) -> Trajectory:
        m = self.experiment.metrics
        if m.files:
            files = sorted(p for p in run_dir.glob(m.files) if p.is_file())
            if not files:
                raise BisectPrefetchError(f"no file matches metrics.files {m.files!r} in {run_dir}")
            return load_files(files, m.format, names=self.names, pattern=m.pattern)
        return load_run(run_dir, m.format, self.names, pattern=m.pattern)

    # -- one run ----------------------------------------------------------
    def run(
        self,
        key: RunKey,
        *,
        label: str,
        reference: str | None = None,
        stop_on_diff: bool = True,
    ) -> RunOutcome:
        """The run with this key: from the journal if it finished before, else launched now.

        reference is the run id to compare with (None: nothing to compare).
        """
        found = self.state.find(key)
        if found is not None:
            return RunOutcome.from_record(found)
        mask = None if key.mask is None else frozenset(key.mask)
        run_id, run_dir = self.state.new_run_dir(label)
        outcome = self._launch(run_id, run_dir, mask=mask, guard=key.guard, steps=key.steps,
                               reference=reference, stop_on_diff=stop_on_diff)
        write_text_atomic(run_dir / STATUS_FILE,
                          json.dumps(outcome.to_record(), indent=1, allow_nan=True) + "\n")
        self.state.append(key, outcome.to_record())
        return outcome

    def _launch(self, run_id: str, run_dir: Path, *, mask: frozenset[str] | None, guard: str,
                steps: int, reference: str | None, stop_on_diff: bool) -> RunOutcome:
        exp = self.experiment
        plan = build_plan(experiment=exp, run_id=run_id, out_dir=run_dir, mask=mask, guard=guard,
                          steps=steps)
        plan_path = write_plan(run_dir, plan)
        env = job_env(plan_path=plan_path, experiment_env=exp.env, workload_env=workload_env(exp))
        envprint.write_env(run_dir, envprint.fingerprint(env, world_size=exp.world_size()))
        rank_log_dir = run_dir / RANK_LOG_DIR
        rank_log_dir.mkdir(exist_ok=True)
        values = {"run_dir": run_dir.resolve(), "port": free_port(),
                  "rank_log_dir": rank_log_dir.resolve(), "steps": steps, "seed": exp.seed}
        config = write_config(exp, run_dir)
        if config is not None:
            values["config"] = config
        argv = render_argv(argv_template(exp, steps=steps), values)

        ref_trajectory = self.trajectory(reference) if reference is not None else None
        comparator = StreamingComparator(ref_trajectory, self.names) if ref_trajectory else None
        live = LiveMetrics(run_dir, exp, comparator)
        # A user's command starts where the user started the tool, as if typed there
        # (`python train.py` works); built-in workloads start in their run dir, so
        # whatever a framework drops in its working directory stays with the run.
        cwd = None if exp.workload is not None else Path.cwd()
        spec = JobSpec(argv=argv, run_dir=run_dir, env=env, timeout_s=exp.timeout_s,
                       no_progress_timeout_s=exp.no_progress_timeout_s, cwd=cwd)
        should_stop = (lambda: live.diverged) if comparator is not None and stop_on_diff else None
        job = run_job(spec, should_stop=should_stop, progress=live.progress)

        out = RunOutcome(run_id=run_id, outcome=job.outcome, reason=job.reason,
                         reference=reference, wall_s=round(job.wall_s, 3),
                         first_progress_s=None if job.first_progress_s is None
                         else round(job.first_progress_s, 3),
                         exit_code=job.exit_code)
        self._collect(out, run_dir, plan_hash(plan), steps, ref_trajectory, comparator)
        return out

    def _collect(self, out: RunOutcome, run_dir: Path, expected_hash: str, steps: int,
                 ref: Trajectory | None, comparator: StreamingComparator | None) -> None:
        """Merge the ranks' files, read the metrics, compare; downgrade a bad run to error."""
        _, graph_problems = merge_graphs(run_dir)
        _, probe_problems = merge_probes(run_dir, expected_hash)
        out.problems = graph_problems + probe_problems
        if not out.usable:
            return
        try:
            trajectory = self._load(run_dir)
        except BisectPrefetchError as exc:
            out.outcome, out.reason = "error", f"missing metrics: {exc}"
            return
        self._trajectories[out.run_id] = trajectory
        out.steps_done = last_step(trajectory)
        if ref is not None:
            found = earliest(compare_trajectories(ref, trajectory, self.names))
            live_step = comparator.first_diff_step if comparator is not None else None
            candidates = [s for s in (found[0] if found else None, live_step) if s is not None]
            out.first_diff_step = min(candidates, default=None)
        out.trajectory_hash = trajectory_hash(trajectory, upto=out.first_diff_step)
        if out.problems:
            out.outcome, out.reason = "error", "; ".join(out.problems)
        elif out.outcome == "ok" and self.experiment.workload is not None and out.steps_done < steps:
            out.outcome, out.reason = "error", f"stopped at step {out.steps_done} of {steps}"


class LiveMetrics:
    """Progress and the live comparison of a running job, polled by the launcher."""

    def __init__(self, run_dir: Path, experiment: Experiment,
                 comparator: StreamingComparator | None) -> None:
        self.comparator = comparator
        m = experiment.metrics
        self.jsonl = m.format == "jsonl" and m.files in (None, "metrics.jsonl")
        self.follower = LineFollower(run_dir / "metrics.jsonl") if self.jsonl else None
        self.run_dir = run_dir
        self.glob = m.default_files()

    @property
    def diverged(self) -> bool:
        return self.comparator is not None and self.comparator.diverged

    def progress(self) -> int:
        """Metrics lines so far (jsonl), else the size of the metrics files."""
        if self.follower is None:
            return sum(p.stat().st_size for p in self.run_dir.glob(self.glob) if p.is_file())
        for line in self.follower.new_lines():
            if self.comparator is not None:
                self.comparator.feed_line(line)
        return self.follower.lines


def write_config(experiment: Experiment, run_dir: Path) -> Path | None:
    """Copy the experiment's config into the run dir, overrides applied; its path is {config}."""
    source = experiment.config_path()
    if source is None:
        return None
    try:
        text = source.read_text()
    except OSError as exc:
        raise BisectPrefetchError(f"cannot read config {source}: {exc.strerror}") from None
    target = run_dir / source.name
    if experiment.overrides:
        is_json = source.suffix.lower() == ".json"
        if not is_json and source.suffix.lower() not in (".yaml", ".yml"):
            raise BisectPrefetchError(f"overrides apply to YAML or JSON configs, not {source.name}")
        try:
            data = json.loads(text) if is_json else yaml.safe_load(text)
        except (ValueError, yaml.YAMLError) as exc:
            raise BisectPrefetchError(f"config {source} cannot be read: {exc}") from None
        if not isinstance(data, dict):
            raise BisectPrefetchError(f"config {source} is not a mapping: cannot apply overrides")
        data = apply_overrides(data, experiment.overrides)
        text = json.dumps(data, indent=1) if is_json else yaml.safe_dump(data, sort_keys=False)
    write_text_atomic(target, text)
    return target.resolve()
