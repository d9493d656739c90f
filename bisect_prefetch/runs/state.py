"""The start of every command that runs jobs, written once.

Open the experiment's state dir and take its lock, say what was repaired (a
journal line torn by a kill) and which leftovers of a killed orchestrator
were stopped, and find the prefetch graph (static, or learned by one short
recorded run that the journal keeps).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from bisect_prefetch.experiment import Experiment
from bisect_prefetch.graph import PrefetchGraph
from bisect_prefetch.judge.signals import describe_signals
from bisect_prefetch.runs.discover import discover_graph, static_mismatch
from bisect_prefetch.runs.execute import Runner
from bisect_prefetch.runs.executors import with_executor
from bisect_prefetch.runs.reuse import CHECKED, UNSEEN
from bisect_prefetch.runs.sessions import Scope
from bisect_prefetch.runs.store import StateDir


@dataclass
class OpenState:
    """A locked state dir and the runner of its experiment."""

    experiment: Experiment
    state: StateDir
    runner: Runner
    console: Console | None
    _graph: PrefetchGraph | None = field(default=None, repr=False)

    @property
    def path(self) -> Path:
        return self.state.path

    def graph(self) -> PrefetchGraph:
        """The experiment's prefetch graph (narrated when a discovery run is needed), found
        once a command: the stages that ask again are not told it again."""
        if self._graph is None:
            self._graph = discover_graph(self.runner, self.console)
        return self._graph


@contextmanager
def open_state(experiment: Experiment, state_dir: str | Path, *,
               console: Console | None = None, executor: str | None = None,
               slots: int | None = None, scope: Scope | None = None) -> Iterator[OpenState]:
    """Hold `<state_dir>/<experiment name>/` locked while the command uses it.

    executor and slots (--executor, --slots) replace the experiment's own; scope: which
    journaled runs the command may take (runs/sessions.py; default: only its own).
    """
    experiment = with_executor(experiment, kind=executor, slots=slots)
    with StateDir(state_dir, experiment.name) as state:
        if console is not None and state.torn_line is not None:
            console.print("note: the journal's last line was torn by a kill and was dropped",
                          markup=False)
        runner = Runner(experiment, state, scope=scope).open()
        if console is not None:
            for line in runner.executor.lines:  # where runs go (a Slurm allocation's steps)
                console.print(line, markup=False, soft_wrap=True)
        if console is not None:
            runner.on_first_usable = lambda out, run_dir: _say_first_run(console, experiment,
                                                                         out.signals, run_dir)
        if console is not None and runner.killed_leftovers:
            console.print(f"note: killed {len(runner.killed_leftovers)} process(es) left running "
                          "by an earlier orchestrator that was killed", markup=False, soft_wrap=True)
        left = state.unfinished_submissions()
        if console is not None and left:
            console.print(f"note: {len(left)} job(s) submitted by an earlier orchestrator have not "
                          "been collected: each is re-attached when the search reaches it, the "
                          "rest are cancelled at the end", markup=False, soft_wrap=True)
        try:
            yield OpenState(experiment, state, runner, console)
        finally:
            # Jobs still in flight (Ctrl-C, an error) and jobs of a dead orchestrator
            # that were not re-attached are cancelled: none outlives the command.
            runner.close()
            if console is not None and (line := reused_line(list(runner.reused.values()))):
                console.print(line, markup=False, soft_wrap=True)
                console.print(f"note: {UNSEEN}", markup=False, soft_wrap=True)
            if console is not None and runner.refused:
                console.print(f"note: {len(runner.refused)} run(s) of the journal run again, "
                              f"first because: {runner.refused[0][1]}", markup=False,
                              soft_wrap=True)


def _say_first_run(console: Console, experiment: Experiment, signals: dict | None,
                   run_dir: Path) -> None:
    """What the first usable run measured, and what a static graph got wrong about the job."""
    if signals:
        console.print(describe_signals(signals), markup=False, soft_wrap=True)
    if line := static_mismatch(experiment, run_dir):
        console.print(line, markup=False, soft_wrap=True)


def reused_line(finished_at: list[float | None]) -> str | None:
    """How many runs came from the journal, and from when (a stale reuse shows its age)."""
    if not finished_at:
        return None
    known = [t for t in finished_at if t is not None]
    when = ""
    if known:
        first, last = (time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) for t in (min(known), max(known)))
        when = f", finished {first}" + (f" to {last}" if last != first else "")
    return f"note: {len(finished_at)} run(s) reused from the journal{when}; {CHECKED}"
