"""`bisect-prefetch bisect`: the search against real training runs, narrated and resumable.

Steps: load the experiment, open its state dir (runs/state.py), learn the
graph, run the golden reference, then let the search (search/protocol.py)
ask for masks and the real oracle (runs/oracle.py) run them, each against the
golden all-off trajectory. The search returns structured steps and facts;
this module words them:

    checking that all-on diverges...
      -> diverged at run 2 (step 17)
    checking that all-off is consistent...
      -> clean (1 run)
    ...
    double checking the answer: keep-only:bwd:layers.5->layers.4 should diverge...
      -> diverged at run 3 (step 12)

Every finished run is in the journal and the oracle answers a repeated
question from it, so `--resume` replays the search to where it stopped and
re-runs nothing. bisect.json is written in a `finally:` (an interrupted
search keeps what it learned), with the HTML report.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Protocol

from rich.console import Console
from rich.table import Table

from bisect_prefetch.audit import FAILING_KINDS, audit_run_dir
from bisect_prefetch.commands.common import (
    check_outputs,
    command_line,
    options,
    resume_hint_on_interrupt,
    write_json,
)
from bisect_prefetch.commands.explain import explain_command
from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.experiment import (
    Experiment,
    load_experiment,
    segments_unfit,
    stress_fits,
    with_segments,
    with_stress,
)
from bisect_prefetch.files import write_text_atomic
from bisect_prefetch.report.html import BISECT_FILE, build_report
from bisect_prefetch.report.localization import in_unit
from bisect_prefetch.report.stress import stress_line
from bisect_prefetch.runs.discover import DISCOVERY_STEPS
from bisect_prefetch.runs.execute import RunOutcome
from bisect_prefetch.runs.oracle import Earlier, OnRun, RealOracle
from bisect_prefetch.runs.slots import RunRequest, keep_slots_busy
from bisect_prefetch.runs.state import OpenState, open_state
from bisect_prefetch.runs.step_time import WARMUP_STEPS, fix_cost_line, fix_costs, startup_in_steps
from bisect_prefetch.runs.store import StateDir
from bisect_prefetch.runs.workloads import require_prefetch_graph
from bisect_prefetch.search import verdict as v
from bisect_prefetch.search.oracle import Oracle, RunResult
from bisect_prefetch.search.protocol import Bisection
from bisect_prefetch.search.runlog import (
    AFTER_DROP_ONLY_DIVERGED,
    BACKGROUND_CONTROL,
    Ask,
    Block,
    mask_name,
)
from bisect_prefetch.search.segments import Lengths, Schedule, lengths_for, plan_run, record_run
from bisect_prefetch.search.stress import Hazard, StressChoice, choose_stress
from bisect_prefetch.search.verdict import SearchResult
from bisect_prefetch.vocab import STRESS_AUTO, STRESS_OFF, STRESS_ON, Mask

PURPOSE = "search"
REPRODUCE_RUNS = 4
# --stress auto: all-on runs with and without stress, interleaved, before the search.
STRESS_CALIBRATION_RUNS = 4
# A culprit is a finding (1); so is drift that is not prefetch's, and no answer. No drift: 0.
EXIT_CODES = {"culprit-found": 1, "not-prefetch": 1, "no-drift-reproduced": 0, "inconclusive": 1}


class BisectOracle(Oracle, Protocol):
    """The oracle the command drives: runs masks, and says what it ran and reused."""

    runs_launched: int
    runs_reused: int
    golden_steps: int

    @property
    def golden(self) -> str: ...

    def reuse_earlier(self) -> Earlier: ...

    def deterministic_masks(self) -> list[Mask]: ...


OracleFor = Callable[..., BisectOracle]  # (opened, on_run, *, stress=False)


class RunNumbers:
    """"run N" in a transcript, one way: the N-th run line (a retry and both settings'
    stress calibration runs included). A verdict line or fact that names a run of the
    search names it by its line (`of(k)`: the line of the search's k-th run)."""

    def __init__(self) -> None:
        self.said = 0
        self._lines: list[int] = []  # the line of each run the search recorded

    def __iter__(self) -> RunNumbers:
        return self

    def __next__(self) -> int:
        self.said += 1
        return self.said

    def recorded(self, line: int | None = None) -> None:
        """The search recorded a run: the last line said (or the one given) reported it."""
        self._lines.append(self.said if line is None else line)

    def new_search(self) -> None:
        self._lines = []

    def of(self, run: int) -> int:
        return self._lines[run - 1] if 0 < run <= len(self._lines) else run


def real_oracle(opened: OpenState, on_run: OnRun, *, stress: bool = False) -> RealOracle:
    """Real training runs in the state dir, each against the golden all-off trajectory
    (under stress: every run, the golden all-off one included)."""
    experiment = opened.experiment
    return RealOracle(opened.runner, steps=experiment.steps, guard=experiment.guard,
                      purpose=PURPOSE, on_run=on_run, stress=stress)


# -- the command -------------------------------------------------------------------------
def bisect(
    experiment_path: Path,
    *,
    confidence: float | None,
    max_runs: int | None,
    resume: bool,
    state_dir: Path,
    console: Console,
    json_out: Path | None = None,
    oracle_for: OracleFor = real_oracle,
    executor: str | None = None,
    slots: int | None = None,
    stress: str | None = None,
    segments: str | None = None,
) -> int:
    """Run (or resume) the bisection, print its story and verdict; returns the exit code.

    oracle_for makes the oracle once the state dir is open (tests give a simulated one).
    stress: --stress (off, on, auto), over the experiment's stress.mode; segments:
    --segments (auto, off), over its search.segments.
    """
    experiment = with_segments(with_stress(load_experiment(experiment_path), stress), segments)
    require_prefetch_graph(experiment)
    check_outputs(json_out, state_dir=state_dir, name=experiment.name)
    hint = resume_command(experiment_path, state_dir, confidence, max_runs, executor, slots,
                          stress, segments)
    with resume_hint_on_interrupt(console, hint):
        data = _bisect(
            experiment, experiment_path, hint=hint, resume=resume, state_dir=state_dir,
            confidence=confidence if confidence is not None else experiment.search.confidence,
            max_runs=max_runs if max_runs is not None else experiment.search.max_runs,
            console=console, oracle_for=oracle_for, executor=executor, slots=slots,
        )
    if json_out is not None:
        write_json(json_out, data, console)
    return EXIT_CODES[data["verdict"]]


def _budget_words(max_runs: int | None) -> str:
    if max_runs is None:
        return "a run budget scaled with the graph and the estimated per-run chance"
    return f"at most {max_runs} runs"


def _bisect(experiment: Experiment, experiment_path: Path, *, hint: str, resume: bool,
            state_dir: Path, confidence: float, max_runs: int | None, console: Console,
            oracle_for: OracleFor, executor: str | None = None,
            slots: int | None = None) -> dict:
    began = time.monotonic()
    with open_state(experiment, state_dir, console=console, executor=executor,
                    slots=slots) as opened:
        earlier = _earlier_search_runs(opened.state, experiment)
        if earlier and not resume:
            raise BisectPrefetchError(
                f"{opened.path} already holds {earlier} run(s) of a bisection of this experiment; "
                f"continue it with: {hint}  (or give another --state-dir to start over)"
            )
        console.print(f"bisecting {experiment.name}: {experiment.steps} steps a run, seed "
                      f"{experiment.seed}, guard {experiment.guard}, confidence "
                      f"{confidence:g}, {_budget_words(max_runs)}", markup=False)
        if earlier:
            console.print(f"resuming: {earlier} finished run(s) in the journal are reused",
                          markup=False)
        graph = opened.graph()
        suspects = audit_suspects(opened, console)

        def new_search() -> Bisection:
            return Bisection(graph.edge_ids(), confidence=confidence, max_runs=max_runs,
                             steps_per_run=experiment.steps,
                             all_off_runs=experiment.search.all_off_runs,
                             suspects=suspects)  # a soft prior the runs correct (hints.py)

        search = new_search()
        run_details: list[dict] = []
        mode = experiment.stress.mode
        oracles: dict[bool, BisectOracle] = {}
        earlier: dict[bool, Earlier] = {}  # all-off runs of earlier commands, per stress setting
        numbers = RunNumbers()

        def oracle_of(on: bool) -> BisectOracle:
            if on not in oracles:
                on_run = _run_line(console, run_details, stress=on, numbers=numbers)
                # An oracle of a test may know no stress: it is asked only when stress is.
                oracles[on] = (oracle_for(opened, on_run, stress=True) if on
                               else oracle_for(opened, on_run))
                # Before its first run: the golden run may be an earlier command's.
                earlier[on] = oracles[on].reuse_earlier()
            return oracles[on]

        stress = StressRecord(mode)
        before: list[Earlier] = []  # all-off runs of earlier commands, per search
        result = lengths = None
        unstressed: SearchResult | None = None
        try:
            all_on = Mask(graph.edge_ids())
            if mode == STRESS_AUTO:
                # step 0: does stress make drift show more often? (search/stress.py)
                stress.choice, calibration, lines = calibrate_stress(
                    oracle_of, all_on, steps=experiment.steps, console=console, numbers=numbers)
                stress.used = stress.choice.use
                stress.unstressed_runs = calibration[False]
                stress.unstressed_lines = lines[False]
                reuse_controls(search, earlier[stress.used])  # evidence before the search's own runs
                for outcome, line in zip(calibration[stress.used], lines[stress.used], strict=True):
                    search.record(all_on, outcome)  # the chosen setting's runs count
                    numbers.recorded(line)
            else:
                stress.used = mode == STRESS_ON
                oracle_of(stress.used)
                reuse_controls(search, earlier[stress.used])
            oracle = oracle_of(stress.used)
            console.print("running the golden reference (all-off, full length"
                          + (", under stress" if stress.used else "") + ")...", markup=False)
            say_earlier(earlier[stress.used], console)
            before.append(earlier[stress.used])
            _ = oracle.golden
            lengths = segment_lengths(opened, oracle, console, edges=len(graph.edge_ids()))
            search.golden(oracle.golden_steps)  # one more all-off run: a background control
            result = run_bisection(search, oracle, console=console, numbers=numbers, lengths=lengths)
            if stress.used and result.verdict == "no-drift-reproduced":
                # A stress that hides a race must not clear a build: no drift needs its
                # clean runs without stress too.
                console.print("no drift reproduced under stress; a stress that hides a race "
                              "must not clear a build: searching again without stress...",
                              markup=False)
                search = new_search()
                numbers.new_search()
                plain = oracle_of(False)
                reuse_controls(search, earlier[False])
                for outcome, line in zip(stress.unstressed_runs, stress.unstressed_lines, strict=True):
                    search.record(all_on, outcome)
                    numbers.recorded(line)
                say_earlier(earlier[False], console)
                before.append(earlier[False])
                if lengths is not None:
                    plain.lengthen_golden(lengths.cap_steps)
                _ = plain.golden
                search.golden(plain.golden_steps)
                unstressed = result = run_bisection(search, plain, lengths=lengths, console=console,
                                                    numbers=numbers)
        finally:
            # Keep what was learned even when interrupted: the report shows it.
            partial = result or search.result()
            data = result_to_json(partial, reproduce_command(experiment_path, partial),
                                  run=numbers.of)
            data["experiment"] = experiment.name
            data["elapsed_s"] = round(time.monotonic() - began, 1)  # this command's, to its verdict
            every = list(oracles.values())
            data["deterministic_masks"] = [sorted(m) for o in every for m in o.deterministic_masks()]
            data["runs_launched"] = sum(o.runs_launched for o in every)
            data["runs_reused"] = sum(o.runs_reused for o in every)
            data["earlier_all_off"] = [{"golden": e.golden,
                                        "controls": [out.run_id for out in e.controls]}
                                       for e in before]
            data["runs_lost"] = [lost for o in every for lost in getattr(o, "runs_lost", [])]
            data["segments"] = segments_json(experiment.search.segments, lengths, search)
            data["suspects"] = suspects
            data["hints"] = [n for n in search.notices if n["event"].startswith("hint")]
            data["segments"]["diverged_at_switch"] = [n for n in search.notices
                                                      if n["event"] == "diverged-at-switch"]
            data["run_details"] = run_details  # each run, with where its gradients first differed
            data["stress"] = stress.to_json(run_details, unstressed=unstressed)
            stressed = [r["signals"]["stress"] for r in opened.state.records()
                        if r.get("stress") and (r.get("signals") or {}).get("stress")]
            data["stress"]["record"] = next(  # the first stressed run that delayed anything
                (s for s in stressed if s.get("delays") or s.get("no_window_edges")),
                stressed[0] if stressed else None)
            # What the runs measured (runs/signals.py), as the signals line said it.
            data["signals"] = next((r["signals"] for r in opened.state.records()
                                    if r.get("signals")), None)
            data["step_time"] = fix_costs(
                opened.state.records(), edge_ids=graph.edge_ids(), fix=partial.minimal_set,
                variant_suffix="@" + experiment.fingerprint())
            write_text_atomic(opened.path / BISECT_FILE, json.dumps(data, indent=2) + "\n")
            build_report(opened.path)
    console.print()
    render_result(result, console, reproduce=data["reproduce"], run=numbers.of)
    if explain := explain_command(experiment_path, result.verdict, result.minimal_set):
        console.print(f"explain: {explain}", markup=False, soft_wrap=True)  # the mechanism
    if data["stress"]["mode"] != STRESS_OFF:
        console.print(stress_line(data["stress"]), markup=False, soft_wrap=True)
    elif result.verdict == "no-drift-reproduced" and stress_fits(experiment):
        # A race rarer than the chance ruled out passes unseen (docs/stress.md's race: 4 runs in
        # 60 without stress): say how to look harder.
        ruled_out = next(f.chance for f in result.facts if isinstance(f, v.NoDrift))
        console.print(f"drift at a per-run chance below {ruled_out:.3g} can still hide: for a "
                      "prefetch race, --stress auto checks whether delays before each prefetch "
                      "make it show more often (docs/stress.md)", markup=False, soft_wrap=True)
    cost = fix_cost_line(data["step_time"], result.minimal_set)
    if cost:
        console.print(cost, markup=False, soft_wrap=True)
    console.print(f"runs launched {data['runs_launched']}, reused from the journal "
                  f"{data['runs_reused']}; report: {opened.path / 'report.html'}", markup=False)
    for e in before:
        if e.runs:
            console.print(earlier_words(e), markup=False)
    if data["runs_lost"]:
        console.print(f"runs lost (the scheduler took the job away; retried): "
                      f"{len(data['runs_lost'])}: " + "; ".join(data["runs_lost"]),
                      markup=False, soft_wrap=True)
    return data


def segment_lengths(opened: OpenState, oracle: BisectOracle, console: Console, *,
                    edges: int) -> Lengths | None:
    """search.segments auto: segment length and step cap from the start-up and step time
    this experiment's runs measured (the golden run's at least), and the golden run as
    long as the longest run; None: one mask a run."""
    experiment = opened.experiment
    if experiment.search.segments == "off" or not isinstance(oracle, RealOracle):
        return None
    if unfit := segments_unfit(experiment):
        console.print(f"segments: {unfit}; one mask a run", markup=False)
        return None
    # Measured on the runs before the search's own (and none longer than a run: not the
    # golden run lengthened below), so that a resumed search cuts its runs the same way.
    tail, before = "@" + experiment.fingerprint(), []
    for record in opened.state.records():
        variant = str(record.get("variant", ""))
        if variant.endswith(tail) and variant.partition("+")[0] == PURPOSE:
            break
        if variant.endswith(tail) and record.get("steps", 0) <= experiment.steps:
            before.append(record)
    startup = startup_in_steps(before)
    if startup is None:
        console.print("segments: no run measured its start-up and step time (that takes "
                      f"{WARMUP_STEPS + 1} steps or more); one mask a run", markup=False)
        return None
    lengths = lengths_for(experiment.steps, startup, edges)
    if lengths.segment_steps == lengths.steps_per_run:
        cut = (f"a run holds up to {lengths.cap_steps // lengths.steps_per_run} masks of "
               f"{lengths.steps_per_run} steps each")
    else:
        cut = (f"search masks change every {lengths.segment_steps} steps (checks every "
               f"{lengths.steps_per_run}), runs go up to {lengths.cap_steps} steps")
    console.print(f"segments: a start-up costs {startup:.0f} steps' worth of time; {cut} "
                  "(search/segments.py)", markup=False)
    if lengths.cap_steps > oracle.golden_steps:
        console.print(f"running the golden reference again, {lengths.cap_steps} steps: as "
                      "long as the longest run...", markup=False)
        oracle.lengthen_golden(lengths.cap_steps)
        _ = oracle.golden
    return lengths


def segments_json(mode: str, lengths: Lengths | None, search: Bisection) -> dict:
    """The bisect JSON's `segments` (docs/contract.md): how runs were cut, and start-ups."""
    return {"mode": mode, "used": lengths is not None,
            "segment_steps": lengths.segment_steps if lengths else None,
            "cap_steps": lengths.cap_steps if lengths else None,
            "startups": search.startups, "trials": search.runs_used}


def reuse_controls(search: Bisection, earlier: Earlier) -> None:
    """All-off runs of earlier commands compared with the golden run: the search's first
    background controls (runs/oracle.py earlier_all_off), before any run of its own."""
    for out in earlier.controls:
        search.reuse(Mask(), out.result())


def say_earlier(earlier: Earlier, console: Console) -> None:
    if earlier.runs:
        console.print(f"  -> {earlier_words(earlier)}", markup=False, soft_wrap=True)


def earlier_words(earlier: Earlier) -> str:
    """e.g. "reused 3 all-off runs of earlier commands as the golden run and background controls"."""
    runs = earlier.runs
    what = "the golden run" + (" and background controls" if earlier.controls else "")
    diverged = sum(1 for out in earlier.controls if out.diverged)
    return (f"reused {runs} all-off run{'s' if runs != 1 else ''} of earlier commands as {what} "
            f"(golden {earlier.golden}"
            + (f"; {diverged} diverged from it: drift without prefetch" if diverged else "") + ")")


# -- stress ---------------------------------------------------------------------------------
class StressRecord:
    """What the command did about stress, for the JSON, the report and the verdict's line."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.used = False
        self.choice: StressChoice | None = None
        self.unstressed_runs: list[RunResult] = []  # auto: the calibration runs without stress
        self.unstressed_lines: list[int] = []  # and the run lines that said them

    def to_json(self, run_details: list[dict], *,
                unstressed: SearchResult | None) -> dict:
        """mode, used, the chance with and without (auto), the step time of each."""
        times = {on: sorted(d["step_time_ms"] for d in run_details
                            if d.get("stress") == on and d.get("step_time_ms"))
                 for on in (False, True)}
        medians = {on: (t[len(t) // 2] if t else None) for on, t in times.items()}
        ratio = (medians[True] / medians[False]
                 if medians[True] and medians[False] else None)
        out = {"mode": self.mode, "used": self.used,
               "step_time_ms": {"without": medians[False], "with": medians[True],
                                "ratio": ratio},
               "chance_without": None, "chance_with": None, "chance_raised": None,
               "unstressed_search": None}
        if self.choice is not None:
            out["chance_without"] = self.choice.without.to_json()
            out["chance_with"] = self.choice.with_stress.to_json()
            out["chance_raised"] = self.choice.chance_raised
        if unstressed is not None:
            out["unstressed_search"] = {"verdict": unstressed.verdict,
                                        "runs_used": unstressed.runs_used}
        return out


def calibrate_stress(oracle_of: Callable[[bool], BisectOracle], all_on: Mask, *, steps: int,
                     console: Console, numbers: RunNumbers | None = None,
                     ) -> tuple[StressChoice, dict[bool, list[RunResult]], dict[bool, list[int]]]:
    """All-on with and without stress, interleaved so both meet the same machine load;
    the choice (search/stress.py), each setting's runs and the run lines that said them."""
    n = STRESS_CALIBRATION_RUNS
    console.print(f"checking whether stress makes drift show more often: all-on, {n} runs "
                  f"without stress and {n} with, interleaved...", markup=False)
    runs: dict[bool, list[RunResult]] = {False: [], True: []}
    lines: dict[bool, list[int]] = {False: [], True: []}
    for _ in range(n):
        for on in (False, True):
            runs[on].append(oracle_of(on).run(all_on))
            lines[on].append(numbers.said if numbers is not None else 0)
    hazards = {on: Hazard.of([r.first_diff_step if r.diverged else None
                              for r in outcomes if r.completed], steps=steps)
               for on, outcomes in runs.items()}
    choice = choose_stress(hazards[False], hazards[True])
    console.print(f"  -> {stress_choice_words(choice)}", markup=False, soft_wrap=True)
    return choice, runs, lines


def _chance(hazard: Hazard) -> str:
    low, high = hazard.per_run_interval()
    return (f"{hazard.per_run_chance():.2f} (95% interval {low:.2f}-{high:.2f}; "
            f"{hazard.divergences} of {hazard.runs} runs)")


def stress_choice_words(choice: StressChoice) -> str:
    """e.g. "stress raises the per-run chance from 0.42 (...) to 0.97 (...); using it"."""
    if choice.use:
        return (f"stress raises the per-run chance from {_chance(choice.without)} to "
                f"{_chance(choice.with_stress)}; using it (chance it raises the per-step hazard "
                f"{choice.chance_raised:.2f})")
    return (f"stress does not raise the per-run chance ({_chance(choice.without)} without, "
            f"{_chance(choice.with_stress)} with; chance it raises the per-step hazard "
            f"{choice.chance_raised:.2f}); not using it")


def audit_suspects(opened: OpenState, console: Console) -> list[str]:
    """Edges the audit of the discovery run flags as wasting work or racing (audit.py).

    The search gives them more prior weight; with no discovery run (a static
    graph) or no order recorded there are none.
    """
    key = opened.runner.key("discover", mask=None, guard="none", steps=DISCOVERY_STEPS, index=0,
                            stress=False)
    found = opened.state.find(key)
    if found is None:
        return []
    try:
        result = audit_run_dir(opened.state.run_dir(found["run_id"]))
    except BisectPrefetchError:
        return []
    failing = [f for f in result["findings"] if f["kind"] in FAILING_KINDS]
    suspects = sorted({f["edge"] for f in failing})
    kinds = sorted({f["kind"] for f in failing})
    if suspects:
        console.print(f"audit of the discovery run: {len(suspects)} suspect edge(s) "
                      f"({', '.join(kinds)}): {', '.join(suspects)}; the search starts with "
                      "more weight on them", markup=False, soft_wrap=True)
    else:
        console.print("audit of the discovery run: no suspect edge", markup=False)
    return suspects


def _earlier_search_runs(state: StateDir, experiment: Experiment) -> int:
    """Journaled runs of a bisection of this very experiment (golden and retries too)."""
    suffix = "@" + experiment.fingerprint()
    return sum(1 for r in state.records()
               if r["variant"].startswith(PURPOSE) and r["variant"].endswith(suffix))


def resume_command(experiment_path: Path, state_dir: Path, confidence: float | None,
                   max_runs: int | None, executor: str | None = None,
                   slots: int | None = None, stress: str | None = None,
                   segments: str | None = None) -> str:
    return command_line("bisect", str(experiment_path), *options(
        resume=True, state_dir=state_dir, confidence=confidence, max_runs=max_runs,
        executor=executor, slots=slots, stress=stress, segments=segments))


def reproduce_mask(result: SearchResult) -> str | None:
    """The --mask value that reproduces the drift: keep-only of the minimal set."""
    return "keep-only:" + ",".join(result.minimal_set) if result.minimal_set else None


def reproduce_command(experiment_path: Path, result: SearchResult) -> str:
    return command_line("aa", str(experiment_path),
                        *options(runs=REPRODUCE_RUNS, mask=reproduce_mask(result)))


def _run_line(console: Console, details: list[dict] | None = None, *, stress: bool = False,
              numbers: Iterator[int] | None = None):
    """One line per run: which, how it ended, how long (or that the journal had it).

    details, when given, gets each run's record for the JSON's run_details; the oracles
    of one command share it and the run numbers.
    """
    numbers = numbers if numbers is not None else itertools.count(1)

    def on_run(planned: Mask | tuple[tuple[int, Mask], ...], out: RunOutcome) -> None:
        segmented = isinstance(planned, tuple)
        mask = planned[0][1] if segmented else planned
        if details is not None:
            details.append({"run_id": out.run_id, "mask": sorted(mask), "outcome": out.outcome,
                            "steps_done": out.steps_done, "first_diff_step": out.first_diff_step,
                            "localization": out.localization, "fault": out.fault,
                            "reused": out.reused, "stress": stress,
                            "step_time_ms": out.step_time_ms})
            if segmented:
                details[-1]["schedule"] = [[first, sorted(m)] for first, m in planned]
        if out.usable and out.diverged:
            how = f"diverged at step {out.first_diff_step}{in_unit(out.localization)}"
        elif out.usable:
            how = f"clean over {out.steps_done} steps"
        else:
            how = f"{out.outcome}: {out.why()}"
        when = "from the journal" if out.reused else f"{out.wall_s or 0:.1f}s"
        under = ", stress" if stress else ""
        what = (f"{len(planned)} segments, {len(mask)} edges on first" if segmented
                else f"{len(mask)} edges on")
        console.print(f"    run {next(numbers)} ({what}{under}): {how} [{when}]", markup=False)

    return on_run


# -- driving the search -------------------------------------------------------------------
class _Narrator:
    """Says a step's title before its first run and its `->` verdict line once it is over.

    One run at a time, a step is over when the next one is announced. With several
    slots, runs of several steps interleave: a step is over once a run of a later step
    was recorded (or at the end), and its verdict line names the step.
    """

    def __init__(self, search: Bisection, console: Console, numbers: RunNumbers, *,
                 interleaved: bool = False) -> None:
        self.search = search
        self.console = console
        self.numbers = numbers
        self.interleaved = interleaved
        events = search.events
        self.closed = len(events)  # blocks recorded before this drive are not its to say
        self.titled = [(events[-1].stage, events[-1].enabled)] if events else []
        self.notices_said = len(search.notices)  # the audit's suspects are already said
        self.units_said: set[str] = set()

    def before(self, ask: Ask) -> None:
        """Before a run of the mask the search asks for (`search.pending`)."""
        if self.titled[-1:] == [(ask.stage, ask.mask)]:
            return  # the same step goes on
        events = self.search.events
        self.close(len(events) - 1 if self.interleaved else len(events))  # a step may go on
        name = mask_name(ask.mask, self.search.edge_ids)
        self.console.print(f"{step_title(ask.stage, name, ask.target, ask.context)}...",
                           markup=False)
        self.titled.append((ask.stage, ask.mask))

    def recorded(self) -> None:
        """After a run was recorded: the steps it ended, and what its localization did to
        the search (once a unit)."""
        self.close(len(self.search.events) - 1)  # every block but the last is complete
        for notice in self.search.notices[self.notices_said:]:
            if notice["event"] == "diverged-at-switch" or notice.get("unit") not in self.units_said:
                self.console.print(f"  {notice_line(notice)}", markup=False)
                self.units_said.add(notice.get("unit"))
        self.notices_said = len(self.search.notices)

    def close(self, upto: int | None = None) -> None:
        """The verdict lines of the blocks before `upto` (None: all) not yet said. A step
        interrupted before its first run finished has no block, and no verdict yet."""
        events = self.search.events
        upto = len(events) if upto is None else upto
        for block in events[self.closed:upto]:
            which = (f"{step_title(block.stage, block.mask, block.target, block.context)}: "
                     if self.interleaved else "")
            self.console.print(f"  -> {which}{verdict_line(block, run=self.numbers.of)}",
                               markup=False)
        self.closed = max(self.closed, upto)


def run_bisection(search: Bisection, oracle: Oracle, *, console: Console,
                  numbers: RunNumbers | None = None, lengths: Lengths | None = None) -> SearchResult:
    """Run the search to its verdict, narrating each step; returns the result.

    One loop for any number of slots; serial is one slot. With several, whenever a
    slot frees the search proposes the next run from everything finished and
    everything still in flight, and each result is recorded as it arrives. With one,
    the run is not marked in flight (`pending`, then `record`): nothing else is asked
    while it runs, and the search decides exactly as it does serially. A resumed search
    needs no replay here: the real oracle answers runs that finished from the journal.
    lengths: several masks per run (search/segments.py); each run's segments are
    planned before it starts and said, with what each showed, once it ended.
    """
    numbers = numbers if numbers is not None else RunNumbers()
    slots = oracle.runner.executor.slots if isinstance(oracle, RealOracle) else 1
    narrator = _Narrator(search, console, numbers, interleaved=slots > 1 or lengths is not None)

    def propose() -> Ask | Schedule | None:
        nonlocal lengths
        if search.done or search.pending is None:
            return None  # done, or nothing to ask before a result arrives
        refused = oracle.schedule_refused if isinstance(oracle, RealOracle) else None
        if lengths is not None and refused:
            console.print(f"segments: {refused}; one mask a run from here", markup=False)
            lengths = None
        if lengths is not None:
            return plan_run(search, lengths)
        ask = search.pending
        narrator.before(ask)
        if slots > 1:
            search.propose()  # in flight: the next free slot gets another question
        return ask

    def arrived(planned: Mask | Schedule, result: RunResult) -> None:
        if search.done:
            return  # runs that arrive after the verdict are not evidence
        trials = search.runs_used
        if isinstance(planned, Schedule):
            record_run(search, planned, result)
        else:
            search.record(planned, result)
        for _ in range(search.runs_used - trials):  # a segment's trial is its run's line
            numbers.recorded()
        narrator.recorded()

    try:
        if isinstance(oracle, RealOracle):
            _in_slots(oracle, propose, arrived, stop=lambda: search.done)
        else:  # an oracle that answers at once (a simulation): one slot
            while (planned := propose()) is not None:
                if isinstance(planned, Schedule):
                    arrived(planned, oracle.run_schedule(planned))
                else:
                    arrived(planned.mask, oracle.run(planned.mask))
    finally:
        narrator.close()  # an interrupted step still gets its verdict line
    return search.result()


def _in_slots(oracle: RealOracle, propose: Callable[[], Ask | Schedule | None],
              arrived: Callable[[Mask | Schedule, RunResult], None], *,
              stop: Callable[[], bool]) -> None:
    """The runs the search asks for on the executor's slots (runs/slots.py); a run that
    failed is retried in the next free slot; runs still in flight at the verdict are
    cancelled."""
    retries: list[RunRequest] = []
    schedules: dict[tuple, list[Schedule]] = {}  # runs of several masks in flight, by masks

    def request() -> RunRequest | None:
        if retries:
            return retries.pop(0)
        planned = propose()
        if planned is None:
            return None
        if isinstance(planned, Ask):
            return oracle.request(planned.mask)
        schedules.setdefault(tuple(planned.masks), []).append(planned)
        return oracle.request_schedule(planned.masks, planned.steps)

    def finished(request: RunRequest, out: RunOutcome) -> None:
        answer = oracle.finished(request, out)
        if isinstance(answer, RunRequest):
            retries.append(answer)
        elif request.key.schedule is None:
            arrived(request.tag[0], answer)
        else:
            arrived(schedules[request.tag[0]].pop(0), answer)

    keep_slots_busy(oracle.runner, request, finished, stop=stop)


# -- wording the search's steps and facts ---------------------------------------------------
def _runs(n: int) -> str:
    return f"{n} run{'s' * (n != 1)}"


def step_title(stage: str, mask: str, target: Sequence[str], context: str | None) -> str:
    """What a protocol step checks, e.g. "checking that all-on diverges" (the numbered
    steps of search/protocol.py, one stage each)."""
    names = ",".join(target)
    # step 1: calibrate
    if stage == "calibrate":
        return "checking that all-on diverges"
    # step 2: check-off (and the all-off runs of step 4's double check)
    if stage == "check-off":
        if context == AFTER_DROP_ONLY_DIVERGED:
            return "drop-only still diverges: checking that all-off is consistent"
        if context == BACKGROUND_CONTROL:
            return "ruling out drift without prefetch as strong as the answer's: checking that all-off is consistent"
        return "checking that all-off is consistent"
    # step 5: search
    if stage == "search":
        return f"testing {mask}"
    # step 3: reduce
    if stage == "reduce":
        return f"reducing the {len(target)} edges every diverged run enabled: testing {mask}"
    # step 4: double check (keep-only also ends step 5 once a set leads)
    if stage == "keep-only":
        return f"double checking the answer: {f'keep-only:{names}' if target else 'all-off'} should diverge"
    if stage == "drop-only":
        return f"double checking the answer: drop-only:{names} should be consistent"
    return f"recorded run of {mask}"  # "extra": a run the search did not ask for


def notice_line(notice: dict) -> str:
    """What a localization hint (hints.py's events) or a divergence at a switch of masks
    (segments.py) does to the search, in words."""
    event, unit = notice["event"], notice.get("unit")
    if event == "diverged-at-switch":
        before, after = (len(m) for m in notice["masks"])
        return (f"diverged at step {notice['step']}, the first step under a new mask: the drift "
                f"may come from the step before, so it counts against both masks ({before} and "
                f"{after} edges on)")
    if event == "hint":
        edges = ", ".join(notice["edges"]) or "its neighbours' edges"
        return (f"localization points at {unit}: the search weighs {edges} first "
                "(a hint the runs can overrule)")
    if event == "hint-ignored" and notice["reason"] == "unknown-unit":
        return f"localization points at {unit}, which no edge of the graph touches: hint ignored"
    if event == "hint-ignored":
        return f"a hint for {unit} from a run that did not diverge: ignored"
    if event == "suspect-ignored":
        return f"audit suspect {notice['edge']} is not an edge of the graph: ignored"
    return f"audit suspects: {', '.join(notice['edges'])}"


def _same(run: int) -> int:
    return run


def verdict_line(block: Block, *, run: Callable[[int], int] = _same) -> str:
    """A block's verdict, e.g. "diverged at run 12 (step 17)" or "clean (9 runs)"; run: the
    transcript's number of the search's k-th run (RunNumbers.of)."""
    failed = f", {block.errors} failed" if block.errors else ""
    if block.divergences:
        first = run(block.first_run + block.diverged_at - 1)
        return f"diverged at run {first} (step {block.first_diff_steps[0]}){failed}"
    clean = block.runs - block.errors
    if clean:
        return f"clean ({_runs(clean)}{failed})"
    return f"unresolved ({_runs(block.errors)} failed)"


STOP_REASONS = {
    "all-on-never-completed": "all-on never completed a run",
    "all-unresolved": "every informative mask is unresolved",
    "keep-only-never-completed": "keep-only of the answer never completed a run",
}


def fact_line(fact: v.Fact, *, confidence: float, run: Callable[[int], int] = _same) -> str:
    """One checked statement behind a verdict, in words."""
    names = ",".join(getattr(fact, "edges", ()))
    match fact:
        case v.NoDrift():
            return (f"every edge enabled in {fact.runs} clean runs ({fact.all_on} of them all-on), none "
                    f"diverged: a per-run chance of {fact.chance:.3g} or more is ruled out at "
                    f"{confidence:.0%} (fewer than 3/{fact.runs})")
        case v.BackgroundRuledOut():
            level = 1 - (1 - fact.chance) ** fact.runs  # the search's confidence (stats.upper_bound_none_seen)
            shown = 1 - (1 - fact.strength) ** fact.runs  # drift as strong as the answer's would have shown
            golden = f" (counting the golden run as {fact.golden:.3g}: the steps runs matched)" if fact.golden else ""
            ruled_out = (f"all-off and drop-only:{names} after the search: {fact.runs:.3g} runs{golden}, all "
                         f"consistent: drift without prefetch at a per-run chance of {fact.chance:.3g} or more "
                         f"is ruled out at {level:.0%}")
            if shown >= 1 - (1 - level) / 2:  # what search.all_off_runs: auto asks for
                return f"{ruled_out}; as strong as the answer's ({fact.strength:.3g}), it would have shown at {shown:.1%}"
            return (f"{ruled_out} (the answer's: {fact.strength:.3g}; search.all_off_runs: auto "
                    "would rule out drift as strong as the answer's)")
        case v.AllOffDiverged():
            return (f"all-off diverged ({fact.divergences} of {fact.runs} runs): "
                    "drift happens with every prefetch edge off, so it has another cause")
        case v.Background():
            return (f"all-off diverged too ({fact.divergences} of {fact.runs} runs): drift without "
                    f"prefetch at a per-run chance of about {fact.chance:.3g}, and the set's stands "
                    "clearly above it")
        case v.Stopped():
            if fact.reason == "not-finished":
                why = "not finished"
            elif fact.reason == "max-runs":
                why = f"stopped: the run budget (--max-runs {fact.limit}) ran out"
            else:
                why = f"stopped: {STOP_REASONS[fact.reason]}"
            guess = "{" + names + "}" if fact.edges else "no edge (drift without prefetch)"
            return f"{why}; best guess {guess} at probability {fact.chance:.3f}"
        case v.KeepOnlyDiverged():
            return (f"keep-only:{names} diverged (run {run(fact.run)}, step {fact.step}): "
                    "the set is enough for drift")
        case v.EachNeeded() if len(fact.edges) == 2:
            (a, b), (without_a, without_b) = fact.edges, fact.clean_without
            return (f"each edge of the set is needed: {_runs(without_b)} enabling {a} without {b} "
                    f"and {_runs(without_a)} enabling {b} without {a} stayed consistent")
        case v.EachNeeded():
            each = ", ".join(f"{edge}: {n}" for edge, n in zip(fact.edges, fact.clean_without, strict=True))
            return (f"each edge of the set is needed: runs with the rest of the set but not the edge "
                    f"stayed consistent ({each}); the chance that one of them was not needed after "
                    f"all is {fact.chance:.2g}")
        case v.DropOnlyDiverges():
            return (f"drop-only:{names} still diverges while all-off stayed consistent "
                    f"({_runs(fact.all_off_clean)}): another set of edges causes drift too")
        case v.DropOnlyConsistent():
            return f"drop-only:{names}: {_runs(fact.runs)}, all consistent: removing the set removes drift"
        case v.DropOnlyFailed():
            return f"drop-only:{names} could not be run ({fact.errors} failed)"
        case v.DropOnlyNotRun():
            return f"drop-only:{names} was not run: the run budget ran out"
    raise ValueError(f"unknown fact {fact!r}")


def fact_lines(result: SearchResult, *, run: Callable[[int], int] = _same) -> list[str]:
    return [fact_line(fact, confidence=result.confidence, run=run) for fact in result.facts]


# -- the result ---------------------------------------------------------------------------
def render_result(result: SearchResult, console: Console, *, reproduce: str | None = None,
                  run: Callable[[int], int] = _same) -> None:
    """Verdict, minimal set, confidence, runs and steps, the facts, evidence and calibration."""
    console.print(f"verdict: {result.verdict}", markup=False)
    if result.minimal_set:
        console.print(f"minimal set: {', '.join(result.minimal_set)}", markup=False)
    runs = (f"runs: {result.runs_used}" if result.startups is None
            else f"runs: {result.startups} ({result.runs_used} trials, several masks a run)")
    console.print(f"confidence: {result.confidence:.3f}   {runs}   steps: {result.steps_used}")
    for fact in fact_lines(result, run=run):
        console.print(f"  - {fact}", markup=False)
    console.print(evidence_table(result))
    calibration = result.calibration
    if calibration["runs"]:
        low, high = calibration["interval"]
        hazard = calibration["hazard_per_step"]
        hazard_text = f", per-step hazard {hazard:.3g}" if hazard is not None else ""
        console.print(
            f"per-run chance {calibration['per_run_chance']:.3g} "
            f"({calibration['interval_confidence']:.0%} interval {low:.3g}-{high:.3g}){hazard_text}, "
            f"from {calibration['runs']} runs that enabled "
            f"{'the set' if result.minimal_set else 'every edge (all-on)'}",
            markup=False,
        )
    if reproduce:
        console.print(f"reproduce: {reproduce}", markup=False)


def evidence_table(result: SearchResult) -> Table:
    table = Table(title="evidence", title_justify="left")
    for column in ("step", "mask", "edges", "runs", "diverged", "first differing steps", "verdict"):
        table.add_column(column, overflow="fold")
    for row in result.evidence:
        steps = ", ".join(str(s) for s in row["first_diff_steps"]) or "-"
        runs = str(row["runs"]) + (f" ({row['errors']} failed)" if row["errors"] else "")
        table.add_row(
            row["step"], row["mask"], str(row["edges"]), runs, str(row["divergences"]), steps,
            row["verdict"],
        )
    return table


def result_to_json(result: SearchResult, reproduce: str, *,
                   run: Callable[[int], int] = _same) -> dict:
    """The bisect JSON of docs/contract.md: verdict, minimal_set, confidence, runs_used, steps_used,
    evidence, reproduce; plus the facts (in words), calibration and best hypotheses."""
    return {
        "verdict": result.verdict,
        "minimal_set": list(result.minimal_set),
        "confidence": result.confidence,
        "runs_used": result.runs_used,
        "steps_used": result.steps_used,
        "evidence": [dict(row) for row in result.evidence],
        "reproduce": reproduce,
        "facts": fact_lines(result, run=run),
        "drop_only_diverges": result.drop_only_diverges,
        "calibration": dict(result.calibration),
        "top_hypotheses": list(result.top_hypotheses),
        "finished": result.finished,
    }
