"""The verdict: what the search concludes, and the checked facts behind it, as numbers.

A decision to stop is one of Found, NoDriftReproduced, NotPrefetch,
Inconclusive; `conclude` turns it into the SearchResult. Each checked fact is a
small record of its own kind (`kind` says which, for the command that words
them and for the tests).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from bisect_prefetch.search.evidence import Evidence
from bisect_prefetch.search.stats import clopper_pearson, hazard_estimate, upper_bound_none_seen
from bisect_prefetch.vocab import (
    VERDICT_FOUND,
    VERDICT_INCONCLUSIVE,
    VERDICT_NO_DRIFT,
    VERDICT_NOT_PREFETCH,
)

STOP_REASONS = (
    "max-runs", "all-on-never-completed", "all-unresolved", "keep-only-never-completed",
    "not-finished",
)


# -- facts --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Background:
    """Background drift beside the culprit: all-off runs, how many diverged, the estimated p0."""

    kind: ClassVar[str] = "background"
    runs: int
    divergences: int
    chance: float


@dataclass(frozen=True)
class NoDrift:
    """Every edge enabled in `runs` clean runs (`all_on` of them all-on): `chance` is ruled out."""

    kind: ClassVar[str] = "no-drift"
    runs: int
    all_on: int
    chance: float


@dataclass(frozen=True)
class AllOffDiverged:
    """All-off runs and their divergences; chance: the estimated p0."""

    kind: ClassVar[str] = "all-off-diverged"
    runs: int
    divergences: int
    chance: float


@dataclass(frozen=True)
class Stopped:
    """Why the search stopped (STOP_REASONS; limit: the budget, for max-runs), with its best
    guess: edges (none: drift without prefetch) at probability chance."""

    kind: ClassVar[str] = "stopped"
    reason: str
    edges: tuple[str, ...]
    chance: float
    limit: int | None = None


@dataclass(frozen=True)
class KeepOnlyDiverged:
    """keep-only(edges) diverged: at run `run` of the search, first at training step `step`."""

    kind: ClassVar[str] = "keep-only-diverged"
    edges: tuple[str, ...]
    run: int
    step: int | None


@dataclass(frozen=True)
class EachNeeded:
    """Per edge, clean runs with the rest of the set but without it; chance: that some edge
    was not needed after all (a set from the reduce stage; None for a pair)."""

    kind: ClassVar[str] = "each-needed"
    edges: tuple[str, ...]
    clean_without: tuple[int, ...]
    chance: float | None = None


@dataclass(frozen=True)
class DropOnlyDiverges:
    """drop-only(edges) diverged while all-off stayed clean in `all_off_clean` runs."""

    kind: ClassVar[str] = "drop-only-diverges"
    edges: tuple[str, ...]
    all_off_clean: int


@dataclass(frozen=True)
class DropOnlyClean:
    kind: ClassVar[str] = "drop-only-clean"
    edges: tuple[str, ...]
    runs: int  # clean drop-only runs


@dataclass(frozen=True)
class DropOnlyFailed:
    kind: ClassVar[str] = "drop-only-failed"
    edges: tuple[str, ...]
    errors: int


@dataclass(frozen=True)
class DropOnlyNotRun:
    kind: ClassVar[str] = "drop-only-not-run"
    edges: tuple[str, ...]


@dataclass(frozen=True)
class BackgroundRuledOut:
    """Clean control runs (all-off, drop-only of the double check, in runs: the golden run's
    matched steps count as `golden` runs of them); chance: the per-run chance of drift
    without prefetch they rule out; strength: the answer's per-run chance."""

    kind: ClassVar[str] = "background-ruled-out"
    edges: tuple[str, ...]
    runs: float
    chance: float
    strength: float
    golden: float = 0.0


@dataclass(frozen=True)
class Causes:
    """Several independent causes (causes.py): each set enough alone, each found with the
    others off; drop-only of their union: `union_clean` consistent runs, `union_diverged`
    diverged ones; remains: drift remains with them off (another cause not yet found)."""

    kind: ClassVar[str] = "causes"
    sets: tuple[tuple[str, ...], ...]
    keep_only: tuple[tuple[int, int | None], ...]  # per set: its first keep-only divergence (run, step)
    union_clean: int
    union_diverged: int
    remains: bool = False
    background: float | None = None  # the drift left with them off is background drift, at this probability


Fact = (Causes | Background | NoDrift | AllOffDiverged | Stopped | KeepOnlyDiverged | EachNeeded | DropOnlyDiverges
        | DropOnlyClean | DropOnlyFailed | DropOnlyNotRun | BackgroundRuledOut)


@dataclass(frozen=True)
class SearchResult:
    verdict: str  # one of vocab.VERDICTS
    minimal_set: list[str]
    confidence: float
    runs_used: int  # trials: runs of one mask, or segments of runs (segments.py)
    steps_used: int
    evidence: list[dict]  # one row per block of runs (Block.to_dict)
    calibration: dict  # per_run_chance, interval, hazard_per_step, runs, divergences, ...
    facts: list[Fact]  # the checked statements behind the verdict
    drop_only_diverges: bool | None = None  # None when drop-only was not run
    top_hypotheses: list[dict] = field(default_factory=list)
    startups: int | None = None  # the training runs the trials took (None: as many as trials)
    finished: bool = True
    # Every cause found (causes.py), each {"edges", "confidence", "per_run_chance",
    # "keep_only_runs"}; minimal_set is the first's edges.
    culprit_sets: list[dict] = field(default_factory=list)


# -- decisions to stop ----------------------------------------------------------------------
@dataclass(frozen=True)
class Found:
    edges: tuple[int, ...]


@dataclass(frozen=True)
class NoDriftReproduced:
    pass


@dataclass(frozen=True)
class NotPrefetch:
    doubt: float = 0.0  # the chance that all-off diverges far less often after all (checks.py)


@dataclass(frozen=True)
class Inconclusive:
    reason: str  # one of STOP_REASONS


Finish = Found | NoDriftReproduced | NotPrefetch | Inconclusive


class Conclusions:
    """Builds the SearchResult of a decision to stop from the runs so far."""

    def __init__(self, ev: Evidence) -> None:
        self.ev = ev
        self.log = ev.log
        self.model = ev.model
        self.confidence = ev.settings.confidence

    def conclude(self, finish: Finish, *, budget: int, reducing: bool, finished: bool = True) -> SearchResult:
        if isinstance(finish, Found):
            return self._found(finish.edges)
        if isinstance(finish, NoDriftReproduced):
            n = self.ev.clean_cover()
            fact = NoDrift(n, self.log.tally(self.log.all_on).clean, upper_bound_none_seen(n, self.confidence))
            return self._result(VERDICT_NO_DRIFT, (), self.confidence, [fact])
        if isinstance(finish, NotPrefetch):
            off = self.log.tally(self.log.all_off)
            fact = AllOffDiverged(off.clean + off.divergences, off.divergences, self.model.background())
            confidence = self.model.probability_of(()) * (1.0 - finish.doubt)
            return self._result(VERDICT_NOT_PREFETCH, (), confidence, [fact])
        stopped = self._stopped(finish.reason, budget=budget, reducing=reducing)
        return self._result(VERDICT_INCONCLUSIVE, (), self.model.top().probability, [stopped], finished=finished)

    def _stopped(self, reason: str, *, budget: int, reducing: bool) -> Stopped:
        """Why the search stopped, with its best guess (no edges: drift without prefetch;
        in the reduce stage the core, at the chance that each of its edges is needed)."""
        limit = budget if reason == "max-runs" else None
        if reducing:
            core = self.log.core_edges()
            return Stopped(reason, self.log.ids(core), max(0.0, 1.0 - self.ev.members_error(core)), limit)
        top = self.model.top()
        return Stopped(reason, self.log.ids(top.edges), top.probability, limit)

    def _found(self, edges: tuple[int, ...]) -> SearchResult:
        log, ev = self.log, self.ev
        ids = log.ids(edges)
        run, result = log.first_divergence(log.keep_only(edges))
        facts: list[Fact] = [KeepOnlyDiverged(ids, run, result.first_diff_step)]
        if len(edges) > 1:
            facts.append(self._each_needed(edges))
        tally = log.tally(log.drop_only(edges))
        drop_diverges = bool(tally.divergences)
        confidence = 1.0 - ev.answer_error(edges)
        if drop_diverges:
            # Settles the second-cause question: the set is a cause, not the only one.
            facts.append(DropOnlyDiverges(ids, log.tally(log.all_off).clean))
        else:
            confidence -= ev.second_cause_error(edges)
            if tally.clean:
                facts.append(DropOnlyClean(ids, tally.clean))
            elif tally.errors:
                facts.append(DropOnlyFailed(ids, tally.errors))
            else:
                facts.append(DropOnlyNotRun(ids))
        ran_drop = drop_diverges or tally.clean > 0
        off = log.tally(log.all_off)
        if off.divergences:
            # Background drift beside the culprit: the set's rate stands clearly above it.
            facts.append(Background(off.clean + off.divergences, off.divergences, self.model.background()))
        elif not drop_diverges:
            # What the control runs rule out (all_off_runs="auto": enough for drift
            # without prefetch as strong as the answer's; otherwise as many as ran). The
            # chance that such drift hid from every control is part of the verdict's error.
            runs, strength = ev.controls(edges), ev.strength(edges)
            confidence -= (1 - strength) ** runs
            facts.append(BackgroundRuledOut(ids, runs, upper_bound_none_seen(runs, self.confidence), strength,
                                            self.log.golden_runs()))
        return self._result(VERDICT_FOUND, edges, max(confidence, 0.0), facts,
                            drop=drop_diverges if ran_drop else None)

    def _each_needed(self, edges: Sequence[int]) -> EachNeeded:
        """The evidence that every edge of the set is needed: clean runs with the rest of it but not that edge."""
        ids = self.log.ids(edges)
        clean = tuple(self.log.clean_with_without(set(ids) - {e}, e) for e in ids)
        return EachNeeded(ids, clean, self.ev.members_error(edges) if len(edges) > 2 else None)

    def _calibration(self, edges: Sequence[int]) -> dict:
        """The per-run chance and per-step hazard, from the runs that enabled the set.

        Those runs include the divergences that singled the set out, so the
        estimate leans high; the interval says how far to trust it.
        """
        runs = self.log.covering(self.log.keep_only(edges) if edges else self.log.all_on)
        diffs = [r.first_diff_step or r.steps for r in runs if r.diverged]
        clean_steps = [r.steps for r in runs if not r.diverged]
        low, high = clopper_pearson(len(diffs), len(runs), self.confidence) if runs else (0.0, 1.0)
        return {
            "per_run_chance": len(diffs) / len(runs) if runs else None,
            "interval": [low, high],
            "interval_confidence": self.confidence,
            "hazard_per_step": hazard_estimate(diffs, clean_steps),
            "runs": len(runs),
            "divergences": len(diffs),
            "first_diff_steps": diffs,
        }

    def top_hypotheses(self) -> list[dict]:
        """The five most probable culprit sets with their probabilities."""
        return [
            {"kind": h.kind, "edges": [self.log.edge_ids[i] for i in h.edges], "probability": h.probability}
            for h in self.model.ranked(5)
        ]

    def _result(self, verdict, minimal, confidence, facts, *, drop=None, finished=True) -> SearchResult:
        return SearchResult(
            verdict=verdict,
            minimal_set=[self.log.edge_ids[i] for i in sorted(minimal)],
            confidence=float(confidence),
            runs_used=self.log.runs_used,
            steps_used=self.log.steps_used,
            evidence=[b.to_dict() for b in self.log.blocks],
            calibration=self._calibration(minimal),
            facts=facts,
            drop_only_diverges=drop,
            top_hypotheses=self.top_hypotheses(),
            finished=finished,
            startups=self.log.startups if self.log.startups != self.log.runs_used else None,
        )
