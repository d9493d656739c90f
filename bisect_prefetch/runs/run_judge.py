"""The judging of a finished run: its files turned into a verdict.

Once a run's job ended, its ranks' files are merged (graph, probe), its metrics read
and compared with its reference run's, its gradient digests judged (the first
differing step, and where: metrics/localize.py) and its completeness checked. A run
that cannot vouch for itself is downgraded (truncated, error); a failed run gets
the fault its logs name. Everything found lands in the run's RunOutcome.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.experiment import Metrics
from bisect_prefetch.judge.faults import find_fault
from bisect_prefetch.judge.first_error import adapter_refusal, first_error_line
from bisect_prefetch.judge.merge import (
    GRAPH_FILE,
    mask_not_applied,
    merge_graphs,
    merge_probes,
    schedule_problems,
)
from bisect_prefetch.judge.signals import digest_gaps, run_signals, signal_problems
from bisect_prefetch.judge.step_time import run_step_time_ms, run_step_times_ms
from bisect_prefetch.metrics.compare import StreamingComparator, compare_trajectories, earliest
from bisect_prefetch.metrics.completeness import (
    ZERO_BASED_HINT,
    missing_data,
    short_series,
    unlike_ranks,
)
from bisect_prefetch.metrics.loading import load_files, load_run, metric_files
from bisect_prefetch.metrics.localize import judge_digests, units_in_graph
from bisect_prefetch.metrics.precision import at_decimals, coarser_decimals
from bisect_prefetch.metrics.trajectory import Trajectory
from bisect_prefetch.runs import envprint
from bisect_prefetch.runs.executors.base import LOST
from bisect_prefetch.runs.launcher import NO_METRICS
from bisect_prefetch.runs.outcome import RunOutcome
from bisect_prefetch.runs.reuse import collect
from bisect_prefetch.runs.store import StateDir
from bisect_prefetch.vocab import ERROR, OK, STOPPED_EARLY, TIMEOUT, TRUNCATED, Mask


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


class RunJudge:
    """Judges the finished runs of one state dir; keeps the metrics it read of each.

    metrics: the experiment's metrics section (which files, which format, which names);
    ranks: the ranks a built-in workload runs (None: a command's, not known beforehand);
    digest_every: the adapter digests every N-th step (record.every).
    """

    def __init__(self, state: StateDir, metrics: Metrics, *, ranks: int | None,
                 digest_every: int = 1) -> None:
        self.state = state
        self.metrics = metrics
        self.names = list(metrics.names)
        self.ranks = ranks
        self.digest_every = digest_every
        self._trajectories: dict[str, Trajectory] = {}

    # -- a finished run's metrics -------------------------------------------
    def trajectory(self, run_id: str) -> Trajectory:
        """The metrics of a finished run (read once, then kept)."""
        if run_id not in self._trajectories:
            stopped_early = any(r.get("run_id") == run_id and r.get("outcome") == STOPPED_EARLY
                                for r in self.state.records())
            self._trajectories[run_id] = self.load(self.state.run_dir(run_id),
                                                   stopped_early=stopped_early)
        return self._trajectories[run_id]

    def _metric_files(self, run_dir: Path) -> list[Path]:
        return metric_files(run_dir, self.metrics.format, self.metrics.files)

    def load(self, run_dir: Path, *, stopped_early: bool = False) -> Trajectory:
        """The run's metrics. stopped_early: a run stopped at its first differing digest,
        which may have ended before its first metric line; it then has none."""
        m = self.metrics
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

    # -- the verdict on one run ---------------------------------------------
    def collect(self, out: RunOutcome, run_dir: Path, *, plan_hash: str, steps: int,
                reference: Trajectory | None, comparator: StreamingComparator | None,
                schedule: Sequence[tuple[int, Mask]] | None = None,
                masks_off: bool = False) -> None:
        """Merge the ranks' files, read the metrics, compare; downgrade a bad run.

        A run that ended by itself (any exit code) after some but fewer steps than
        asked is truncated; a failed run gets the fault its logs name, if any. A run of
        several masks whose ranks did not follow its schedule is never evidence, nor is a
        run whose mask switches an edge off (masks_off) while nothing shows it was applied
        (judge/merge.py). A run whose in-job adapter refused the job's engine is an error
        whose reason is the adapter's own line.
        """
        _, graph_problems = merge_graphs(run_dir)
        merged, probe_problems = merge_probes(run_dir, plan_hash)
        m = self.metrics
        out.signals = run_signals(run_dir, metric_files=self._metric_files(run_dir), fmt=m.format,
                                  names=self.names, pattern=m.pattern)
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
        self._read_metrics(out, run_dir, steps, reference, comparator)
        if schedule is not None and out.usable:
            before = out.first_diff_step or out.steps_done + (out.outcome == OK)
            if problems := schedule_problems(merged, schedule, before):
                out.outcome, out.reason = ERROR, "; ".join(problems)
        if masks_off and out.usable and (why := mask_not_applied(merged, run_dir)):
            out.outcome, out.reason = ERROR, why
        if out.outcome == ERROR and out.steps_done == 0:
            line = first_error_line(run_dir)  # why it never reached a step
            if line:
                out.reason = f"{out.reason}: {line}"
        refused = adapter_refusal(run_dir, merged, read_logs=not out.usable or merged is None)
        if refused is not None:  # the adapter's own line: the version, what it lacks
            out.outcome, out.reason = ERROR, refused
        elif not out.usable:  # (a refused job's launcher kills its other ranks: no fault)
            out.fault = find_fault(run_dir, exit_code=out.exit_code, reason=out.reason,
                                   killed_by_us=out.outcome == TIMEOUT)

    def _read_metrics(self, out: RunOutcome, run_dir: Path, steps: int,
                      ref: Trajectory | None, comparator: StreamingComparator | None) -> None:
        try:
            # A run stopped before its first metric line: its digests decide (judged below).
            trajectory = self.load(run_dir,
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
            self._compare(out, trajectory, ref, comparator)
        if out.first_diff_step is None:
            self._check_complete(out, trajectory, steps, ref)
            if out.usable:  # digests that stop early vouch for none of the later steps
                out.problems += [f"incomplete digests: {gap}" for gap in digest_gaps(
                    out.signals, steps_done=out.steps_done, every=self.digest_every)]
        out.trajectory_hash = trajectory_hash(trajectory, upto=out.first_diff_step)
        if out.problems:
            out.outcome, out.reason = ERROR, "; ".join(out.problems)

    def _compare(self, out: RunOutcome, trajectory: Trajectory, ref: Trajectory,
                 comparator: StreamingComparator | None) -> None:
        """The run's first differing step against its reference: metrics and digests.

        The metrics decide from the files as they are now, the same numbers the live
        comparison read; a live difference only stopped the run. Digests: both. Runs that
        printed a metric at different precisions are compared at the coarser one (the
        signals line says the precision the comparison holds at)."""
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
        out.problems += self.digests(out, out.reference)

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

    def digests(self, out: RunOutcome, reference: str | None) -> list[str]:
        """A run's digests against a reference run's: an earlier first difference, and where.

        Updates out's first_diff_step and localization. Returns the digest problems (a cut
        file, a silent rank, other parameters) when the run showed no difference: then its
        digests cannot vouch for it, and it must not count as clean.
        """
        if reference is None:
            return []
        run_dir = self.state.run_dir(out.run_id)
        verdict = judge_digests(self.state.run_dir(reference), run_dir,
                                units=units_in_graph(run_dir / GRAPH_FILE), ranks=self.ranks,
                                metric_first_diff=out.first_diff_step,
                                labels=(f"reference {reference}", f"run {out.run_id}"))
        if verdict is None:
            return []
        steps = [s for s in (out.first_diff_step, verdict.first_diff_step) if s is not None]
        out.first_diff_step = min(steps, default=None)
        if verdict.localization is not None:
            out.localization = verdict.localization.to_json()
        return verdict.problems if out.first_diff_step is None else []
