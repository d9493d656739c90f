"""`bisect-prefetch bisect`: the search against real training runs, narrated and resumable.

Steps: load the experiment, take the state dir's lock, learn the graph, then
let the search (search/protocol.py) ask for masks and the real oracle
(runs/oracle.py) run them, each against one golden all-off trajectory. Every
finished run is in the journal, and the oracle answers a repeated question
from it, so `--resume` replays the search to where it stopped and re-runs
nothing. The result is written next to the journal (bisect.json, in a
`finally:` so an interrupted search keeps what it learned) with the HTML report.
"""

from __future__ import annotations

import itertools
import json
import shlex
from pathlib import Path

from rich.console import Console

from bisect_prefetch.bisection import render_result, reproduce_mask, result_to_json, run_bisection
from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.experiment import Experiment, load_experiment
from bisect_prefetch.report.html import BISECT_FILE, build_report
from bisect_prefetch.runs.atomic import write_text_atomic
from bisect_prefetch.runs.discover import discover_graph
from bisect_prefetch.runs.execute import Runner, RunOutcome
from bisect_prefetch.runs.oracle import RealOracle
from bisect_prefetch.runs.store import StateDir
from bisect_prefetch.search.protocol import Bisection, SearchResult

PURPOSE = "search"
REPRODUCE_RUNS = 4


def _earlier_search_runs(state: StateDir, experiment: Experiment) -> int:
    """Journaled runs of a bisection of this very experiment (golden and retries too)."""
    suffix = "@" + experiment.fingerprint()
    return sum(1 for r in state.records()
               if r["variant"].startswith(PURPOSE) and r["variant"].endswith(suffix))


def resume_command(experiment_path: Path, state_dir: Path, confidence: float | None,
                   max_runs: int | None) -> str:
    argv = ["bisect-prefetch", "bisect", str(experiment_path), "--resume",
            f"--state-dir={state_dir}"]
    if confidence is not None:
        argv.append(f"--confidence={confidence:g}")
    if max_runs is not None:
        argv.append(f"--max-runs={max_runs}")
    return shlex.join(argv)


def reproduce_command(experiment_path: Path, result: SearchResult) -> str:
    mask = reproduce_mask(result)
    argv = ["bisect-prefetch", "aa", str(experiment_path), f"--runs={REPRODUCE_RUNS}"]
    if mask:
        argv.append(f"--mask={mask}")
    return shlex.join(argv)


def _run_line(console: Console):
    """One line per run: which, how it ended, how long (or that the journal had it)."""
    numbers = itertools.count(1)

    def on_run(mask: frozenset[str], out: RunOutcome) -> None:
        if out.outcome == "stopped-early" or (out.outcome == "ok" and out.first_diff_step):
            how = f"diverged at step {out.first_diff_step}"
        elif out.outcome == "ok":
            how = f"clean over {out.steps_done} steps"
        else:
            how = f"{out.outcome}: {out.reason}"
        when = "from the journal" if out.reused else f"{out.wall_s or 0:.1f}s"
        console.print(f"    run {next(numbers)} ({len(mask)} edges on): {how} [{when}]", markup=False)

    return on_run


def run_bisect(
    experiment_path: str | Path,
    *,
    confidence: float | None,
    max_runs: int | None,
    resume: bool,
    state_dir: str | Path,
    console: Console,
) -> tuple[SearchResult, dict]:
    experiment_path, state_dir = Path(experiment_path), Path(state_dir)
    experiment: Experiment = load_experiment(experiment_path)
    confidence_used = confidence if confidence is not None else experiment.search.confidence
    max_runs_used = max_runs if max_runs is not None else experiment.search.max_runs
    hint = resume_command(experiment_path, state_dir, confidence, max_runs)
    try:
        return _bisect(experiment, experiment_path, confidence=confidence_used,
                       max_runs=max_runs_used, resume=resume, hint=hint, state_dir=state_dir,
                       console=console)
    except KeyboardInterrupt:
        console.print("interrupted: every finished run is in the journal; resume with:",
                      markup=False)
        console.print(f"  {hint}", markup=False)
        raise


def _bisect(experiment: Experiment, experiment_path: Path, *, confidence: float, max_runs: int,
            resume: bool, hint: str, state_dir: Path, console: Console
            ) -> tuple[SearchResult, dict]:
    with StateDir(state_dir, experiment.name) as state:
        runner = Runner(experiment, state)
        earlier = _earlier_search_runs(state, experiment)
        if earlier and not resume:
            raise BisectPrefetchError(
                f"{state.path} already holds {earlier} run(s) of a bisection of this experiment; "
                f"continue it with: {hint}  (or give another --state-dir to start over)"
            )
        if state.torn_line is not None:
            console.print("note: the journal's last line was torn by a kill and was dropped",
                          markup=False)
        console.print(f"bisecting {experiment.name}: {experiment.steps} steps a run, seed "
                      f"{experiment.seed}, guard {experiment.guard}, confidence "
                      f"{confidence:g}, at most {max_runs} runs", markup=False)
        if earlier:
            console.print(f"resuming: {earlier} finished run(s) in the journal are reused",
                          markup=False)
        graph = discover_graph(runner, console)
        search = Bisection(graph.edge_ids(), confidence=confidence, max_runs=max_runs,
                           steps_per_run=experiment.steps)
        oracle = RealOracle(runner, steps=experiment.steps, guard=experiment.guard,
                            purpose=PURPOSE, on_run=_run_line(console))
        result = None
        try:
            console.print("running the golden reference (all-off, full length)...", markup=False)
            _ = oracle.golden
            result = run_bisection(search, oracle, console=console)
        finally:
            # Keep what was learned even when interrupted: the report shows it.
            partial = result or search.result()
            data = result_to_json(partial, reproduce_command(experiment_path, partial))
            data["experiment"] = experiment.name
            data["deterministic_masks"] = [sorted(m) for m in oracle.deterministic_masks()]
            data["runs_launched"], data["runs_reused"] = oracle.runs_launched, oracle.runs_reused
            write_text_atomic(state.path / BISECT_FILE, json.dumps(data, indent=2) + "\n")
            build_report(state.path)
    console.print()
    render_result(result, console, reproduce=data["reproduce"])
    console.print(f"runs launched {oracle.runs_launched}, reused from the journal "
                  f"{oracle.runs_reused}; report: {state.path / 'report.html'}", markup=False)
    return result, data
