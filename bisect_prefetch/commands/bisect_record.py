"""What a bisection writes down: bisect.json (and --json), field by field (docs/contract.md).

Built once, in the command's `finally:` (an interrupted search keeps what it
learned), from the search's result and what the command did about stress,
segments and earlier runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bisect_prefetch.commands.bisect_words import confidence_met, fact_lines
from bisect_prefetch.commands.common import Given
from bisect_prefetch.search.causes import Search
from bisect_prefetch.search.segments import Lengths
from bisect_prefetch.search.stress import StressChoice
from bisect_prefetch.search.verdict import SearchResult
from bisect_prefetch.vocab import quote_edges

REPRODUCE_RUNS = 4
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


def result_to_json(result: SearchResult, reproduce: str, *,
                   run: Callable[[int], int] = _same) -> dict:
    """The bisect JSON of docs/contract.md: verdict, minimal_set, confidence, runs_used, steps_used,
    evidence, reproduce; plus the facts (in words), calibration and best hypotheses."""
    return {
        "verdict": result.verdict,
        "minimal_set": list(result.minimal_set),
        "culprit_sets": [dict(c) for c in result.culprit_sets],
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
    signals: dict | None  # what the runs measured (runs/signals.py)
    step_time: dict | None
    search: str = EVERY_CAUSE  # ONE_CAUSE: a journal begun before several causes, replayed as one
    confidence_asked: float | None = None  # --confidence or search.confidence

    @property
    def confidence_met(self) -> bool:
        """A verdict reached at the confidence asked (an inconclusive one never is)."""
        return confidence_met(self.result, self.confidence_asked)

    @property
    def verdict(self) -> str:
        return self.result.verdict

    def to_json(self) -> dict:
        return result_to_json(self.result, self.reproduce, run=self.run) | {
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


def reproduce_mask(result: SearchResult) -> str | None:
    """The --mask value to run again: keep-only of the minimal set reproduces the drift; with
    several causes, drop-only of their union shows the whole fix."""
    if len(result.culprit_sets) > 1:
        return "drop-only:" + quote_edges(fix_edges(result))
    return "keep-only:" + quote_edges(result.minimal_set) if result.minimal_set else None


def reproduce_command(given: Given, result: SearchResult) -> str:
    """The aa command that shows the answer again, with the options of the bisect command
    as given that aa accepts (--state-dir, --executor, --stress, --reuse...)."""
    return given.follow_up("aa", runs=REPRODUCE_RUNS, mask=reproduce_mask(result), resume=None)


