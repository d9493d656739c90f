"""The command line: declares the options and calls one function of commands/. Nothing else.

Exit codes: 0 success, 1 a finding (aa diverged, an expectation failed, audit
found a problem), 2 a usage or input error (one line on stderr, no traceback), 3 the
tool failed (a ToolFailure inside a job, with the rank's log; or a bug, with the file
that holds the traceback). Only this module turns an error into that line.
"""

from __future__ import annotations

import signal
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from bisect_prefetch.errors import BisectPrefetchError, ToolFailure
from bisect_prefetch.vocab import (
    DEFAULT_CONFIDENCE,
    GUARD_NONE,
    GUARD_SIZE_ONE,
    STRESS_AUTO,
    STRESS_OFF,
    STRESS_ON,
)

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    rich_markup_mode=None,
    help="Find the FSDP prefetch edges that make same-seed training runs drift.",
)
# Outside a terminal (CI logs, pipes) rich would wrap at 80 columns and cut
# edge ids and commands in two; 160 keeps a table row and a command on one line.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)


def _say_version(given: bool) -> None:
    if given:
        from importlib.metadata import version

        console.print(f"bisect-prefetch {version('bisect-prefetch')}", markup=False)
        raise typer.Exit()


@app.callback()
def _main_options(
    version: Annotated[bool, typer.Option("--version", callback=_say_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """Find the FSDP prefetch edges that make same-seed training runs drift."""


def stderr_console() -> Console:
    return Console(stderr=True, highlight=False)


class GraphFormat(StrEnum):
    text = "text"
    json = "json"
    dot = "dot"
    mermaid = "mermaid"
    png = "png"


ExperimentArg = Annotated[
    Path | None, typer.Argument(metavar="EXPERIMENT.yaml",
                                help="Experiment YAML (or give --policy and --layers).")
]
# One name for the experiment argument in every command's usage line.
Experiment = Annotated[Path, typer.Argument(metavar="EXPERIMENT.yaml", help="Experiment YAML.")]
PolicyOpt = Annotated[
    str | None, typer.Option("--policy", metavar="POLICY", help="Static policy: mindformers, fsdp2-chain, torchtitan.")
]
LayersOpt = Annotated[int | None, typer.Option("--layers", metavar="N", help="Layer count for --policy.")]
StateDirOpt = Annotated[
    Path, typer.Option("--state-dir", metavar="DIR", help="Where run state lives.")
]
JsonOpt = Annotated[Path | None, typer.Option("--json", metavar="FILE", help="Also write the result as JSON here.")]
ReuseOpt = Annotated[bool | None, typer.Option("--reuse/--no-reuse", help="--reuse: take runs of earlier commands from the journal while every file their jobs read, the symlinks they went through, their packages and every variable they started with are unchanged (what no check can see is said). --no-reuse (the default): run afresh.")]


def resume_opt(what: str) -> object:
    """--resume of a command: `what` it continues."""
    return typer.Option("--resume", help=f"Continue the latest {what} in the state dir: its finished runs are taken again after the checks of --reuse, no run of another command.")


class ExecutorKind(StrEnum):
    local = "local"
    slurm = "slurm"


ExecutorOpt = Annotated[ExecutorKind | None, typer.Option("--executor", help="Where runs execute: local (this machine) or slurm (one batch job per run); default: the experiment's executor.kind.")]
class StressMode(StrEnum):
    off = STRESS_OFF
    on = STRESS_ON
    auto = STRESS_AUTO


StressOpt = Annotated[StressMode | None, typer.Option("--stress", help="Delays before each prefetch is issued, to make a race show in fewer runs: off, on, auto (measure both, keep the better; default: the experiment's stress.mode).")]
SlotsOpt = Annotated[int | None, typer.Option("--slots", metavar="N", min=1, help="Most runs in flight at once (default: the experiment's executor.slots).")]


@app.command()
def graph(
    experiment: ExperimentArg = None,
    policy: PolicyOpt = None,
    layers: LayersOpt = None,
    fmt: Annotated[GraphFormat, typer.Option("--format", help="Output format.")] = GraphFormat.text,
    out: Annotated[Path | None, typer.Option("--out", metavar="FILE", help="Write here instead of stdout.")] = None,
    state_dir: StateDirOpt = Path(".bisect-prefetch"),
) -> None:
    """Show the prefetch edge graph of a policy or of a real job."""
    from bisect_prefetch.commands.graph import graph as command

    # Narration goes to stderr: stdout carries the graph itself (pipe-able JSON).
    raise typer.Exit(command(experiment, policy=policy, layers=layers, fmt=fmt.value, out=out,
                             state_dir=state_dir, console=console, narrate=stderr_console()))


@app.command()
def masks(
    experiment: ExperimentArg = None,
    policy: PolicyOpt = None,
    layers: LayersOpt = None,
    preset: Annotated[str, typer.Option("--preset", metavar="MASK", help="all-on, all-off, backward-off, forward-off, keep-only:SEL, drop-only:SEL.")] = "all-on",
    state_dir: StateDirOpt = Path(".bisect-prefetch"),
) -> None:
    """Print which edges a preset enables and disables."""
    from bisect_prefetch.commands.graph import masks as command

    raise typer.Exit(command(experiment, policy=policy, layers=layers, preset=preset,
                             state_dir=state_dir, console=console, narrate=stderr_console()))


class Guard(StrEnum):
    none = GUARD_NONE
    size_one = GUARD_SIZE_ONE


@app.command()
def aa(
    experiment: Experiment,
    mask: Annotated[list[str] | None, typer.Option("--mask", metavar="MASK", help="Preset or selectors of the edges to enable (repeatable; default all-on).")] = None,
    runs: Annotated[int, typer.Option("--runs", metavar="N", help="Runs in the group (at least 2).")] = 2,
    steps: Annotated[int | None, typer.Option("--steps", metavar="N", help="Steps per run (default: the experiment's).")] = None,
    guard: Annotated[Guard | None, typer.Option("--guard", help="Skip prefetches into shard-size-1 units (default: the experiment's).")] = None,
    json_out: JsonOpt = None,
    state_dir: StateDirOpt = Path(".bisect-prefetch"),
    executor: ExecutorOpt = None,
    slots: SlotsOpt = None,
    stress: StressOpt = None,
    reuse: ReuseOpt = None,
    resume: Annotated[bool, resume_opt("aa of this experiment")] = False,
) -> None:
    """Run an A/A group under a mask: exit 0 consistent, 1 diverged."""
    from bisect_prefetch.commands.aa import aa as command

    raise typer.Exit(command(experiment, masks=mask or [], runs=runs, steps=steps,
                             guard=guard.value if guard else None, state_dir=state_dir,
                             console=console, json_out=json_out,
                             executor=executor.value if executor else None, slots=slots,
                             stress=stress.value if stress else None, reuse=reuse,
                             resume=resume))


@app.command()
def explain(
    experiment: Experiment,
    mask: Annotated[list[str] | None, typer.Option("--mask", metavar="MASK", help="Preset or selectors of the edges to enable (repeatable; default all-on).")] = None,
    stress: Annotated[StressMode | None, typer.Option("--stress", help="Delays before each prefetch is issued: on or off (default: the experiment's stress.mode).")] = None,
    runs: Annotated[int, typer.Option("--runs", metavar="N", help="Most runs in the traced A/A group (at least 2).")] = 4,
    steps: Annotated[str | None, typer.Option("--steps", metavar="A-B", help="Steps whose ops are traced; the runs end at B (three untraced steps later where the window starts at step 3 or before, to time tracing against). Default: around where earlier runs first differed, else every step.")] = None,
    all_units: Annotated[bool, typer.Option("--all-units", help="Trace every unit's ops (by default a mask that enables at most 4 edges traces only their source and target units).")] = False,
    json_out: JsonOpt = None,
    state_dir: StateDirOpt = Path(".bisect-prefetch"),
    resume: Annotated[bool, resume_opt("explain of this experiment")] = False,
) -> None:
    """Trace the ops of an A/A group and name the first op whose output differs, and its edge: exit 0 consistent, 1 a finding, 3 the tool failed in a traced run."""
    from bisect_prefetch.commands.explain import explain as command

    raise typer.Exit(command(experiment, masks=mask or [], stress=stress.value if stress else None,
                             runs=runs, steps=steps, all_units=all_units, state_dir=state_dir,
                             console=console, json_out=json_out, resume=resume))


@app.command()
def bisect(
    experiment: Experiment,
    confidence: Annotated[float | None, typer.Option("--confidence", metavar="P", help="Confidence the answer must reach (default: the experiment's search.confidence).")] = None,
    max_runs: Annotated[int | None, typer.Option("--max-runs", metavar="N", help="Run budget (default: the experiment's search.max_runs).")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the latest bisection of this experiment in the state dir: its finished runs are taken again after the checks of --reuse (replayed, nothing of other commands unless --reuse).")] = False,
    json_out: JsonOpt = None,
    state_dir: StateDirOpt = Path(".bisect-prefetch"),
    executor: ExecutorOpt = None,
    slots: SlotsOpt = None,
    stress: StressOpt = None,
    segments: Annotated[str | None, typer.Option("--segments", metavar="auto|off", help="auto: several masks a run, so that a start-up is paid about once per divergence (docs/segments.md); off: one mask a run (default: the experiment's search.segments).")] = None,
    reuse: ReuseOpt = None,
    explain: Annotated[bool, typer.Option("--explain", help="After the verdict, trace each cause's keep-only (explain) and show its first divergence and edge.")] = False,
) -> None:
    """Find the smallest edge set whose presence makes A/A runs diverge."""
    from bisect_prefetch.commands.bisect import bisect as command

    raise typer.Exit(command(experiment, confidence=confidence, max_runs=max_runs, resume=resume,
                             state_dir=state_dir, console=console, json_out=json_out,
                             executor=executor.value if executor else None, slots=slots,
                             stress=stress.value if stress else None, segments=segments,
                             reuse=reuse, explain=explain))


@app.command()
def matrix(
    matrix_file: Annotated[Path, typer.Argument(metavar="MATRIX.yaml", help="Matrix YAML.")],
    junit: Annotated[Path | None, typer.Option("--junit", metavar="FILE", help="Write JUnit XML here (a test case per cell).")] = None,
    markdown: Annotated[Path | None, typer.Option("--markdown", metavar="FILE", help="Write the Markdown table here (also appended to $GITHUB_STEP_SUMMARY when set).")] = None,
    json_out: JsonOpt = None,
    state_dir: StateDirOpt = Path(".bisect-prefetch"),
    executor: ExecutorOpt = None,
    slots: SlotsOpt = None,
    stress: StressOpt = None,
    reuse: ReuseOpt = None,
    resume: Annotated[bool, resume_opt("run of this matrix")] = False,
) -> None:
    """Run an experiment matrix: exit 0 when every cell meets its expectation, 1 otherwise."""
    from bisect_prefetch.commands.matrix import matrix as command

    raise typer.Exit(command(matrix_file, state_dir=state_dir, console=console, junit=junit,
                             markdown=markdown, json_out=json_out,
                             executor=executor.value if executor else None, slots=slots,
                             stress=stress.value if stress else None, reuse=reuse,
                             resume=resume))


@app.command()
def init(
    command: Annotated[list[str] | None, typer.Argument(metavar="COMMAND", help="Your training command, after -- (init [OPTIONS] -- torchrun ... train.py ...).")] = None,
    out: Annotated[Path | None, typer.Option("--out", metavar="FILE", help="The experiment file to write (default bisect-prefetch.yaml).")] = None,
    log: Annotated[Path | None, typer.Option("--log", metavar="FILE", help="Read the metrics format and names from this log of your job instead of a short run.")] = None,
    steps: Annotated[int, typer.Option("--steps", metavar="N", help="Steps of each of the two all-off runs init checks.")] = 3,
    force: Annotated[bool, typer.Option("--force", help="Replace the output file if it exists.")] = False,
    state_dir: StateDirOpt = Path(".bisect-prefetch"),
) -> None:
    """Write a commented experiment file for your training command (after --); check all-off A/A."""
    from bisect_prefetch.commands.init import init as command_

    raise typer.Exit(command_(command or [], out=out, log=log, steps=steps, force=force,
                              state_dir=state_dir, console=console))


@app.command()
def report(
    state: Annotated[Path, typer.Argument(metavar="STATE_DIR", help="An experiment's state dir, e.g. .bisect-prefetch/NAME.")],
    html_out: Annotated[Path | None, typer.Option("--html", metavar="FILE", help="Write the HTML here (default STATE_DIR/report.html).")] = None,
) -> None:
    """Rebuild the HTML report of a state dir from its journal and run dirs."""
    from bisect_prefetch.commands.report import report as command

    raise typer.Exit(command(state, html_out=html_out, console=console))


@app.command()
def compare(
    a: Annotated[Path, typer.Argument(metavar="A", help="A run directory or a log file.")],
    b: Annotated[Path, typer.Argument(metavar="B", help="The run directory or log file to compare with.")],
    fmt: Annotated[str | None, typer.Option("--format", metavar="jsonl|mindformers|torchtitan|megatron", help="Log format: jsonl, mindformers, torchtitan, megatron (default: detected).")] = None,
    json_out: JsonOpt = None,
    allow_truncated: Annotated[bool, typer.Option("--allow-truncated", help="Compare the common steps when one run stops before the other (otherwise exit 1).")] = False,
) -> None:
    """Compare two runs' metrics (and gradient digests): exit 0 identical, 1 different or one run stops early."""
    from bisect_prefetch.commands.compare import compare as command

    raise typer.Exit(command(a, b, fmt=fmt, console=console, json_out=json_out,
                             allow_truncated=allow_truncated))


@app.command()
def audit(
    experiment: Experiment,
    guard: Annotated[Guard | None, typer.Option("--guard", help="Run under this guard instead of the experiment's.")] = None,
    kinds: Annotated[str | None, typer.Option("--kinds", metavar="K,...", help="Kinds of finding to report: size-one, never-consumed, late (these fail), no-op, shadowed, duplicate-target (notes). Default: all.")] = None,
    json_out: JsonOpt = None,
    state_dir: StateDirOpt = Path(".bisect-prefetch"),
) -> None:
    """Audit the prefetch edges of one recorded run: exit 0 when the build is right, 1 otherwise."""
    from bisect_prefetch.commands.audit import audit as command

    raise typer.Exit(command(experiment, guard=guard.value if guard else None, kinds=kinds,
                             state_dir=state_dir, console=console, json_out=json_out))


@app.command()
def simulate(
    policy: Annotated[str, typer.Option("--policy", metavar="POLICY", help="Static policy for the graph: mindformers, fsdp2-chain, torchtitan.")],
    layers: Annotated[int, typer.Option("--layers", metavar="N", help="Layer count.")],
    steps: Annotated[int, typer.Option("--steps", metavar="N", help="Steps per run.")],
    culprit: Annotated[list[str] | None, typer.Option("--culprit", metavar="EDGE", help="Culprit edge selector (repeatable: each one a cause enough alone; A+B: a cause needing both; a glob draws one matching edge per trial). None: drift without prefetch only (give --background); a trial is right when it says not-prefetch.")] = None,
    hazard: Annotated[float | None, typer.Option("--hazard", metavar="P", help="Per-step chance of drift while the culprit rule holds (needed with --culprit).")] = None,
    together: Annotated[bool, typer.Option("--together", help="The culprits cause drift only together (default: any one suffices, and a trial is right only when every one is named as its own set).")] = False,
    trials: Annotated[int, typer.Option("--trials", metavar="N", help="Simulated searches.")] = 100,
    seed: Annotated[int, typer.Option("--seed", metavar="N", help="Seed of the simulated noise.")] = 0,
    background: Annotated[float, typer.Option("--background", metavar="P", help="Per-run chance of drift with every edge off (background drift).")] = 0.0,
    startup_cost: Annotated[float, typer.Option("--startup-cost", metavar="STEPS", help="Start-up cost of a run, in steps (adds to the cost figures).")] = 0.0,
    confidence: Annotated[float, typer.Option("--confidence", metavar="P", help="Confidence the search must reach.")] = DEFAULT_CONFIDENCE,
    max_runs: Annotated[int | None, typer.Option("--max-runs", metavar="N", help="Run budget of each search (default: scaled with the graph and the estimated q).")] = None,
    slots: Annotated[int, typer.Option("--slots", metavar="N", help="Runs at once; wall-clock is reported in full runs.")] = 1,
    hint_accuracy: Annotated[float | None, typer.Option("--hint-accuracy", metavar="P", help="Give the first diverged run a localization hint, right with this chance.")] = None,
    stress_factor: Annotated[float | None, typer.Option("--stress-factor", metavar="X", help="Also simulate the searches under stress, which multiplies the culprit's per-step hazard by this factor, and say whether it pays.")] = None,
    stress_cost: Annotated[float, typer.Option("--stress-cost", metavar="X", help="Step-time factor under stress (with --stress-factor).")] = 1.0,
    all_off_runs: Annotated[str, typer.Option("--all-off-runs", metavar="auto|N", help="auto (default): all-off runs rule out drift without prefetch as strong as the answer's; or a count of all-off runs after the first divergence (as search.all_off_runs).")] = "auto",
    segments: Annotated[str, typer.Option("--segments", metavar="auto|off", help="auto: several masks per run, cut by the cost model from --startup-cost (as search.segments), reported beside the same searches with one mask a run; off (default): one mask a run.")] = "off",
    json_out: JsonOpt = None,
) -> None:
    """Run the search against a simulated oracle with a known answer, and score it."""
    from bisect_prefetch.commands.simulate import simulate as command

    raise typer.Exit(command(
        policy, layers, culprit or [], console=console, json_out=json_out, hazard=hazard, steps=steps,
        together=together, trials=trials, seed=seed, background=background,
        startup_cost=startup_cost, confidence=confidence, max_runs=max_runs, slots=slots,
        hint_accuracy=hint_accuracy, all_off_runs=_count(all_off_runs),
        stress_factor=stress_factor, stress_cost=stress_cost, segments=segments,
    ))


def _count(text: str) -> int | str:
    """A count option that also takes a word ("auto"); search/evidence.Settings.of checks it."""
    try:
        return int(text)
    except ValueError:
        return text


INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C
TERMINATED = 128 + signal.SIGTERM
BUG = 3  # anything else that went wrong: never 0, 1 (a finding) or 2 (your input)
MESSAGE_CHARS = 2000  # an error stays one readable line, whatever it quotes


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MESSAGE_CHARS else f"{text[:MESSAGE_CHARS]}... ({len(text)} characters)"


def _report_bug(exc: BaseException) -> int:
    """The last resort: one line saying it is a bug, the traceback in a file."""
    import tempfile
    import traceback

    fd, path = tempfile.mkstemp(prefix="bisect-prefetch-crash-", suffix=".txt")
    with open(fd, "w", encoding="utf-8", errors="replace") as f:
        f.write(" ".join(sys.argv) + "\n")
        traceback.print_exception(exc, file=f)
    stderr_console().print(
        _one_line(f"error: a bug in bisect-prefetch ({type(exc).__name__}: {exc}); "
                  f"the traceback is in {path}; please report it"),
        markup=False, soft_wrap=True)
    return BUG


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit code; library errors become one line and 2."""
    from bisect_prefetch.commands.common import sigterm_stops_like_ctrl_c

    with sigterm_stops_like_ctrl_c() as sigterm:
        try:
            app(args=argv, prog_name="bisect-prefetch")
            code = 0
        except SystemExit as exc:  # typer exits in standalone mode; usage errors exit 2
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        except BisectPrefetchError as exc:
            stderr_console().print(_one_line(f"error: {exc}"), markup=False, soft_wrap=True)
            return 2
        except ToolFailure as exc:  # the tool's own failure inside a job: not the input
            stderr_console().print(_one_line(f"error: bisect-prefetch failed (not your input): "
                                             f"{exc}"), markup=False, soft_wrap=True)
            return BUG
        except KeyboardInterrupt:  # typer already makes Ctrl-C exit code 130; one outside it
            code = INTERRUPTED
        except OSError as exc:  # the machine's refusal (a full disk, no permission): not a bug
            stderr_console().print(_one_line(f"error: {exc}"), markup=False, soft_wrap=True)
            return 2
        except Exception as exc:  # noqa: BLE001 (the last resort)
            return _report_bug(exc)
    if code == INTERRUPTED:
        Console(stderr=True).print("terminated" if sigterm else "interrupted")
        return TERMINATED if sigterm else INTERRUPTED
    return code


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()
