"""The narrated bisection: drive a search against an oracle and tell the story.

The search (search/protocol.py) decides; this module runs what it asks, prints
each protocol step and its verdict line, and renders the result:

    checking that all-on diverges...
      -> diverged at run 2 (step 17)
    checking that all-off is consistent...
      -> clean (1 run)
    ...
    double checking the answer: keep-only:bwd:layers.5->layers.4 should diverge...
      -> diverged at run 3 (step 12)

Resuming is replaying: results already in the journal go through the search
first (nothing is re-run), then the search goes on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from rich.console import Console
from rich.table import Table

from bisect_prefetch.search.oracle import Oracle, RunResult
from bisect_prefetch.search.protocol import Bisection, SearchResult

Mask = frozenset[str]


class _Narrator:
    """Prints a step's title when its first run starts and its verdict line when it ends."""

    def __init__(self, search: Bisection, console: Console) -> None:
        self.search = search
        self.console = console
        self.open = False

    def before(self, mask: Mask, *, replayed: bool = False) -> None:
        events, ask = self.search.events, self.search.pending
        last = events[-1] if events else None
        if last is not None and ask is not None and last.enabled == mask and last.step == ask.step:
            return  # the same step goes on
        self.close()
        title = ask.title if ask is not None and ask.mask == mask else f"recorded run of {len(mask)} edges"
        self.console.print(f"{title}...{'  (from the journal)' if replayed else ''}", markup=False)
        self.open = True

    def close(self) -> None:
        if self.open and self.search.events:
            self.console.print(f"  -> {self.search.events[-1].line}", markup=False)
        self.open = False


def run_bisection(
    search: Bisection,
    oracle: Oracle,
    *,
    console: Console,
    journal_results: Iterable[tuple[Mask, RunResult]] | None = None,
    on_result: Callable[[Mask, RunResult], None] | None = None,
    resume_hint: str | None = None,
) -> SearchResult:
    """Run the search to its verdict, narrating each step; returns the result.

    journal_results: runs that already finished (mask, result), replayed in
    order before anything new runs. on_result(mask, result) is called after
    each new run, before the search sees it: the place to append to the journal.
    resume_hint: the command that resumes; printed if the run is interrupted.
    """
    narrator = _Narrator(search, console)
    replayed = 0
    for mask, result in journal_results or ():
        if search.done:
            break
        narrator.before(frozenset(mask), replayed=True)
        search.record(frozenset(mask), result)
        replayed += 1
    if replayed:
        narrator.close()
        console.print(f"replayed {replayed} finished run{'s' * (replayed != 1)} from the journal")
    try:
        while (mask := search.next_mask()) is not None:
            narrator.before(mask)
            result = oracle.run(mask)
            if on_result is not None:
                on_result(mask, result)
            search.record(mask, result)
        narrator.close()
    except KeyboardInterrupt:
        narrator.close()
        console.print(f"interrupted after {search.runs_used} runs; every finished run is kept")
        if resume_hint:
            console.print(f"resume with: {resume_hint}", markup=False)
        raise
    return search.result()


def reproduce_mask(result: SearchResult) -> str | None:
    """The --mask value that reproduces the drift: keep-only of the minimal set."""
    return "keep-only:" + ",".join(result.minimal_set) if result.minimal_set else None


def render_result(result: SearchResult, console: Console, *, reproduce: str | None = None) -> None:
    """Verdict, minimal set, confidence, runs and steps, the facts, evidence and calibration."""
    console.print(f"verdict: {result.verdict}", markup=False)
    if result.minimal_set:
        console.print(f"minimal set: {', '.join(result.minimal_set)}", markup=False)
    console.print(
        f"confidence: {result.confidence:.3f}   runs: {result.runs_used}   steps: {result.steps_used}"
    )
    for fact in result.facts:
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


def result_to_json(result: SearchResult, reproduce: str) -> dict:
    """DESIGN.md's bisect JSON: verdict, minimal_set, confidence, runs_used, steps_used,
    evidence, reproduce; plus the facts, calibration and best hypotheses."""
    return {
        "verdict": result.verdict,
        "minimal_set": list(result.minimal_set),
        "confidence": result.confidence,
        "runs_used": result.runs_used,
        "steps_used": result.steps_used,
        "evidence": [dict(row) for row in result.evidence],
        "reproduce": reproduce,
        "facts": list(result.facts),
        "drop_only_diverges": result.drop_only_diverges,
        "calibration": dict(result.calibration),
        "top_hypotheses": list(result.top_hypotheses),
        "finished": result.finished,
    }
