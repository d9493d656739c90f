"""What a bisection writes down: bisect.json (and --json), field by field (docs/contract.md).

Built once, in the command's `finally:` (an interrupted search keeps what it
learned), from the search's result and what the command did about stress,
segments and earlier runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from bisect_prefetch.commands.bisect_verdict_words import confidence_met, fact_lines
from bisect_prefetch.commands.common import Given
from bisect_prefetch.commands.explain import explain_command
from bisect_prefetch.experiment.verdict_cells import runs_to_see
from bisect_prefetch.report.verdict_block import STEP_EXPLAIN, STEP_FIX, STEP_GUARD, STEP_REPRODUCE
from bisect_prefetch.search.interface import Search
from bisect_prefetch.search.segments import Lengths
from bisect_prefetch.search.stress import StressChoice
from bisect_prefetch.search.verdict import SearchResult
from bisect_prefetch.vocab import GUARD_SIZE_ONE, VERDICT_FOUND, VERDICT_NOT_PREFETCH, quote_edges

# bisect.json's `search_kind`: which search wrote it (a resume replays the same one).
ONE_CAUSE, EVERY_CAUSE = "one-cause", "every-cause"


class StressRecord:
    """What the command did about stress, for the JSON, the report and the verdict's line."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.used = False
        self.choice: StressChoice | None = None

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


def segments_json(mode: str, lengths: Lengths | None, search: Search) -> dict:
    """The bisect JSON's `segments`: how runs were cut, start-ups, divergences at a switch."""
    return {"mode": mode, "used": lengths is not None,
            "segment_steps": lengths.segment_steps if lengths else None,
            "cap_steps": lengths.cap_steps if lengths else None,
            "startups": search.startups, "trials": search.runs_used,
            "diverged_at_switch": [n for n in search.notices
                                   if n["event"] == "diverged-at-switch"]}


def _same(run: int) -> int:
    return run


def culprit_sets_json(result: SearchResult, *, run: Callable[[int], int] = _same) -> list[dict]:
    """Every cause, its keep-only runs numbered as the transcript's run lines (the search
    numbers its trials; a segment's trial is its run's line)."""
    return [dict(c, keep_only_runs=[run(n) for n in c.get("keep_only_runs", [])])
            for c in result.culprit_sets]


def result_to_json(result: SearchResult, reproduce: str, *,
                   run: Callable[[int], int] = _same) -> dict:
    """The bisect JSON of docs/contract.md: verdict, culprit_sets (every cause; minimal_set is
    cause 1's edges), confidence, runs_used, steps_used, evidence, reproduce; plus the facts
    (in words), calibration and best hypotheses."""
    return {
        "verdict": result.verdict,
        "culprit_sets": culprit_sets_json(result, run=run),
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


@dataclass
class BisectRecord:
    """bisect.json: the search's result (`result_to_json`), then what the command did."""

    result: SearchResult
    reproduce: str
    run: Callable[[int], int]  # the transcript's number of the search's k-th run
    experiment: str
    elapsed_s: float  # this command's, to its verdict
    deterministic_masks: list[list[str]]
    runs_launched: int
    runs_reused: int
    earlier_all_off: list[dict]  # one a search: {"golden", "controls"}
    runs_lost: list[str]
    segments: dict
    suspects: list[str]
    hints: list[dict]
    golden_drifts: list[dict]  # golden runs that drifted: {"step", "runs"} (golden_drift.py)
    run_details: list[dict]  # each run, with where its gradients first differed
    stress: dict
    signals: dict | None  # what the runs measured (judge/signals.py)
    step_time: dict | None
    search: str = EVERY_CAUSE  # ONE_CAUSE: a journal begun before several causes, replayed as one
    confidence_asked: float | None = None  # --confidence or search.confidence
    next_steps: list[dict] = field(default_factory=list)  # next_steps(): what to run next
    size_one: list[str] | None = None  # edges the discovery run's audit found size-one (None: none audited)
    graph: dict | None = None  # the prefetch graph searched (the report draws it: a static one has no run dir)

    @property
    def confidence_met(self) -> bool:
        """A verdict reached at the confidence asked (an inconclusive one never is)."""
        return confidence_met(self.result, self.confidence_asked)

    @property
    def verdict(self) -> str:
        return self.result.verdict

    def to_json(self) -> dict:
        data = result_to_json(self.result, self.reproduce, run=self.run)
        for cause in data["culprit_sets"]:
            flagged = [e for e in cause["edges"] if e in set(self.size_one or [])]
            cause["size_one"] = None if self.size_one is None else len(flagged) == len(cause["edges"])
            cause["size_one_edges"] = None if self.size_one is None else flagged
        return data | {
            "next_steps": self.next_steps,
            "size_one_edges": self.size_one,
            "graph": self.graph,
            "experiment": self.experiment,
            "elapsed_s": self.elapsed_s,
            "deterministic_masks": self.deterministic_masks,
            "runs_launched": self.runs_launched,
            "runs_reused": self.runs_reused,
            "earlier_all_off": self.earlier_all_off,
            "runs_lost": self.runs_lost,
            "segments": self.segments,
            "suspects": self.suspects,
            "hints": self.hints,
            "golden_drifts": self.golden_drifts,
            "run_details": self.run_details,
            "stress": self.stress,
            "signals": self.signals,
            "step_time": self.step_time,
            "search_kind": self.search,
            "confidence_asked": self.confidence_asked,
            "confidence_met": self.confidence_met,
        }


def fix_edges(result: SearchResult) -> list[str]:
    """The edges a fix switches off: every cause's (the minimal set where one cause)."""
    if len(result.culprit_sets) > 1:
        return sorted({e for c in result.culprit_sets for e in c["edges"]})
    return list(result.minimal_set)


def keep_only(edges: Sequence[str]) -> str:
    return "keep-only:" + quote_edges(edges)


def drop_only(edges: Sequence[str]) -> str:
    return "drop-only:" + quote_edges(edges)


def reproduce_mask(result: SearchResult) -> str | None:
    """The --mask value to run again: keep-only of the minimal set reproduces the drift; with
    several causes, drop-only of their union shows the whole fix."""
    if len(result.culprit_sets) > 1:
        return drop_only(fix_edges(result))
    return keep_only(result.minimal_set) if result.minimal_set else None


def _chances(result: SearchResult) -> list[float | None]:
    """Each cause's per-run chance (None where none was measured: no drift seen)."""
    chances = ([c.get("per_run_chance") for c in result.culprit_sets]
               or [result.calibration.get("per_run_chance")])
    return [c if c else None for c in chances]


def aa_command(given: Given, *, mask: str | None, runs: int, guard: str | None = None) -> str:
    """An `aa` to paste, with the options of the bisect command as given that aa accepts
    (--state-dir, --executor, --stress, --reuse...)."""
    return given.follow_up("aa", runs=runs, mask=mask, guard=guard, resume=None)


def reproduce_command(given: Given, result: SearchResult) -> str:
    """bisect.json's `reproduce`: as many runs as show the weakest cause but for 5% (the
    matrix's `cells_from` rule, experiment/verdict_cells.runs_to_see)."""
    return aa_command(given, mask=reproduce_mask(result), runs=runs_to_see(_chances(result)))


def next_steps(given: Given, result: SearchResult, *, size_one: list[str] | None,
               guard_result: dict | None, stress: str | None = None) -> list[dict]:
    """bisect.json's `next_steps`, in order: the size-one guard check (when a cause's edge
    targets a size-one unit, with its result from the journal), each cause reproduced alone
    (keep-only), the whole fix (drop-only of every cause), each cause explained; for drift
    that is not prefetch, explain with every edge off (report/verdict_block.py words them)."""
    sets = [list(c["edges"]) for c in result.culprit_sets] or (
        [list(result.minimal_set)] if result.minimal_set and result.verdict == VERDICT_FOUND else [])
    steps: list[dict] = []
    flagged = sorted({e for edges in sets for e in edges if e in set(size_one or [])})
    if flagged:
        steps.append({"step": STEP_GUARD, "cause": None, "edges": flagged,
                      "command": aa_command(given, mask=None, guard=GUARD_SIZE_ONE,
                                            runs=runs_to_see(_chances(result))),
                      "result": guard_result})
    chances = _chances(result)
    for number, edges in enumerate(sets, start=1):
        chance = chances[number - 1] if number <= len(chances) else None
        steps.append({"step": STEP_REPRODUCE, "cause": number, "edges": edges,
                      "command": aa_command(given, mask=keep_only(edges),
                                            runs=runs_to_see([chance]))})
    if sets:
        union = sorted({e for edges in sets for e in edges})
        steps.append({"step": STEP_FIX, "cause": None, "edges": union,
                      "command": aa_command(given, mask=drop_only(union),
                                            runs=runs_to_see(chances))})
    for number, edges in enumerate(sets, start=1):
        steps.append({"step": STEP_EXPLAIN, "cause": number, "edges": edges,
                      "command": explain_command(given, VERDICT_FOUND, edges, stress=stress)})
    if result.verdict == VERDICT_NOT_PREFETCH:
        steps.append({"step": STEP_EXPLAIN, "cause": None, "edges": [],
                      "command": explain_command(given, result.verdict, [], stress=stress)})
    return steps
