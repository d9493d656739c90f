"""The bisect command's words for its verdict: the facts behind it, the verdict block,
and the lines under it.

What the search returns (search/verdict.py: the verdict, one record per kind of fact)
is structured; this module words it for the terminal and for the JSON's `facts`, in the
order of the report's first screen (report/verdict_block.py words the headline, causes,
next steps and count of runs for both). The lines said while the command runs are
commands/bisect_words.py's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bisect_prefetch.commands.bisect_words import earlier_words, runs_words
from bisect_prefetch.drivers.oracle import Earlier
from bisect_prefetch.experiment import Experiment, stress_fits
from bisect_prefetch.judge.step_time import fix_cost_line
from bisect_prefetch.report.stress import stress_line
from bisect_prefetch.report.verdict_block import (
    cause_line,
    causes_of,
    counts_line,
    headline,
    step_lines,
)
from bisect_prefetch.search import verdict as v
from bisect_prefetch.search.verdict import SearchResult
from bisect_prefetch.vocab import STRESS_OFF, VERDICT_INCONCLUSIVE, VERDICT_NO_DRIFT, quote_edges


def _same(run: int) -> int:
    return run


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
            return (f"each edge of the set is needed: {runs_words(without_b)} enabling {a} without {b} "
                    f"and {runs_words(without_a)} enabling {b} without {a} stayed consistent")
        case v.EachNeeded():
            each = ", ".join(f"{edge}: {n}" for edge, n in zip(fact.edges, fact.clean_without, strict=True))
            return (f"each edge of the set is needed: runs with the rest of the set but not the edge "
                    f"stayed consistent ({each}); the chance that one of them was not needed after "
                    f"all is {fact.chance:.2g}")
        case v.DropOnlyDiverges():
            return (f"drop-only:{names} still diverges while all-off stayed consistent "
                    f"({runs_words(fact.all_off_clean)}): another set of edges causes drift too")
        case v.DropOnlyClean():
            return f"drop-only:{names}: {runs_words(fact.runs)}, all consistent: removing the set removes drift"
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
                f"({runs_words(fact.union_diverged)} of drop-only of the union diverged)")
    if fact.background is not None:
        return (f"{head}; drift left {off} ({fact.union_diverged} of "
                f"{runs_words(fact.union_clean + fact.union_diverged)} of drop-only of the union) is "
                f"background drift, no further cause, at probability {fact.background:.3f}")
    return f"{head}; {off} (drop-only of the union): {runs_words(fact.union_clean)} consistent"


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
            f"from {runs_words(calibration['runs'])} that enabled "
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
