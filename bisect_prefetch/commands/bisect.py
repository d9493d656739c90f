"""`bisect-prefetch bisect`: the search against real training runs, narrated and resumable.

The command reads as its stages (`_bisect`), each printed as it happens:
1. the graph and the audit's suspects (the search weighs them first);
2. stress calibration (--stress auto): all-on without and with stress, in pairs
   until they settle whether stress raises the hazard;
3. the golden run: the all-off reference every run is compared with;
4. segment lengths (search.segments auto): the search's first checks (all-on, all-off)
   one mask a run, then how many masks a run holds, or one where that costs less;
5. the search (its own stages live in search/protocol.py), driven by the one
   loop of commands/bisect_loop.py through the oracle's slots;
6. no drift under stress -> the same search without it;
7. --explain: each cause's first divergence, traced (commands/bisect_explain.py).

    checking that all-on diverges...
      -> diverged at run 2 (step 17)
    checking that all-off is consistent...
      -> clean (1 run)

Every finished run is in the journal and the oracle answers a repeated
question from it, so `--resume` replays the search to where it stopped and
re-runs nothing it finished (runs/sessions.py: its own session's runs only, after
the checks of runs/reuse.py; `--reuse` takes earlier commands' runs too).
bisect.json (commands/bisect_record.py) is written in a `finally:` (an
interrupted search keeps what it learned), with the HTML report.
The words are commands/bisect_words.py's.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from rich.console import Console

from bisect_prefetch.commands.bisect_explain import explain_causes, with_traced_hints
from bisect_prefetch.commands.bisect_loop import run_bisection
from bisect_prefetch.commands.bisect_record import (
    ONE_CAUSE,
    BisectRecord,
    result_to_json,
)
from bisect_prefetch.commands.bisect_setup import Bisecting, OracleFor, bisect_record, start_search
from bisect_prefetch.commands.bisect_words import (
    budget_words,
    earlier_words,
    lengths_words,
    render_result,
    say_after_verdict,
    stage_title,
    stress_choice_words,
)
from bisect_prefetch.commands.common import (
    Given,
    check_outputs,
    resume_hint_on_interrupt,
    reuse_options,
    search_settings,
    write_json,
)
from bisect_prefetch.drivers.oracle import OnRun, RealOracle
from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.experiment import (
    Experiment,
    load_experiment,
    segments_unfit,
    steps_fixed,
    with_segments,
    with_stress,
)
from bisect_prefetch.files import write_text_atomic
from bisect_prefetch.judge.audit import FAILING_KINDS, audit_run_dir
from bisect_prefetch.judge.step_time import WARMUP_STEPS, startup_in_steps
from bisect_prefetch.report.html import BISECT_FILE, REPORT_FILE, build_report
from bisect_prefetch.runs.discover import DISCOVERY_STEPS
from bisect_prefetch.runs.sessions import SESSION_FIELD, Scope
from bisect_prefetch.runs.state import OpenState, open_state
from bisect_prefetch.runs.workloads import require_prefetch_graph
from bisect_prefetch.search.oracle import RunResult
from bisect_prefetch.search.segments import Lengths, lengths_for
from bisect_prefetch.search.stress import (
    SEQUENTIAL,
    STOP_BOTH,
    STOP_NOT_RAISED,
    STOP_RAISED,
    CalibrationRule,
    Hazard,
    StressChoice,
)
from bisect_prefetch.search.verdict import SearchResult
from bisect_prefetch.vocab import (
    STAGE_CALIBRATE,
    STAGE_CHECK_OFF,
    STRESS_AUTO,
    STRESS_ON,
    VERDICT_FOUND,
    VERDICT_INCONCLUSIVE,
    VERDICT_NO_DRIFT,
    VERDICT_NOT_PREFETCH,
    Mask,
)

PURPOSE = "search"
# --stress auto: all-on runs without and with stress, in pairs, before the search, until
# the rule says the pairs have settled whether stress raises the hazard (search/stress.py).
STRESS_CALIBRATION: CalibrationRule = SEQUENTIAL
# A culprit is a finding (1); so is drift that is not prefetch's, and no answer. No drift: 0.
EXIT_CODES = {VERDICT_FOUND: 1, VERDICT_NOT_PREFETCH: 1, VERDICT_NO_DRIFT: 0, VERDICT_INCONCLUSIVE: 1}


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
    reuse: bool | None = None,
    explain: bool = False,
) -> int:
    """Run (or resume) the bisection, print its story and verdict; returns the exit code.

    oracle_for makes the oracle once the state dir is open (tests give a simulated one).
    stress: --stress (off, on, auto), over the experiment's stress.mode; segments:
    --segments (auto, off), over its search.segments; reuse: --reuse (True: earlier
    commands' runs after the checks), --no-reuse (False: none, and a new bisection where
    the state dir holds one) or neither (None); explain: each cause's first divergence
    traced after the verdict (commands/bisect_explain.py).
    """
    experiment = with_segments(with_stress(load_experiment(experiment_path), stress), segments)
    require_prefetch_graph(experiment)
    search_settings(experiment, confidence=confidence, max_runs=max_runs)  # checked before any run
    check_outputs(json_out, state_dir=state_dir, name=experiment.name)
    given = Given("bisect", experiment_path, {
        "state_dir": state_dir, "confidence": confidence, "max_runs": max_runs,
        "executor": executor, "slots": slots, "stress": stress, "segments": segments,
        "explain": explain, "json": json_out, "resume": resume, **reuse_options(reuse)})
    hint = given.follow_up(resume=True)
    with resume_hint_on_interrupt(console, hint):
        record = _bisect(
            experiment, experiment_path, hint=hint, resume=resume, state_dir=state_dir,
            confidence=confidence if confidence is not None else experiment.search.confidence,
            max_runs=max_runs if max_runs is not None else experiment.search.max_runs,
            console=console, oracle_for=with_traced_hints(oracle_for), executor=executor,
            slots=slots, given=given, reuse=reuse, explain=explain,
        )
    if json_out is not None:
        write_json(json_out, record.to_json(), console)
    return EXIT_CODES[record.verdict]


def _bisect(experiment: Experiment, experiment_path: Path, *, hint: str, resume: bool,
            state_dir: Path, confidence: float, max_runs: int | None, console: Console,
            oracle_for: OracleFor, executor: str | None = None,
            slots: int | None = None, given: Given | None = None,
            reuse: bool | None = None, explain: bool = False) -> BisectRecord:
    began = time.monotonic()
    given = given or Given("bisect", experiment_path, {"state_dir": state_dir})
    scope = Scope("bisect", resume=resume, earlier=bool(reuse))
    with open_state(experiment, state_dir, console=console, executor=executor,
                    slots=slots, scope=scope) as opened:
        b = Bisecting(experiment, opened, console, oracle_for, confidence, max_runs, given)
        _say_what_runs(b, hint=hint, resume=resume, fresh=reuse is False)
        # stage 1: the graph and the audit's suspects
        opened.graph()
        b.discovery, audit = discovery_audit(opened)
        if audit is not None:
            b.suspects = audit_suspects(opened, console, audit)
            b.size_one = sorted(e["id"] for e in audit["edges"] if e.get("size_one"))
        try:
            # stage 2: does stress make drift show more often? (--stress auto)
            if b.stress.mode == STRESS_AUTO:
                _calibrate_stress(b)
            else:
                b.stress.used = b.stress.mode == STRESS_ON
            # stage 3: the golden run
            b.current = start_search(b, b.stress.used)
            console.print("running the golden reference (all-off, full length"
                          + (", under stress" if b.stress.used else "") + ")...", markup=False)
            _golden_run(b)
            # stage 4: segment lengths (search.segments auto)
            b.lengths = _segment_lengths(b)
            # stage 5: the search
            b.result = _search(b)
            # stage 6: no drift under stress -> the same search without stress
            if b.stress.used and b.result.verdict == VERDICT_NO_DRIFT:
                b.unstressed = b.result = _search_without_stress(b)
        finally:
            # Keep what was learned even when interrupted: the report shows it.
            record = bisect_record(b, began)
            write_text_atomic(opened.path / BISECT_FILE,
                              json.dumps(record.to_json(), indent=2) + "\n")
            build_report(opened.path)
    if explain:  # stage 7: each cause's first divergence (commands/bisect_explain.py)
        explain_causes(experiment_path, record.next_steps, state_dir=state_dir,
                       stressed=b.stress.used, console=console, resume=resume,
                       reuse=reuse)
        write_text_atomic(opened.path / BISECT_FILE, json.dumps(record.to_json(), indent=2) + "\n")
        build_report(opened.path)
    console.print()
    render_result(record.to_json(), console)
    say_after_verdict(record.result, record.to_json(), experiment, console,
                      report=opened.path / REPORT_FILE, before=b.before)
    return record


def _say_what_runs(b: Bisecting, *, hint: str, resume: bool, fresh: bool) -> None:
    """The command's first lines; a second bisection of the same experiment needs --resume
    (or --no-reuse: a new one beside it)."""
    experiment, opened = b.experiment, b.opened
    earlier = _earlier_search_runs(opened, experiment)
    if earlier and not resume and not fresh:
        raise BisectPrefetchError(
            f"{opened.path} already holds {earlier} run(s) of a bisection of this experiment; "
            f"continue it with: {hint}  (or begin a new one with --no-reuse, or give another "
            "--state-dir)"
        )
    b.console.print(f"bisecting {experiment.name}: {experiment.steps} steps a run, seed "
                    f"{experiment.seed}, guard {experiment.guard}, confidence "
                    f"{b.confidence:g}, {budget_words(b.max_runs)}", markup=False)
    own = _earlier_search_runs(opened, experiment, own_session=True) if resume else 0
    if own:  # only what may still be taken (runs/reuse.py) is said to be
        kept = _earlier_search_runs(opened, experiment, own_session=True, reusable_only=True)
        again = "" if kept == own else (
            f"; {own - kept} run again, first because: {opened.runner.refused[0][1]}")
        b.console.print(f"resuming: {kept} finished run(s) in the journal are reused{again}",
                        markup=False, soft_wrap=True)
    if own and _written_for_one_cause(opened.path / BISECT_FILE):
        b.one_cause = True  # the search that wrote the journal, so its runs answer the same questions
        b.console.print("this bisection was begun by a version that searches for one cause: it "
                        "replays as one (a new --state-dir searches for every cause)",
                        markup=False, soft_wrap=True)


def _written_for_one_cause(path: Path) -> bool:
    """A bisect.json of a search for one cause (a version before several causes wrote no
    `search_kind`)."""
    try:
        return json.loads(path.read_text()).get("search_kind", ONE_CAUSE) == ONE_CAUSE
    except (OSError, ValueError, AttributeError):
        return False


def _golden_run(b: Bisecting) -> None:
    """The golden run (an earlier command's where there is one), as long as the longest run."""
    started = b.current
    earlier = b.earlier[started.on]
    if earlier.runs:
        b.console.print(f"  -> {earlier_words(earlier)}", markup=False, soft_wrap=True)
    b.before.append(earlier)
    started.oracle.run_golden(b.lengths.cap_steps if b.lengths is not None else None)


def _search(b: Bisecting) -> SearchResult:
    """The search to its verdict, against the golden run (one more all-off run)."""
    started = b.current
    started.search.golden(started.oracle.golden_steps)
    return run_bisection(started.search, started.oracle, console=b.console, numbers=b.numbers,
                         lengths=b.lengths)


def _search_without_stress(b: Bisecting) -> SearchResult:
    """A stress that hides a race must not clear a build: no drift needs its clean runs
    without stress too."""
    b.console.print("no drift reproduced under stress; a stress that hides a race must not "
                    "clear a build: searching again without stress...", markup=False)
    b.numbers.new_search()
    b.current = start_search(b, False)
    _golden_run(b)
    return _search(b)


def _calibrate_stress(b: Bisecting) -> None:
    """All-on without and with stress, a pair at a time so both meet the same machine load,
    until the rule settles the choice (search/stress.py); each setting's runs with the run
    lines that said them."""
    rule = STRESS_CALIBRATION
    b.console.print("checking whether stress makes drift show more often: all-on without and "
                    f"with stress, a pair at a time, until settled (at most {rule.max_pairs} "
                    "pairs)...", markup=False)
    all_on = Mask(b.opened.graph().edge_ids())
    runs: dict[bool, list[tuple[RunResult, int]]] = {False: [], True: []}
    choice: StressChoice | None = None
    while choice is None:
        for on in (False, True):
            runs[on].append((b.oracle_of(on).run(all_on), b.numbers.said))
        hazards = {on: Hazard.of([r.first_diff_step if r.diverged else None
                                  for r, _ in outcomes if r.completed], steps=b.experiment.steps)
                   for on, outcomes in runs.items()}
        choice = rule.decide(hazards[False], hazards[True], pairs=len(runs[True]))
    b.console.print(f"  -> {_calibration_stop_words(choice, rule)}: {stress_choice_words(choice)}",
                    markup=False, soft_wrap=True)
    b.stress.choice, b.stress.used = choice, choice.use
    b.calibration = runs  # the chosen setting's count in its search (and without: stage 6)


def _calibration_stop_words(choice: StressChoice, rule: CalibrationRule) -> str:
    """How many pairs the calibration took and why it stopped there."""
    pairs = f"{choice.pairs} pair{'s' if choice.pairs != 1 else ''}"
    if choice.stop == STOP_RAISED:
        return f"settled after {pairs} (chance it raises the hazard at least {rule.settled:g})"
    if choice.stop == STOP_NOT_RAISED:
        return f"settled after {pairs} (chance it raises the hazard at most {1 - rule.settled:g})"
    if choice.stop == STOP_BOTH:
        return (f"settled after {pairs} (drift shows in most runs either way; the likelier "
                "side taken)")
    return f"not settled after {pairs}, the most it runs; the likelier side taken"


def _segment_lengths(b: Bisecting) -> Lengths | None:
    """search.segments auto: segment length and step cap from the start-up and step time
    this experiment's runs measured (the golden run's at least) and the per-run chance of
    drift all-on, and the golden run as long as the longest run; None: one mask a run
    (segments off, or not cheaper: search/segments.py)."""
    experiment, console, oracle = b.experiment, b.console, b.current.oracle
    if experiment.search.segments == "off":
        return None
    if unfit := segments_unfit(experiment):
        console.print(f"segments: {unfit}; one mask a run", markup=False)
        return None
    if fixed := steps_fixed(experiment):  # a run of several masks is longer than the job's own
        console.print(f"segments: {fixed}, so no run can be longer than its "
                      f"{experiment.steps} steps; one mask a run", markup=False)
        return None
    startup = startup_in_steps(_runs_before_the_search(b))
    if startup is None:
        console.print("segments: no run measured its start-up and step time (that takes "
                      f"{WARMUP_STEPS + 1} steps or more); one mask a run", markup=False)
        return None
    chance, background = _leading_checks(b) if startup > 0 else (None, False)
    if b.current.search.done:
        return None  # nothing left to cut (the search ended on its first checks)
    lengths = lengths_for(experiment.steps, startup, len(b.opened.graph().edge_ids()),
                          chance=None if chance is None else chance.per_run_chance(),
                          background=background)
    if lengths.cap_steps == experiment.steps:
        drift = "" if chance is None else (
            f" and drift shows in {chance.per_run_chance():.2f} of all-on runs ({chance.runs} "
            f"run{'s' if chance.runs != 1 else ''})")
        drift += "; all-off drifted too" if background else ""
        console.print(f"segments: a start-up costs {startup:.0f} steps' worth of time{drift}: "
                      "one mask a run costs less (search/segments.py)", markup=False)
        return None
    console.print(lengths_words(lengths, startup), markup=False)
    if lengths.cap_steps > oracle.golden_steps:
        console.print(f"running the golden reference again, {lengths.cap_steps} steps: as "
                      "long as the longest run...", markup=False)
        oracle.run_golden(lengths.cap_steps)
    return lengths


def _runs_before_the_search(b: Bisecting) -> list[dict]:
    """This experiment's runs before the search's own, none longer than a run (not the
    golden run lengthened for segments), so that a resumed search cuts its runs the same
    way."""
    experiment = b.experiment
    tail, before = "@" + experiment.fingerprint(), []
    for record in b.opened.state.records():
        variant = str(record.get("variant", ""))
        if variant.endswith(tail) and variant.partition("+")[0] == PURPOSE:
            break
        if variant.endswith(tail) and record.get("steps", 0) <= experiment.steps:
            before.append(record)
    return before


def _leading_checks(b: Bisecting) -> tuple[Hazard | None, bool]:
    """What the cost model of segments needs from the runs: the per-step hazard all-on and
    whether all-off drifted too. From the calibration's runs of this setting and the
    search's own first asks, all-on and (after a divergence) all-off, run here one mask a
    run as it asks them and recorded in it (full runs either way). The hazard is None
    where no all-on run completed."""
    started = b.current
    search, all_on = started.search, Mask(started.search.edge_ids)
    results: dict[bool, list[RunResult]] = {True: [r for r, _ in b.calibration.get(started.on, [])],
                                            False: []}
    while (ask := search.pending) is not None and ask.stage in (STAGE_CALIBRATE, STAGE_CHECK_OFF):
        on = ask.mask == all_on
        if on and results[True]:
            break  # the calibration's runs tell how often drift shows all-on
        b.console.print(f"{stage_title(ask.stage, 'all-on' if on else 'all-off', ask.target, ask.context)}"
                        + (" (and how often, for segments)" if on else "") + "...", markup=False)
        result = started.oracle.run(ask.mask)
        search.record(ask.mask, result)
        b.numbers.recorded()
        results[on].append(result)
        b.console.print(f"  -> diverged at run {b.numbers.said} (step {result.first_diff_step})"
                        if result.diverged else "  -> clean (1 run)" if result.completed
                        else f"  -> {result.outcome} (1 run)", markup=False)
    completed = [r for r in results[True] if r.completed]
    hazard = Hazard.of([r.first_diff_step if r.diverged else None for r in completed],
                       steps=b.experiment.steps) if completed else None
    return hazard, any(r.diverged for r in results[False])


def discovery_audit(opened: OpenState) -> tuple[dict | None, dict | None]:
    """The discovery run's journal record and its audit (judge/audit.py); None where there is no
    discovery run (a static graph) or its records cannot be audited."""
    key = opened.runner.key("discover", mask=None, guard="none", steps=DISCOVERY_STEPS, index=0,
                            stress=False)
    found = opened.runner.holds(key)  # the discovery run this command made or took
    if found is None:
        return None, None
    try:
        return found, audit_run_dir(opened.state.run_dir(found["run_id"]))
    except BisectPrefetchError:
        return found, None


def audit_suspects(opened: OpenState, console: Console, audit: dict | None = None) -> list[str]:
    """Edges the audit of the discovery run flags as wasting work or racing (judge/audit.py).

    The search gives them more prior weight; with no discovery run (a static
    graph) or no order recorded there are none.
    """
    if audit is None:
        found, audit = discovery_audit(opened)
        if found is None or audit is None:
            return []
    failing = [f for f in audit["findings"] if f["kind"] in FAILING_KINDS]
    suspects = sorted({f["edge"] for f in failing})
    kinds = sorted({f["kind"] for f in failing})
    if suspects:
        console.print(f"audit of the discovery run: {len(suspects)} suspect edge(s) "
                      f"({', '.join(kinds)}): {', '.join(suspects)}; the search starts with "
                      "more weight on them", markup=False, soft_wrap=True)
    else:
        console.print("audit of the discovery run: no suspect edge", markup=False)
    return suspects


def _earlier_search_runs(opened: OpenState, experiment: Experiment, *,
                         own_session: bool = False, reusable_only: bool = False) -> int:
    """Journaled runs of a bisection of this very experiment (golden and retries too);
    own_session: only those of the session this command continues (runs/sessions.py);
    reusable_only: only those the runner may take now (runs/reuse.py)."""
    suffix, session = "@" + experiment.fingerprint(), opened.runner.scope.session
    return sum(1 for r in opened.state.records()
               if r["variant"].startswith(PURPOSE) and r["variant"].endswith(suffix)
               and (not own_session or r.get(SESSION_FIELD) == session)
               and (not reusable_only or opened.runner.reusable(r) is not None))


__all__ = ["EXIT_CODES", "bisect", "result_to_json"]
