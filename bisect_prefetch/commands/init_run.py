"""`init`'s step 2 (commands/init.py): reading the job. One short run of the command under
the adapter, through the Runner every command uses, stopped once its logs show enough steps
(or the log given with --log): the metric lines every parser reads (metrics/detect.py), the
prefetch graph the adapter found, and the reading the file takes, said with why it won.

A command that fails, prints no metric line a parser reads, finds no FSDP unit, or trains
past the steps its steps argument should have set is a BisectPrefetchError: one line that
names the run's output.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from pydantic import ValidationError
from rich.console import Console

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.experiment import Experiment
from bisect_prefetch.experiment.init_file import MetricsChoice
from bisect_prefetch.judge.faults import RANK_LOG_DIR
from bisect_prefetch.judge.first_error import first_error_line
from bisect_prefetch.judge.merge import GRAPH_FILE
from bisect_prefetch.metrics.detect import FORMATS, Reading, readings, steps_seen
from bisect_prefetch.runs.discover import engine_says
from bisect_prefetch.runs.rank_logs import WORKER_LOGS, log_files
from bisect_prefetch.runs.state import open_state
from bisect_prefetch.vocab import (
    GUARD_NONE,
    METRICS_FILE,
    STDERR_FILE,
    STDOUT_FILE,
    STEPS,
    TIMEOUT,
    Placeholders,
)

PROBE_STEPS = 2  # the first run: enough metric lines to read the format from
LOG_FILES = (STDOUT_FILE, STDERR_FILE, METRICS_FILE)  # where a run's metric lines may be
STOP_CHECK_S = 0.5  # how often the first run's logs are read while it goes


def read_log(log: Path, console: Console) -> tuple[list[Reading], str, int | None]:
    """Step 2 from a log given with --log: its readings (no graph seen, no steps known)."""
    console.print(f"reading {log} with every parser ({', '.join(FORMATS)})...", markup=False)
    found = readings([log])
    if not found:
        raise BisectPrefetchError(
            f"no parser reads {log}: no {', '.join(FORMATS)} metric line with a number found "
            "(write metrics: {format: regex, pattern: ...} by hand)")
    return found, "", None


class _StopAfterSteps:
    """Stops a run once its logs show `steps` steps (any parser), looking twice a second."""

    def __init__(self, steps: int, p: Placeholders) -> None:
        self.p = p
        self.steps = steps
        self.fired = False
        self._next = 0.0

    def __call__(self, run_dir: Path) -> bool:
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + STOP_CHECK_S
        self.fired = steps_seen(log_files(run_dir, self.p, LOG_FILES)) >= self.steps
        return self.fired


def first_run(base: dict, p: Placeholders, state_dir: Path,
              console: Console) -> tuple[list[Reading], str, int | None]:
    """One short run of the command under the adapter: its metric readings and graph, said,
    and the steps it trained when it ended by itself with no steps argument to set them."""
    try:  # the metrics are what this run finds out: any format does until then
        probe = Experiment.model_validate({**base, "steps": PROBE_STEPS,
                                           "metrics": {"format": "jsonl", "files": STDOUT_FILE}})
    except ValidationError as exc:
        raise BisectPrefetchError(f"cannot run this command: {exc.errors()[0]['msg']}") from None
    # With a steps argument the job ends by itself after PROBE_STEPS; one more step shows
    # that the argument does not set its steps (stopped there, not left to train on).
    stop = _StopAfterSteps(PROBE_STEPS + 1 if p.found(STEPS) else PROBE_STEPS, p)
    how = (f"for {PROBE_STEPS} steps" if p.found(STEPS) is not None else
           f"as given, stopped after {PROBE_STEPS} steps' metric lines (timeout {probe.timeout_s:g}s)")
    console.print(f"running your command {how} under the adapter, to read its log and its "
                  "prefetch graph...", markup=False, soft_wrap=True)
    with open_state(probe, state_dir) as opened:
        # Never reused: an earlier init's run may have failed for a reason fixed since.
        key = opened.runner.key("init", mask=None, guard=GUARD_NONE, steps=PROBE_STEPS,
                                index=len(opened.state.records()))
        run = opened.runner.run(key, label="init", stop=stop)
        run_dir = opened.state.run_dir(run.run_id)
    found = readings(log_files(run_dir, p, LOG_FILES))
    mark = p.found(STEPS)
    if mark is not None and (stop.fired or max((r.last_step for r in found), default=0)
                             > PROBE_STEPS):
        raise BisectPrefetchError(
            f"your command trained past step {PROBE_STEPS} with {mark.flag} {PROBE_STEPS}: that "
            "argument does not seem to set its training steps; mark the one that does with "
            f"{{steps}} in the command and run init again; its output: {run_dir / STDOUT_FILE}")
    failed = not stop.fired and run.exit_code not in (0, None) and run.outcome != TIMEOUT
    if failed or not found:
        why = first_error_line(run_dir)
        if failed:
            what = f"your command failed ({run.reason.split(':')[0]})"
        elif run.outcome == TIMEOUT:
            what = f"your command printed no metric line any parser reads before it {run.reason}"
        else:
            what = ("your command printed no metric line any parser reads "
                    f"({', '.join(FORMATS)})")
        raise BisectPrefetchError(f"{what}{': ' + why if why else ''}; its output: "
                                  f"{run_dir / STDOUT_FILE}, {run_dir / STDERR_FILE}")
    said = engine_says(run_dir)  # the adapter named why it found no graph
    if said is not None:
        raise BisectPrefetchError(f"your command ran, but {said}; its output: "
                                  f"{run_dir / STDERR_FILE}")
    graph_note = _graph_note(run_dir)
    if not graph_note:
        raise BisectPrefetchError(
            "your command ran, but the adapter found no FSDP unit in it (no prefetch graph "
            "recorded): bisect-prefetch works on jobs that shard with FSDP2's fully_shard or "
            f"hyper-parallel; its output: {run_dir / STDERR_FILE}")
    console.print(f"-> ran {run.wall_s or 0:.1f}s ({found[0].steps} step(s) read); {graph_note}",
                  markup=False, soft_wrap=True)
    ended = not stop.fired and run.exit_code == 0 and p.found(STEPS) is None
    return found, graph_note, found[0].steps if ended else None


def _graph_note(run_dir: Path) -> str:
    """'your job: N FSDP units, M prefetch edges' from the run's graph file, or ''."""
    try:
        graph = json.loads((run_dir / GRAPH_FILE).read_text())
        units, edges = len(graph["nodes"]), len(graph["edges"])
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    return f"your job: {units} FSDP units, {edges} prefetch edges (seen by init's short run)"


def choose_metrics(found: list[Reading], console: Console, *,
                   log: Path | None) -> MetricsChoice:
    """The best reading, said with the others that read the same file and why it won."""
    best = found[0]
    where = str(log) if log is not None else f"the job's {best.path.name}"
    console.print(f"-> metrics: {best.fmt} lines in {where}: {', '.join(best.names)}"
                  + (f" (not compared: {', '.join(best.left_out)}, they differ run to run)"
                     if best.left_out else ""), markup=False, soft_wrap=True)
    others = [r for r in found[1:] if r.path == best.path]
    for other in others:
        why = ("it reads more lines" if best.lines > other.lines else
               "it reads more metrics" if len(best.names) > len(other.names) else
               f"it comes first of {', '.join(FORMATS)}")
        console.print(f"   also read by {other.describe()}: chose {best.fmt}, {why}", markup=False,
                      soft_wrap=True)
    files, todo = None, ""
    if log is not None:
        if best.fmt == "jsonl":
            files = STDOUT_FILE
            todo = ("the runs read these lines from the job's stdout; if your job writes them to "
                    "a file, write it under the run dir ({run_dir} in the command) and set "
                    "files: to its glob")
        found_in = f"{log} (the runs read the job's stdout; set files: if it prints them elsewhere)"
    else:
        if best.path.parent.name == RANK_LOG_DIR:
            printing = {r.path for r in found if r.fmt == best.fmt and r.path.parent == best.path.parent}
            # Every worker's log where each rank prints its lines, else the one that does.
            files = WORKER_LOGS if len(printing) > 1 else f"{RANK_LOG_DIR}/{best.path.name}"
        elif best.path.name != (METRICS_FILE if best.fmt == "jsonl" else STDOUT_FILE):
            files = best.path.name
        found_in = f"the job's {best.path.name} (init's short run)"
    return MetricsChoice(format=best.fmt, names=best.names, files=files, found_in=found_in,
                         sample=best.sample, left_out=best.left_out, todo=todo)
