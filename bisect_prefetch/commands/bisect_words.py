"""The bisect command's words: stage titles, verdict and fact lines, the evidence table.

What the search (search/protocol.py) returns is structured: stages, blocks of
runs, facts, notices. This module words them for the transcript and the JSON's
`facts`; the loop (commands/bisect_loop.py) and the command (commands/bisect.py)
print them. A "step" here is always a training step; the protocol's parts are
stages (bisect_prefetch/vocab.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bisect_prefetch.drivers.oracle import Earlier
from bisect_prefetch.experiment import Experiment, stress_fits
from bisect_prefetch.judge.step_time import fix_cost_line
from bisect_prefetch.report.localization import in_unit
from bisect_prefetch.report.stress import stress_line
from bisect_prefetch.report.verdict_block import (
    cause_line,
    causes_of,
    counts_line,
    headline,
    step_lines,
)
from bisect_prefetch.runs.outcome import RunOutcome
from bisect_prefetch.search import verdict as v
from bisect_prefetch.search.runlog import (
    AFTER_DROP_ONLY_DIVERGED,
    BACKGROUND_CONTROL,
    BACKGROUND_PARITY,
    NO_CAUSE_HERE,
    Block,
)
from bisect_prefetch.search.segments import Lengths
from bisect_prefetch.search.stress import Hazard, StressChoice
from bisect_prefetch.search.verdict import SearchResult
from bisect_prefetch.vocab import (
    DROP_ONLY,
    KEEP_ONLY,
    STAGE_CALIBRATE,
    STAGE_CHECK_OFF,
    STAGE_LEADING,
    STAGE_REDUCE,
    STAGE_SEARCH,
    STRESS_OFF,
    VERDICT_INCONCLUSIVE,
    VERDICT_NO_DRIFT,
    Mask,
    quote_edges,
)


def budget_words(max_runs: int | None) -> str:
    if max_runs is None:
        return "a run budget scaled with the graph and the estimated per-run chance"
    return f"at most {max_runs} runs"


def run_line(number: int, planned: Mask | tuple[tuple[int, Mask], ...], out: RunOutcome, *,
             stress: bool = False) -> str:
    """One finished run: which, how it ended, how long (or that the journal had it)."""
    segmented = isinstance(planned, tuple)
    mask = planned[0][1] if segmented else planned
    if out.usable and out.diverged:
        how = f"diverged at step {out.first_diff_step}{in_unit(out.localization)}"
    elif out.usable:
        how = f"clean over {out.steps_done} steps"
    else:
        how = f"{out.outcome}: {out.why()}"
    when = "from the journal" if out.reused else f"{out.wall_s or 0:.1f}s"
    under = ", stress" if stress else ""
    on = f"{len(mask)} edge{'' if len(mask) == 1 else 's'} on"
    what = f"{len(planned)} segments, {on} first" if segmented and len(planned) > 1 else on
    return f"    run {number} ({what}{under}): {how} [{when}]"


def _runs(n: int) -> str:
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
    names = quote_edges(getattr(fact, "edges", ()))
    match fact:
        case v.Causes():
            return _causes_line(fact, run)
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
        case v.DropOnlyClean():
            return f"drop-only:{names}: {_runs(fact.runs)}, all consistent: removing the set removes drift"
        case v.DropOnlyFailed():
            return f"drop-only:{names} could not be run ({fact.errors} failed)"
        case v.DropOnlyNotRun():
            return f"drop-only:{names} was not run: the run budget ran out"
    raise ValueError(f"unknown fact {fact!r}")


def _causes_line(fact: v.Causes, run: Callable[[int], int]) -> str:
    """e.g. "2 independent causes: {A} (keep-only diverged, run 5, step 3), {B} (...); with
    all of them off: 9 runs consistent"."""
    each = ", ".join(f"{{{','.join(edges)}}} (keep-only diverged, run {run(n)}, step {step})"
                     for edges, (n, step) in zip(fact.sets, fact.keep_only, strict=True))
    count = len(fact.sets)
    head = f"{count} independent causes: {each}" if count > 1 else f"one cause: {each}"
    off = "with all of them off" if count > 1 else "with it off"
    if fact.remains:
        return (f"{head}; drift remains {off}: another cause not yet found "
                f"({_runs(fact.union_diverged)} of drop-only of the union diverged)")
    if fact.background is not None:
        return (f"{head}; drift left {off} ({fact.union_diverged} of "
                f"{_runs(fact.union_clean + fact.union_diverged)} of drop-only of the union) is "
                f"background drift, no further cause, at probability {fact.background:.3f}")
    return f"{head}; {off} (drop-only of the union): {_runs(fact.union_clean)} consistent"


def fact_lines(result: SearchResult, *, run: Callable[[int], int] = _same) -> list[str]:
    return [fact_line(fact, confidence=result.confidence, run=run) for fact in result.facts]




def confidence_met(result: SearchResult, asked: float | None) -> bool:
    """Whether the verdict holds at the confidence asked (None: nothing was asked); an
    inconclusive verdict never does."""
    if result.verdict == VERDICT_INCONCLUSIVE:
        return False
    return asked is None or result.confidence >= asked


def render_result(data: dict, console: Console) -> None:
    """The verdict block (data: the bisect JSON), in the order of the report's first screen
    (report/verdict_block.py words both): the verdict, every cause, the next steps, the one
    count of runs; then the facts, the evidence table and the calibration."""
    console.print(headline(data), markup=False)
    for number, cause in enumerate(causes_of(data), start=1):
        console.print(cause_line(data, number, cause), markup=False, soft_wrap=True)
    steps = step_lines(data)
    if steps:
        console.print("next steps:", markup=False)
    for title, command, result in steps:
        console.print(f"  {title}:", markup=False, soft_wrap=True)
        console.print(f"    {command}", markup=False, soft_wrap=True)
        if result is not None:
            console.print(f"    -> {result}", markup=False, soft_wrap=True)
    console.print(counts_line(data), markup=False, soft_wrap=True)
    for fact in data["facts"]:
        console.print(f"  - {fact}", markup=False)
    console.print(evidence_table(data["evidence"]))
    calibration = data["calibration"]
    if calibration["runs"]:
        low, high = calibration["interval"]
        hazard = calibration["hazard_per_step"]
        hazard_text = f", per-step hazard {hazard:.3g}" if hazard is not None else ""
        chance = calibration["per_run_chance"]
        gloss = f": drift in about {round(10 * chance)} of 10 runs" if round(10 * chance) else ""
        console.print(
            f"per-run chance {chance:.3g}{gloss} "
            f"({calibration['interval_confidence']:.0%} interval {low:.3g}-{high:.3g}){hazard_text}, "
            f"from {_runs(calibration['runs'])} that enabled "
            f"{'the set' if data['minimal_set'] else 'every edge (all-on)'}",
            markup=False,
        )


def evidence_table(evidence: list[dict]) -> Table:
    table = Table(title="evidence", title_justify="left")
    for column in ("stage", "mask", "edges", "runs", "diverged", "first differing steps", "verdict"):
        table.add_column(column, overflow="fold")
    for row in evidence:
        steps = ", ".join(str(s) for s in row["first_diff_steps"]) or "-"
        runs = str(row["runs"]) + (f" ({row['errors']} failed)" if row["errors"] else "")
        table.add_row(
            row["step"], row["mask"], str(row["edges"]), runs, str(row["divergences"]), steps,
            row["verdict"],
        )
    return table




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


def say_after_verdict(result: SearchResult, data: dict, experiment: Experiment,
                      console: Console, *, report: Path, before: Sequence[Earlier]) -> None:
    """The lines under the verdict (data: the bisect JSON): stress, what a fix would save,
    the report, earlier commands' runs taken, runs the scheduler took away."""
    if data["stress"]["mode"] != STRESS_OFF:
        console.print(stress_line(data["stress"]), markup=False, soft_wrap=True)
    elif result.verdict == VERDICT_NO_DRIFT and stress_fits(experiment):
        # A race rarer than the chance ruled out passes unseen (docs/stress.md's race: 4 runs in
        # 60 without stress): say how to look harder.
        ruled_out = next(f.chance for f in result.facts if isinstance(f, v.NoDrift))
        console.print(f"drift at a per-run chance below {ruled_out:.3g} can still hide: for a "
                      "prefetch race, --stress auto checks whether delays before each prefetch "
                      "make it show more often (docs/stress.md)", markup=False, soft_wrap=True)
    # What a fix costs, only where the runs measured it (the JSON keeps why not, otherwise).
    measured = {k: c for k, c in (data["step_time"] or {}).items()
                if isinstance(c, dict) and c.get("meaningful")}
    cost = fix_cost_line(measured, sorted({e for c in result.culprit_sets for e in c["edges"]})
                         if len(result.culprit_sets) > 1 else result.minimal_set)
    if cost:
        console.print(cost, markup=False, soft_wrap=True)
    switches = len(data["segments"]["diverged_at_switch"])
    if switches > 1:
        console.print(f"{switches} runs diverged at the first step under a new mask; each "
                      "counted against both masks", markup=False, soft_wrap=True)
    console.print(f"report: {report}", markup=False)
    for e in before:
        if e.runs:
            console.print(earlier_words(e), markup=False)
    if data["runs_lost"]:
        console.print(f"runs lost (the scheduler took the job away; retried): "
                      f"{len(data['runs_lost'])}: " + "; ".join(data["runs_lost"]),
                      markup=False, soft_wrap=True)
