"""The command line: parses, calls the library, prints. Nothing else.

Exit codes: 0 success, 1 a finding (aa diverged, an expectation failed, audit
found a problem), 2 a usage or input error (one line on stderr, no traceback).
"""

from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from bisect_prefetch.errors import BisectPrefetchError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Find the FSDP prefetch edges that make same-seed training runs drift.",
)
# Outside a terminal (CI logs, pipes) rich would wrap at 80 columns and cut
# edge ids and commands in two; 160 keeps a table row and a command on one line.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)


def fail(message: str) -> None:
    """A usage or input error: one line on stderr, exit code 2."""
    Console(stderr=True, highlight=False).print(f"error: {message}", markup=False, soft_wrap=True)
    raise typer.Exit(2)


class GraphFormat(StrEnum):
    text = "text"
    json = "json"
    dot = "dot"
    mermaid = "mermaid"
    png = "png"


ExperimentArg = Annotated[
    Path | None, typer.Argument(help="Experiment YAML (or give --policy and --layers).")
]
PolicyOpt = Annotated[
    str | None, typer.Option("--policy", help="Static policy: mindformers, fsdp2-chain, torchtitan.")
]
LayersOpt = Annotated[int | None, typer.Option("--layers", help="Layer count for --policy.")]
StateDirOpt = Annotated[
    Path, typer.Option("--state-dir", help="Where run state lives (default .bisect-prefetch).")
]
JsonOpt = Annotated[Path | None, typer.Option("--json", help="Also write the result as JSON here.")]


def _load_graph(experiment: Path | None, policy: str | None, layers: int | None, state_dir: Path):
    from bisect_prefetch import graph as graphs

    if experiment is not None:
        if policy is not None:
            fail("give an experiment file or --policy, not both")
        from bisect_prefetch.runs.discover import graph_for_experiment

        # Narration goes to stderr: stdout carries the graph itself (pipe-able JSON).
        narrate = Console(stderr=True, highlight=False)
        return graph_for_experiment(experiment, state_dir=state_dir, console=narrate)
    if policy is None or layers is None:
        fail("give an experiment file, or --policy NAME and --layers N")
    return graphs.from_policy(policy, layers)


@app.command()
def graph(
    experiment: ExperimentArg = None,
    policy: PolicyOpt = None,
    layers: LayersOpt = None,
    fmt: Annotated[GraphFormat, typer.Option("--format", help="Output format.")] = GraphFormat.text,
    out: Annotated[Path | None, typer.Option("--out", help="Write here instead of stdout.")] = None,
    state_dir: StateDirOpt = Path(".bisect-prefetch"),
) -> None:
    """Show the prefetch edge graph of a policy or of a real job."""
    from bisect_prefetch import graph as graphs

    g = _load_graph(experiment, policy, layers, state_dir)
    if fmt is GraphFormat.png:
        if out is None:
            fail("--format png needs --out FILE")
        graphs.render_png(g, out)
        console.print(f"wrote {out}", markup=False)
        return
    text = graphs.RENDERERS[fmt.value](g)
    if out is not None:
        from bisect_prefetch.runs.atomic import write_text_atomic

        write_text_atomic(out, text + "\n")
        console.print(f"wrote {out}", markup=False)
    else:
        print(text)


@app.command()
def masks(
    experiment: ExperimentArg = None,
    policy: PolicyOpt = None,
    layers: LayersOpt = None,
    preset: Annotated[str, typer.Option("--preset", help="all-on, all-off, backward-off, forward-off, keep-only:SEL, drop-only:SEL.")] = "all-on",
    state_dir: StateDirOpt = Path(".bisect-prefetch"),
) -> None:
    """Print which edges a preset enables and disables."""
    from bisect_prefetch.select import preset_mask

    g = _load_graph(experiment, policy, layers, state_dir)
    ids = g.edge_ids()
    mask = preset_mask(preset, ids)
    enabled = [e for e in ids if e in mask]
    disabled = [e for e in ids if e not in mask]
    console.print(f"{preset}: {len(enabled)} enabled, {len(disabled)} disabled", markup=False)
    console.print("enabled:", markup=False)
    for e in enabled:
        console.print(f"  + {e}", markup=False)
    console.print("disabled:", markup=False)
    for e in disabled:
        console.print(f"  - {e}", markup=False)


class Guard(StrEnum):
    none = "none"
    size_one = "size-one"


@app.command()
def aa(
    experiment: Annotated[Path, typer.Argument(help="Experiment YAML.")],
    mask: Annotated[list[str] | None, typer.Option("--mask", help="Preset or selectors of the edges to enable (repeatable; default all-on).")] = None,
    runs: Annotated[int, typer.Option("--runs", help="Runs in the group (at least 2).")] = 2,
    steps: Annotated[int | None, typer.Option("--steps", help="Steps per run (default: the experiment's).")] = None,
    guard: Annotated[Guard | None, typer.Option("--guard", help="Skip prefetches into shard-size-1 units (default: the experiment's).")] = None,
    json_out: JsonOpt = None,
    state_dir: StateDirOpt = Path(".bisect-prefetch"),
) -> None:
    """Run an A/A group under a mask: exit 0 consistent, 1 diverged."""
    import json
    import shlex

    from bisect_prefetch.aa import run_aa
    from bisect_prefetch.runs.atomic import write_text_atomic

    try:
        result = run_aa(experiment, masks=mask or [], runs=runs, steps=steps,
                        guard=guard.value if guard else None, state_dir=state_dir, console=console)
    except KeyboardInterrupt:
        console.print("interrupted: finished runs are in the journal; to resume, run again:",
                      markup=False)
        again = ["bisect-prefetch", "aa", str(experiment), *(f"--mask={m}" for m in mask or []),
                 f"--runs={runs}", *([f"--steps={steps}"] if steps else []),
                 *([f"--guard={guard.value}"] if guard else []), f"--state-dir={state_dir}"]
        console.print("  " + shlex.join(again), markup=False, soft_wrap=True)
        raise
    if json_out is not None:
        write_text_atomic(json_out, json.dumps(result.to_json(), indent=2) + "\n")
        console.print(f"wrote {json_out}", markup=False)
    if result.verdict == "error":
        fail(f"no verdict: {result.reason}")
    raise typer.Exit(0 if result.verdict == "consistent" else 1)


@app.command()
def bisect(
    experiment: Annotated[Path, typer.Argument(metavar="EXPERIMENT.yaml", help="Experiment YAML.")],
    confidence: Annotated[float | None, typer.Option("--confidence", help="Confidence the answer must reach (default: the experiment's search.confidence).")] = None,
    max_runs: Annotated[int | None, typer.Option("--max-runs", help="Run budget (default: the experiment's search.max_runs).")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the bisection in the state dir, reusing every finished run.")] = False,
    json_out: JsonOpt = None,
    state_dir: StateDirOpt = Path(".bisect-prefetch"),
) -> None:
    """Find the smallest edge set whose presence makes A/A runs diverge."""
    import json

    from bisect_prefetch.bisect_run import run_bisect
    from bisect_prefetch.runs.atomic import write_text_atomic

    result, data = run_bisect(experiment, confidence=confidence, max_runs=max_runs, resume=resume,
                              state_dir=state_dir, console=console)
    if json_out is not None:
        write_text_atomic(json_out, json.dumps(data, indent=2) + "\n")
        console.print(f"wrote {json_out}", markup=False)
    # A culprit is a finding (1); so is drift that is not prefetch's. No drift: 0.
    codes = {"culprit-found": 1, "not-prefetch": 1, "no-drift-reproduced": 0, "inconclusive": 1}
    raise typer.Exit(codes[result.verdict])


@app.command()
def matrix(
    matrix_file: Annotated[Path, typer.Argument(metavar="MATRIX.yaml", help="Matrix YAML.")],
    junit: Annotated[Path | None, typer.Option("--junit", help="Write JUnit XML here (a test case per cell).")] = None,
    markdown: Annotated[Path | None, typer.Option("--markdown", help="Write the Markdown table here (also appended to $GITHUB_STEP_SUMMARY when set).")] = None,
    json_out: JsonOpt = None,
    state_dir: StateDirOpt = Path(".bisect-prefetch"),
) -> None:
    """Run an experiment matrix: exit 0 when every cell meets its expectation, 1 otherwise."""
    import shlex

    from bisect_prefetch.matrix import matrix_command

    try:
        result = matrix_command(matrix_file, state_dir=state_dir, console=console, junit=junit,
                                markdown=markdown, json_out=json_out)
    except KeyboardInterrupt:
        console.print("interrupted: finished runs are in the journal; to resume, run again:",
                      markup=False)
        again = ["bisect-prefetch", "matrix", str(matrix_file), f"--state-dir={state_dir}"]
        console.print("  " + shlex.join(again), markup=False, soft_wrap=True)
        raise
    raise typer.Exit(result.exit_code)


@app.command()
def report(
    state: Annotated[Path, typer.Argument(metavar="STATE_DIR", help="An experiment's state dir, e.g. .bisect-prefetch/NAME.")],
    html_out: Annotated[Path | None, typer.Option("--html", help="Write the HTML here (default STATE_DIR/report.html).")] = None,
) -> None:
    """Rebuild the HTML report of a state dir from its journal and run dirs."""
    from bisect_prefetch.report.html import build_report

    if not state.is_dir():
        fail(f"no such state dir: {state}")
    console.print(f"wrote {build_report(state, html_out)}", markup=False)


@app.command()
def compare(
    a: Annotated[Path, typer.Argument(metavar="A", help="A run directory or a log file.")],
    b: Annotated[Path, typer.Argument(metavar="B", help="The run directory or log file to compare with.")],
    fmt: Annotated[str | None, typer.Option("--format", help="Log format: jsonl, mindformers, torchtitan, megatron (default: detected).")] = None,
    json_out: JsonOpt = None,
) -> None:
    """Compare two runs' metrics (and gradient digests): exit 0 identical, 1 different."""
    import json

    from bisect_prefetch.metrics.compare import compare_paths
    from bisect_prefetch.report.compare_table import compare_tables
    from bisect_prefetch.runs.atomic import write_text_atomic

    result = compare_paths(a, b, fmt)
    data = result.to_json()
    for table in compare_tables(data):
        console.print(table)
    for side, path in (("a", a), ("b", b)):
        # A truncated or garbled log still compares on what it holds: say what was skipped.
        if unread := data["lines_unread"][side]:
            console.print(f"note: {unread} line(s) of {path} could not be read "
                          "(truncated or garbled) and were left out", markup=False, soft_wrap=True)
    if json_out is not None:
        write_text_atomic(json_out, json.dumps(data, indent=2) + "\n")
        console.print(f"wrote {json_out}", markup=False)
    raise typer.Exit(1 if result.differs else 0)


@app.command()
def audit(
    experiment: Annotated[Path, typer.Argument(metavar="EXPERIMENT.yaml", help="Experiment YAML.")],
    guard: Annotated[Guard | None, typer.Option("--guard", help="Run under this guard instead of the experiment's.")] = None,
    json_out: JsonOpt = None,
    state_dir: StateDirOpt = Path(".bisect-prefetch"),
) -> None:
    """Audit size-one prefetch edges and the guard: exit 0 when the build is right, 1 otherwise."""
    import json

    from bisect_prefetch.audit_run import audit_table, run_audit, verdict_lines
    from bisect_prefetch.runs.atomic import write_text_atomic

    result = run_audit(experiment, guard=guard.value if guard else None, state_dir=state_dir,
                       console=console)
    console.print(audit_table(result))
    for line in verdict_lines(result):
        console.print(line, markup=False)
    if json_out is not None:
        write_text_atomic(json_out, json.dumps(result, indent=2) + "\n")
        console.print(f"wrote {json_out}", markup=False)
    raise typer.Exit(0 if result["ok"] else 1)


INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C
TERMINATED = 128 + signal.SIGTERM


@contextmanager
def _sigterm_stops_like_ctrl_c():
    """While a command runs, SIGTERM (a scheduler, CI, `kill`) raises KeyboardInterrupt.

    Runs in flight are then killed, the journal keeps every finished run and
    the command prints how to resume, as for Ctrl-C. Further SIGTERMs are
    ignored so they cannot cut that cleanup short (SIGKILL still can, and
    loses no finished run). Yields a list that records the SIGTERM, if one
    came; the previous handler comes back afterwards.
    """
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received  # signal handlers can only be set from the main thread
        return

    def terminate(signum: int, frame: object) -> None:
        received.append(signum)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield received
    finally:
        signal.signal(signal.SIGTERM, previous)


@app.command()
def simulate(
    policy: Annotated[str, typer.Option("--policy", help="Static policy for the graph: mindformers, fsdp2-chain, torchtitan.")],
    layers: Annotated[int, typer.Option("--layers", help="Layer count.")],
    culprit: Annotated[list[str], typer.Option("--culprit", help="Culprit edge selector (repeatable; a glob draws one matching edge per trial).")],
    hazard: Annotated[float, typer.Option("--hazard", help="Per-step chance of drift while the culprit rule holds.")],
    steps: Annotated[int, typer.Option("--steps", help="Steps per run.")],
    together: Annotated[bool, typer.Option("--together", help="The culprits cause drift only together (default: any one suffices).")] = False,
    trials: Annotated[int, typer.Option("--trials", help="Simulated searches.")] = 100,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the simulated noise.")] = 0,
    background: Annotated[float, typer.Option("--background", help="Per-step drift hazard unrelated to prefetch.")] = 0.0,
    startup_cost: Annotated[float, typer.Option("--startup-cost", help="Start-up cost of a run, in steps (adds to the cost figures).")] = 0.0,
    confidence: Annotated[float, typer.Option("--confidence", help="Confidence the search must reach.")] = 0.95,
    max_runs: Annotated[int, typer.Option("--max-runs", help="Run budget of each search.")] = 200,
    method: Annotated[str, typer.Option("--method", help="search, or a baseline: each-edge, binary-pair, binary-repeats, ddmin-repeats.")] = "search",
    json_out: JsonOpt = None,
) -> None:
    """Run the search against a simulated oracle with a known answer, and score it."""
    import json

    from bisect_prefetch.runs.atomic import write_text_atomic
    from bisect_prefetch.search.simulate import simulate as run_simulation

    console.print(f"simulating {trials} searches ({method}) on {policy} x {layers} layers, "
                  f"culprit {' + '.join(culprit)}{' (together)' if together else ''}, "
                  f"hazard {hazard:g} over {steps} steps, seed {seed}...", markup=False)
    result = run_simulation(
        policy, layers, culprit, together=together, hazard=hazard, steps=steps, trials=trials,
        seed=seed, background=background, startup_cost=startup_cost, confidence=confidence,
        max_runs=max_runs, method=method,
    )
    claimed = result["claimed_confidence"]
    console.print(f"per-run divergence chance q = {result['per_run_chance']:.3f} "
                  f"({result['edges']} edges)", markup=False)
    console.print(f"accuracy {result['accuracy']:.3f}"
                  + (f" (claimed confidence {claimed:.3f})" if claimed is not None else ""),
                  markup=False)
    console.print(f"runs: median {result['runs_median']:g}, p90 {result['runs_p90']:g}; "
                  f"steps: median {result['steps_median']:g}", markup=False)
    if json_out is not None:
        write_text_atomic(json_out, json.dumps(result, indent=2) + "\n")
        console.print(f"wrote {json_out}", markup=False)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit code; library errors become one line and 2."""
    with _sigterm_stops_like_ctrl_c() as sigterm:
        try:
            app(args=argv, prog_name="bisect-prefetch")
            code = 0
        except SystemExit as exc:  # typer exits in standalone mode; usage errors exit 2
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        except BisectPrefetchError as exc:
            Console(stderr=True, highlight=False).print(f"error: {exc}", markup=False,
                                                        soft_wrap=True)
            return 2
        except KeyboardInterrupt:  # typer already makes Ctrl-C exit code 130; one outside it
            code = INTERRUPTED
    if code == INTERRUPTED:
        Console(stderr=True).print("terminated" if sigterm else "interrupted")
        return TERMINATED if sigterm else INTERRUPTED
    return code


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()
