"""`bisect-prefetch bisect`: the search against real training runs, narrated and resumable.

The command reads as its numbered parts (`_bisect`), each printed as it happens:
1. the graph and the audit's suspects (the search weighs them first);
2. stress calibration (--stress auto): all-on without and with stress, in pairs
   until they settle whether stress raises the hazard (commands/bisect_checks.py);
3. the golden run: the all-off reference every run is compared with;
4. segment lengths (search.segments auto): the search's first checks (all-on, all-off)
   one mask a run, then how many masks a run holds, or one where that costs less
   (commands/bisect_checks.py);
5. the search (the protocol's stages live in search/protocol.py);
6. no drift under stress -> the same search without it;
7. --explain: each cause's first divergence, traced (commands/bisect_explain.py).
Every run of 2, 4, 5 and 6 goes through the one loop of commands/bisect_loop.py,
through the oracle's slots; the golden run is no ask of a search, and the oracle
runs it itself.

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
The words are commands/bisect_words.py's (while it runs) and
commands/bisect_verdict_words.py's (the verdict).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from rich.console import Console

from bisect_prefetch.commands.bisect_checks import calibrate_stress, segment_lengths
from bisect_prefetch.commands.bisect_explain import explain_causes, with_traced_hints
from bisect_prefetch.commands.bisect_loop import run_bisection
from bisect_prefetch.commands.bisect_record import (
    ONE_CAUSE,
    BisectRecord,
    result_to_json,
)
from bisect_prefetch.commands.bisect_setup import (
    PURPOSE,
    Bisecting,
    OracleFor,
    bisect_record,
    start_search,
)
from bisect_prefetch.commands.bisect_verdict_words import render_result, say_after_verdict
from bisect_prefetch.commands.bisect_words import (
    REPLAYED_AS_ONE_CAUSE,
    SEARCH_WITHOUT_STRESS,
    audit_line,
    golden_taken_line,
    golden_title,
    opening_line,
    resuming_line,
)
from bisect_prefetch.commands.common import (
    Given,
    check_outputs,
    resume_hint_on_interrupt,
    reuse_options,
    search_settings,
    write_json,
)
from bisect_prefetch.drivers.oracle import RealOracle
from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.experiment import Experiment, load_experiment, with_segments, with_stress
from bisect_prefetch.files import write_text_atomic
from bisect_prefetch.judge.audit import FAILING_KINDS, audit_run_dir
from bisect_prefetch.report.html import BISECT_FILE, REPORT_FILE, build_report
from bisect_prefetch.runs.discover import DISCOVERY_STEPS
from bisect_prefetch.runs.sessions import SESSION_FIELD, Scope
from bisect_prefetch.runs.state import OpenState, open_state
from bisect_prefetch.runs.workloads import require_prefetch_graph
from bisect_prefetch.search.stress import SEQUENTIAL, CalibrationRule
from bisect_prefetch.search.verdict import SearchResult
from bisect_prefetch.vocab import (
    STRESS_AUTO,
    STRESS_ON,
    VERDICT_FOUND,
    VERDICT_INCONCLUSIVE,
    VERDICT_NO_DRIFT,
    VERDICT_NOT_PREFETCH,
)

# --stress auto: all-on runs without and with stress, in pairs, before the search, until
# the rule says the pairs have settled whether stress raises the hazard (search/stress.py).
STRESS_CALIBRATION: CalibrationRule = SEQUENTIAL
# A culprit is a finding (1); so is drift that is not prefetch's, and no answer. No drift: 0.
EXIT_CODES = {VERDICT_FOUND: 1, VERDICT_NOT_PREFETCH: 1, VERDICT_NO_DRIFT: 0, VERDICT_INCONCLUSIVE: 1}


def real_oracle(opened: OpenState, *, stress: bool = False) -> RealOracle:
    """Real training runs in the state dir, each against the golden all-off trajectory
    (under stress: every run, the golden all-off one included)."""
    experiment = opened.experiment
    return RealOracle(opened.runner, steps=experiment.steps, guard=experiment.guard,
                      purpose=PURPOSE, stress=stress)


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
        # 1: the graph and the audit's suspects
        opened.graph()
        b.discovery, audit = discovery_audit(opened)
        if audit is not None:
            b.suspects = audit_suspects(opened, console, audit)
            b.size_one = sorted(e["id"] for e in audit["edges"] if e.get("size_one"))
        try:
            # 2: does stress make drift show more often? (--stress auto)
            if b.stress.mode == STRESS_AUTO:
                calibrate_stress(b, STRESS_CALIBRATION)
            else:
                b.stress.used = b.stress.mode == STRESS_ON
            # 3: the golden run
            b.current = start_search(b, b.stress.used)
            console.print(golden_title(stressed=b.stress.used), markup=False)
            _golden_run(b)
            # 4: segment lengths (search.segments auto), after the first checks
            b.lengths = segment_lengths(b)
            # 5: the search
            b.result = _search(b)
            # 6: no drift under stress -> the same search without stress
            if b.stress.used and b.result.verdict == VERDICT_NO_DRIFT:
                b.unstressed = b.result = _search_without_stress(b)
        finally:
            # Keep what was learned even when interrupted: the report shows it.
            record = bisect_record(b, began)
            write_text_atomic(opened.path / BISECT_FILE,
                              json.dumps(record.to_json(), indent=2) + "\n")
            build_report(opened.path)
    if explain:  # 7: each cause's first divergence (commands/bisect_explain.py)
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
    b.console.print(opening_line(experiment, confidence=b.confidence, max_runs=b.max_runs),
                    markup=False)
    own = _earlier_search_runs(opened, experiment, own_session=True) if resume else 0
    if own:
        kept = _earlier_search_runs(opened, experiment, own_session=True, reusable_only=True)
        first_reason = opened.runner.refused[0][1] if kept != own else ""
        b.console.print(resuming_line(kept, own, first_reason), markup=False, soft_wrap=True)
    if own and _written_for_one_cause(opened.path / BISECT_FILE):
        b.one_cause = True  # the search that wrote the journal, so its runs answer the same questions
        b.console.print(REPLAYED_AS_ONE_CAUSE, markup=False, soft_wrap=True)


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
        b.console.print(golden_taken_line(earlier), markup=False, soft_wrap=True)
    b.before.append(earlier)
    started.oracle.run_golden(b.lengths.cap_steps if b.lengths is not None else None)


def _search(b: Bisecting) -> SearchResult:
    """The search to its verdict, against the golden run (one more all-off run)."""
    started = b.current
    started.search.golden(started.oracle.golden_steps)
    return run_bisection(started.search, started.oracle, console=b.console, numbers=b.numbers,
                         lengths=b.lengths, lines=b.lines)


def _search_without_stress(b: Bisecting) -> SearchResult:
    """A stress that hides a race must not clear a build: no drift needs its clean runs
    without stress too."""
    b.console.print(SEARCH_WITHOUT_STRESS, markup=False)
    b.numbers.new_search()
    b.current = start_search(b, False)
    _golden_run(b)
    return _search(b)


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
    console.print(audit_line(suspects, sorted({f["kind"] for f in failing})), markup=False,
                  soft_wrap=True)
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
