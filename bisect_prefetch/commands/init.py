"""`bisect-prefetch init -- COMMAND...`: a commented experiment file for your own job.

Steps, each printed as it happens, then a `->` line:
1. the arguments that set steps, seed and port (experiment/init_file.find_placeholders);
2. one short run of the command under the adapter, through the Runner every
   command uses (or the log given with --log): its metric lines, read by
   every parser (metrics/detect.py), and the prefetch graph the adapter found;
3. the file, written (experiment/init_file.render_experiment) and read back as `aa` reads it;
4. two short runs with every edge off must be identical (all-off A/A): else
   the job drifts without prefetch and bisect cannot help yet (exit 1);
5. the commands to run next.
Bad input (a command that fails, a log no parser reads, an output file that
exists) is a BisectPrefetchError: one line, exit 2.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError
from rich.console import Console

from bisect_prefetch.commands.common import command_line, write_text
from bisect_prefetch.drivers.group import AAResult, run_group
from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.experiment import Experiment, load_experiment
from bisect_prefetch.experiment.init_file import (
    LAUNCHERS,
    MetricsChoice,
    find_placeholders,
    render_experiment,
)
from bisect_prefetch.judge.faults import RANK_LOG_DIR
from bisect_prefetch.judge.first_error import first_error_line
from bisect_prefetch.judge.merge import GRAPH_FILE
from bisect_prefetch.metrics.detect import FORMATS, Reading, readings, steps_seen
from bisect_prefetch.report.progress import RunProgress
from bisect_prefetch.runs.discover import engine_says
from bisect_prefetch.runs.rank_logs import WORKER_LOGS, log_files, per_rank_logs
from bisect_prefetch.runs.state import open_state
from bisect_prefetch.vocab import (
    CONSISTENT,
    DIVERGED,
    GUARD_NONE,
    METRICS_FILE,
    PORT,
    SEED,
    STDERR_FILE,
    STDOUT_FILE,
    STEPS,
    TIMEOUT,
    Placeholders,
)

DEFAULT_OUT = Path("bisect-prefetch.yaml")
DEFAULT_STATE_DIR = Path(".bisect-prefetch")
PROBE_STEPS = 2  # the first run: enough metric lines to read the format from
CHECK_RUNS = 2
DEFAULT_STEPS = 30  # the file's steps when the command has no steps argument
DEFAULT_SEED = 1234
LOG_FILES = (STDOUT_FILE, STDERR_FILE, METRICS_FILE)  # where a run's metric lines may be
STOP_CHECK_S = 0.5  # how often the first run's logs are read while it goes


def init(
    command: Sequence[str],
    *,
    out: Path | None,
    log: Path | None,
    steps: int,
    force: bool,
    state_dir: Path,
    console: Console,
) -> int:
    """Write the experiment file; exit code 0, or 1 when all-off runs already differ."""
    command = list(command)
    path = _check_input(command, out=out, log=log, steps=steps, force=force)
    console.print(f"init: {shlex.join(command)}", markup=False, soft_wrap=True)
    # step 1: the arguments that set steps, seed and port
    placeholders = _find_arguments(command, console)
    # step 2: the metric lines (a short run, or the log given) and the prefetch graph
    seed = placeholders.value(SEED)
    base = {"name": experiment_name(command, out), "command": placeholders.argv,
            "seed": DEFAULT_SEED if seed is None else seed}
    found, graph_note, job_steps = (_read_log(log, console) if log is not None
                                    else _first_run(base, placeholders, state_dir, console))
    choice = _choose(found, console, log=log)
    # step 3: the file, read back as aa reads it
    experiment = _write_file(path, base, placeholders, choice, graph_note=graph_note,
                             job_steps=job_steps, console=console)
    # step 4: all-off A/A
    if placeholders.found(STEPS) is None and job_steps is None:
        console.print(f"-> all-off A/A: not run: mark the argument that sets the steps with "
                      f"{{steps}} in {path} (see its TODO), then check with:", markup=False,
                      soft_wrap=True)
        console.print(f"  {_next(path, state_dir, 'aa', '--mask', 'all-off', '--runs', '2')}",
                      markup=False, soft_wrap=True)
        return 0
    if placeholders.found(STEPS) is None:  # the command trains its own number of steps
        steps = experiment.steps
    result = _all_off_aa(experiment, steps=steps, log=log, state_dir=state_dir, console=console)
    code = _verdict(result, path, state_dir, console)
    if code:
        return code
    # step 5: what to run next
    console.print("next: A/A with every edge on, then the bisection:", markup=False)
    console.print(f"  {_next(path, state_dir, 'aa', '--runs', '3')}", markup=False, soft_wrap=True)
    console.print(f"  {_next(path, state_dir, 'bisect')}", markup=False, soft_wrap=True)
    return 0


def _check_input(command: list[str], *, out: Path | None, log: Path | None, steps: int,
                 force: bool) -> Path:
    """The file to write, once the arguments were found sound (else one line, exit 2)."""
    if not command:
        raise BisectPrefetchError("give your training command after --, e.g. bisect-prefetch "
                                  "init -- torchrun --standalone --nproc_per_node=2 train.py")
    if steps < 1:
        raise BisectPrefetchError(f"--steps must be at least 1, got {steps}")
    path = out or DEFAULT_OUT
    if path.exists() and not force:
        raise BisectPrefetchError(f"{path} exists: give --force to replace it, or --out another file")
    if not path.parent.is_dir():
        raise BisectPrefetchError(f"cannot write {path}: no directory {path.parent}")
    if log is not None and not log.is_file():
        raise BisectPrefetchError(f"log not found: {log}")
    return path


def _find_arguments(command: list[str], console: Console) -> Placeholders:
    """Step 1, said: the arguments that set steps, seed and port."""
    console.print("finding the arguments that set steps, seed and port...", markup=False)
    placeholders = find_placeholders(command)
    console.print(f"-> {describe_placeholders(placeholders)}", markup=False, soft_wrap=True)
    if per_rank_logs(placeholders):
        console.print(f"-> msrun: each worker logs to its own file under the run dir "
                      f"(--log_dir={{rank_log_dir}}); metrics are read from {WORKER_LOGS}",
                      markup=False, soft_wrap=True)
    return placeholders


def _read_log(log: Path, console: Console) -> tuple[list[Reading], str, int | None]:
    """Step 2 from a log given with --log: its readings (no graph seen, no steps known)."""
    console.print(f"reading {log} with every parser ({', '.join(FORMATS)})...", markup=False)
    found = readings([log])
    if not found:
        raise BisectPrefetchError(
            f"no parser reads {log}: no {', '.join(FORMATS)} metric line with a number found "
            "(write metrics: {format: regex, pattern: ...} by hand)")
    return found, "", None


def _write_file(path: Path, base: dict, placeholders: Placeholders, choice: MetricsChoice, *,
                graph_note: str, job_steps: int | None, console: Console) -> Experiment:
    """Step 3: the file, checked as YAML reads it back before it is written, then loaded."""
    try:
        text = render_experiment(
            name=base["name"], placeholders=placeholders, metrics=choice, graph_note=graph_note,
            steps=placeholders.value(STEPS) or job_steps or DEFAULT_STEPS, seed=base["seed"],
            job_steps=job_steps)
    except ValueError as exc:
        raise BisectPrefetchError(f"init would write a file that does not read back as "
                                  f"written, so it writes none: {exc}") from None
    write_text(path, text, console)
    return load_experiment(path)


def _all_off_aa(experiment: Experiment, *, steps: int, log: Path | None, state_dir: Path,
                console: Console) -> AAResult:
    """Step 4's runs: CHECK_RUNS runs with every prefetch edge off, as `aa` would run them."""
    console.print(f"checking that {CHECK_RUNS} runs of {steps} step(s) with every prefetch edge "
                  "off are identical (all-off A/A)...", markup=False)
    with open_state(experiment, state_dir, console=console) as opened:
        if log is not None:  # the graph no run has shown yet (aa reuses this run)
            opened.graph()
        with RunProgress(console) as progress:
            return run_group(opened.runner, mask=frozenset(), runs=CHECK_RUNS, steps=steps,
                             guard=GUARD_NONE, name="all-off", progress=progress)


def experiment_name(command: Sequence[str], out: Path | None) -> str:
    """The output file's name when given, else the script's (train.py -> train), else the program's."""
    if out is not None:
        stem = out.name.split(".")[0]
    else:
        script = next((w for w in command if w.endswith(".py")), None)
        modules = [command[i + 1] for i, w in enumerate(command[:-1]) if w == "-m"
                   and command[i + 1] not in LAUNCHERS]
        stem = (Path(script).stem if script else modules[0] if modules
                else Path(command[0]).name)
    name = re.sub(r"[^A-Za-z0-9._-]", "-", stem).lstrip("._-")
    return name or "job"


def describe_placeholders(p: Placeholders) -> str:
    parts = []
    for kind in (STEPS, SEED, PORT):
        mark = p.found(kind)
        if mark is not None:
            parts.append(f"{kind}: {mark.describe()}")
        elif kind == PORT and p.standalone:
            parts.append("port: torchrun --standalone picks a free one itself")
        elif kind == PORT and not p.needs_port():
            parts.append("port: none needed")
        else:
            parts.append(f"{kind}: not found (TODO in the file)")
    if p.notes:
        parts.append(f"left as they are: {'; '.join(p.notes)}")
    return "; ".join(parts)


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


def _first_run(base: dict, p: Placeholders, state_dir: Path,
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


def _choose(found: list[Reading], console: Console, *, log: Path | None) -> MetricsChoice:
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


def _next(path: Path, state_dir: Path, *argv: str) -> str:
    extra = [] if state_dir == DEFAULT_STATE_DIR else ["--state-dir", str(state_dir)]
    return command_line(argv[0], str(path), *argv[1:], *extra)


def _verdict(result: AAResult, path: Path, state_dir: Path, console: Console) -> int:
    """The all-off A/A's line; 1 when the runs differ."""
    usable = sum(run.usable for run in result.runs)
    if result.verdict == CONSISTENT:
        compared = max((m.get("steps_compared", 0) for m in result.metrics.values()), default=0)
        console.print(f"-> all-off A/A: {result.identical} over {compared} steps ({usable} runs)",
                      markup=False, soft_wrap=True)
        return 0
    if result.verdict == DIVERGED:
        console.print(f"-> all-off A/A: the runs differ at step {result.first_diff_step} with every "
                      "prefetch edge off: your job is not deterministic without prefetch, so "
                      "bisect cannot find an edge yet. Make it deterministic first (seeds, data "
                      "order, deterministic algorithms, thread counts), then check with:",
                      markup=False, soft_wrap=True)
        console.print(f"  {_next(path, state_dir, 'aa', '--mask', 'all-off', '--runs', '3')}",
                      markup=False, soft_wrap=True)
        return 1
    raise BisectPrefetchError(f"{path} was written, but its all-off A/A gave no verdict: "
                              f"{result.reason}")
