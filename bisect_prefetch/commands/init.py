"""`bisect-prefetch init -- COMMAND...`: a commented experiment file for your own job.

In order, each printed as it happens, then a `->` line:
1. the arguments that set steps, seed and port (experiment/init_file.find_placeholders);
2. one short run of the command under the adapter, through the Runner every
   command uses (or the log given with --log): its metric lines, read by
   every parser (metrics/detect.py), and the prefetch graph the adapter found
   (commands/init_run.py);
3. the file, written (experiment/init_file.render_experiment) and read back as `aa` reads it;
4. two short runs with every edge off must be identical (all-off A/A): else
   the job drifts without prefetch and bisect cannot help yet (exit 1);
5. the commands to run next.
Bad input (a command that fails, a log no parser reads, an output file that
exists) is a BisectPrefetchError: one line, exit 2.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from bisect_prefetch.commands.common import command_line, write_text
from bisect_prefetch.commands.init_run import choose_metrics, first_run, read_log
from bisect_prefetch.drivers.group import AAResult, run_group
from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.experiment import Experiment, load_experiment
from bisect_prefetch.experiment.init_file import (
    LAUNCHERS,
    MetricsChoice,
    find_placeholders,
    render_experiment,
)
from bisect_prefetch.report.progress import RunProgress
from bisect_prefetch.runs.rank_logs import WORKER_LOGS, per_rank_logs
from bisect_prefetch.runs.state import open_state
from bisect_prefetch.vocab import CONSISTENT, DIVERGED, GUARD_NONE, PORT, SEED, STEPS, Placeholders

DEFAULT_OUT = Path("bisect-prefetch.yaml")
DEFAULT_STATE_DIR = Path(".bisect-prefetch")
CHECK_RUNS = 2
DEFAULT_STEPS = 30  # the file's steps when the command has no steps argument
DEFAULT_SEED = 1234


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
    # 1: the arguments that set steps, seed and port
    placeholders = _find_arguments(command, console)
    # 2: the metric lines (a short run, or the log given) and the prefetch graph
    seed = placeholders.value(SEED)
    base = {"name": experiment_name(command, out), "command": placeholders.argv,
            "seed": DEFAULT_SEED if seed is None else seed}
    found, graph_note, job_steps = (read_log(log, console) if log is not None
                                    else first_run(base, placeholders, state_dir, console))
    choice = choose_metrics(found, console, log=log)
    # 3: the file, read back as aa reads it
    experiment = _write_file(path, base, placeholders, choice, graph_note=graph_note,
                             job_steps=job_steps, console=console)
    # 4: all-off A/A
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
    # 5: what to run next
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
