"""The bisect command's words while it runs: its own lines, the protocol's stage titles,
run lines, notices and block verdicts, the stress calibration's.

What the search (search/protocol.py) returns is structured: stages, blocks of
runs, notices. This module words them for the transcript; the loop
(commands/bisect_loop.py) and the command (commands/bisect.py) print them. The
verdict's words (facts, the verdict block, the lines under it) are
commands/bisect_verdict_words.py's. A "step" here is always a training step; the
protocol's parts are stages (bisect_prefetch/vocab.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from bisect_prefetch.drivers.oracle import Earlier
from bisect_prefetch.experiment import Experiment
from bisect_prefetch.judge.step_time import WARMUP_STEPS
from bisect_prefetch.report.localization import in_unit
from bisect_prefetch.runs.outcome import RunOutcome
from bisect_prefetch.search.oracle import RunResult
from bisect_prefetch.search.runlog import (
    AFTER_DROP_ONLY_DIVERGED,
    BACKGROUND_CONTROL,
    BACKGROUND_PARITY,
    NO_CAUSE_HERE,
    Ask,
    Block,
)
from bisect_prefetch.search.segments import Lengths
from bisect_prefetch.search.stress import (
    STOP_BOTH,
    STOP_NOT_RAISED,
    STOP_RAISED,
    CalibrationRule,
    Hazard,
    StressChoice,
)
from bisect_prefetch.vocab import (
    DROP_ONLY,
    KEEP_ONLY,
    STAGE_CALIBRATE,
    STAGE_CHECK_OFF,
    STAGE_LEADING,
    STAGE_REDUCE,
    STAGE_SEARCH,
    Mask,
    quote_edges,
)


def budget_words(max_runs: int | None) -> str:
    if max_runs is None:
        return "a run budget scaled with the graph and the estimated per-run chance"
    return f"at most {max_runs} runs"


def run_line(number: int, masks: Sequence[tuple[int, Mask]], out: RunOutcome, *,
             stress: bool = False) -> str:
    """One finished run: which, how it ended, how long (or that the journal had it).
    masks: (first step, mask) of each of its segments; one for a run of one mask."""
    mask = masks[0][1]
    if out.usable and out.diverged:
        how = f"diverged at step {out.first_diff_step}{in_unit(out.localization)}"
    elif out.usable:
        how = f"clean over {out.steps_done} steps"
    else:
        how = f"{out.outcome}: {out.why()}"
    when = "from the journal" if out.reused else f"{out.wall_s or 0:.1f}s"
    under = ", stress" if stress else ""
    on = f"{len(mask)} edge{'' if len(mask) == 1 else 's'} on"
    what = f"{len(masks)} segments, {on} first" if len(masks) > 1 else on
    return f"    run {number} ({what}{under}): {how} [{when}]"


def runs_words(n: int) -> str:
    return f"{n} run{'s' * (n != 1)}"


def stage_title(stage: str, mask: str, target: Sequence[str], context: str | None) -> str:
    """What a protocol stage checks, e.g. "checking that all-on diverges" (the numbered
    parts of search/protocol.py: 1 calibrate, 2 check-off, 3 reduce, 4 the double check
    of an answer, 5 search and the leading set)."""
    names = quote_edges(target)
    if stage == STAGE_CALIBRATE:  # 1, and all-on in 4's checks of an answer of none
        if context == NO_CAUSE_HERE:
            return "no cause left among these edges? checking that all-on stays consistent"
        if context == BACKGROUND_PARITY:
            return ("drift without prefetch, or several causes? checking that all-on diverges "
                    "no more often than all-off")
        return "checking that all-on diverges"
    if stage == STAGE_CHECK_OFF:  # 2, and the all-off runs of 4's double check
        if context == AFTER_DROP_ONLY_DIVERGED:
            return "drop-only still diverges: checking that all-off is consistent"
        if context == BACKGROUND_PARITY:
            return ("drift without prefetch, or several causes? checking that all-off diverges "
                    "as often as the other runs")
        if context == BACKGROUND_CONTROL:
            return "ruling out drift without prefetch as strong as the answer's: checking that all-off is consistent"
        return "checking that all-off is consistent"
    if stage == STAGE_REDUCE:  # 3
        return f"reducing the {len(target)} edges every diverged run enabled: testing {mask}"
    if stage == KEEP_ONLY:  # 4: an answer is confirmed; its keep-only must diverge
        return f"double checking the answer: {f'keep-only:{names}' if target else 'all-off'} should diverge"
    if stage == DROP_ONLY:  # 4
        return f"double checking the answer: drop-only:{names} should be consistent"
    if stage == STAGE_SEARCH:  # 5
        return f"testing {mask}"
    if stage == STAGE_LEADING:  # 5: no answer yet; the set most runs point at, alone
        if not target:  # none leads: drift without prefetch would show all-off too
            return "checking the leading answer, drift without prefetch: all-off should diverge"
        return f"checking that the leading set is enough: keep-only:{names} should diverge"
    return f"recorded run of {mask}"  # STAGE_EXTRA: a run the search did not ask for


def notice_line(notice: dict) -> str:
    """What a localization hint (hints.py's events), a divergence at a switch of masks
    (segments.py), a cause or narrowing (causes.py) or a golden run that drifted
    (golden_drift.py) does to the search, in words."""
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
    if event == "narrowed":  # each notice of a new round (causes.py) titles it "round N: ..."
        return ("two diverged runs share no edge, and all-off diverges far less often than the "
                f"runs without the leading set: more than one cause; round {notice['round']}: the "
                f"{notice['edges_on']} edges of the smallest diverged mask first, every other edge off")
    if event == "cause-found":
        found = notice["number"]
        off = "cause 1" if found == 1 else f"causes 1-{found}"
        return (f"cause {found}: {{{','.join(notice['edges'])}}}; drift may remain without it: "
                f"round {notice['round']}: the other {notice['left']} edges with {off} off")
    if event == "narrowing-found-nothing":
        return (f"no cause inside those {len(notice['mask'])} edges ({notice['verdict']}): "
                f"round {notice['round']}: every edge left")
    if event == "golden-drifted":
        step = notice["step"]
        return (f"the golden run itself drifted at step {step}: {notice['runs']} runs first "
                f"differed from it there, an all-off one among them, and none matched it past "
                f"step {step - 1}. They count as clean through step {step - 1}, the golden run as "
                "an all-off run that drifted, and the search reads every run again; running a "
                "new golden reference...")
    if event == "suspect-ignored":
        return f"audit suspect {notice['edge']} is not an edge of the graph: ignored"
    return f"audit suspects: {', '.join(notice['edges'])}"


def _same(run: int) -> int:
    return run


def _diverged_at(run: int, step: int | None) -> str:
    return f"diverged at run {run} (step {step})"


def verdict_line(block: Block, *, run: Callable[[int], int] = _same) -> str:
    """A block's verdict, e.g. "diverged at run 12 (step 17)" or "clean (9 runs)"; run: the
    transcript's number of the search's k-th run (RunNumbers.of)."""
    failed = f", {block.errors} failed" if block.errors else ""
    if block.divergences:
        first = run(block.first_run + block.diverged_at - 1)
        return f"{_diverged_at(first, block.first_diff_steps[0])}{failed}"
    clean = block.runs - block.errors
    if clean:
        return f"clean ({runs_words(clean)}{failed})"
    return f"unresolved ({runs_words(block.errors)} failed)"


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


def earlier_words(earlier: Earlier) -> str:
    """e.g. "reused 3 all-off runs of earlier commands as the golden run and background controls"."""
    runs = earlier.runs
    what = "the golden run" + (" and background controls" if earlier.controls else "")
    diverged = sum(1 for out in earlier.controls if out.diverged)
    return (f"reused {runs} all-off run{'s' if runs != 1 else ''} of earlier commands as {what} "
            f"(golden {earlier.golden}"
            + (f"; {diverged} diverged from it: drift without prefetch" if diverged else "") + ")")


def lengths_words(lengths: Lengths, startup: float) -> str:
    """How search.segments auto cut the runs, e.g. "segments: a start-up costs 40 steps'..."."""
    if lengths.segment_steps == lengths.steps_per_run:
        cut = (f"a run holds up to {lengths.cap_steps // lengths.steps_per_run} masks of "
               f"{lengths.steps_per_run} steps each")
    else:
        cut = (f"search masks change every {lengths.segment_steps} steps (checks every "
               f"{lengths.steps_per_run}), runs go up to {lengths.cap_steps} steps")
    return f"segments: a start-up costs {startup:.0f} steps' worth of time; {cut} (search/segments.py)"




# -- the command's own lines, in the order it says them (commands/bisect.py) -----------------
def opening_line(experiment: Experiment, *, confidence: float, max_runs: int | None) -> str:
    return (f"bisecting {experiment.name}: {experiment.steps} steps a run, seed "
            f"{experiment.seed}, guard {experiment.guard}, confidence {confidence:g}, "
            f"{budget_words(max_runs)}")


def resuming_line(kept: int, journaled: int, first_reason: str) -> str:
    """Only what may still be taken (runs/reuse.py) is said to be reused."""
    again = "" if kept == journaled else (
        f"; {journaled - kept} run again, first because: {first_reason}")
    return f"resuming: {kept} finished run(s) in the journal are reused{again}"


REPLAYED_AS_ONE_CAUSE = ("this bisection was begun by a version that searches for one cause: it "
                         "replays as one (a new --state-dir searches for every cause)")


def audit_line(suspects: Sequence[str], kinds: Sequence[str]) -> str:
    if not suspects:
        return "audit of the discovery run: no suspect edge"
    return (f"audit of the discovery run: {len(suspects)} suspect edge(s) ({', '.join(kinds)}): "
            f"{', '.join(suspects)}; the search starts with more weight on them")


def calibration_title(rule: CalibrationRule) -> str:
    return ("checking whether stress makes drift show more often: all-on without and with "
            f"stress, a pair at a time, until settled (at most {rule.max_pairs} pairs)...")


def calibration_verdict(choice: StressChoice, rule: CalibrationRule) -> str:
    """How many pairs the calibration took, why it stopped there, and the choice."""
    pairs = f"{choice.pairs} pair{'s' if choice.pairs != 1 else ''}"
    if choice.stop == STOP_RAISED:
        stop = f"settled after {pairs} (chance it raises the hazard at least {rule.settled:g})"
    elif choice.stop == STOP_NOT_RAISED:
        stop = f"settled after {pairs} (chance it raises the hazard at most {1 - rule.settled:g})"
    elif choice.stop == STOP_BOTH:
        stop = (f"settled after {pairs} (drift shows in most runs either way; the likelier "
                "side taken)")
    else:
        stop = f"not settled after {pairs}, the most it runs; the likelier side taken"
    return f"  -> {stop}: {stress_choice_words(choice)}"


def golden_title(*, stressed: bool) -> str:
    return ("running the golden reference (all-off, full length"
            + (", under stress" if stressed else "") + ")...")


def golden_taken_line(earlier: Earlier) -> str:
    """Before the golden run: earlier commands' all-off runs taken as it and its controls."""
    return f"  -> {earlier_words(earlier)}"


def golden_again_title(steps: int) -> str:
    return f"running the golden reference again, {steps} steps: as long as the longest run..."


def leading_check_title(ask: Ask, name: str) -> str:
    """A first check run one mask a run before the segments are cut: all-on also tells how
    often drift shows, which the cost model of segments needs."""
    for_segments = " (and how often, for segments)" if name == "all-on" else ""
    return f"{stage_title(ask.stage, name, ask.target, ask.context)}{for_segments}..."


def one_run_verdict(result: RunResult, run: int) -> str:
    """The verdict of a first check of one run (run: its line)."""
    if result.diverged:
        return f"  -> {_diverged_at(run, result.first_diff_step)}"
    return "  -> clean (1 run)" if result.completed else f"  -> {result.outcome} (1 run)"


SEGMENTS_UNMEASURED = (f"segments: no run measured its start-up and step time (that takes "
                       f"{WARMUP_STEPS + 1} steps or more); one mask a run")


def segments_unfit_line(unfit: str) -> str:
    return f"segments: {unfit}; one mask a run"


def segments_fixed_line(fixed: str, steps: int) -> str:
    return f"segments: {fixed}, so no run can be longer than its {steps} steps; one mask a run"


def segments_refused_line(reason: str) -> str:
    return f"segments: {reason}; one mask a run from here"


def segments_cost_more_line(startup: float, chance: Hazard | None, background: bool) -> str:
    """Segments would cost more than one mask a run (search/segments.py)."""
    drift = "" if chance is None else (
        f" and drift shows in {chance.per_run_chance():.2f} of all-on runs ({chance.runs} "
        f"run{'s' if chance.runs != 1 else ''})")
    drift += "; all-off drifted too" if background else ""
    return (f"segments: a start-up costs {startup:.0f} steps' worth of time{drift}: one mask a "
            "run costs less (search/segments.py)")


SEARCH_WITHOUT_STRESS = ("no drift reproduced under stress; a stress that hides a race must not "
                         "clear a build: searching again without stress...")
