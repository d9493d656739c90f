"""Several independent causes: each found by a search of its own, peeled off, and the whole fix checked.

Why. The posterior (posterior.py) holds one cause: a set (one edge, or a pair needed
together). With two independent causes A and B, a run that enables B but not A
diverges, and counts against A: the one-cause posterior is pulled apart and never
settles. So the causes are found one at a time, each by a one-cause search
(protocol.py) over a *universe* that holds only one of them:

1. A stage searches the edges not yet named as causes; every edge outside its
   universe stays off in every run it asks for (a found cause too).
2. Narrowing. Without a second cause, every diverged run enables the cause. So once
   two diverged runs of the stage share no edge, while all-off diverged far less often
   than they did (CLEARLY_ABOVE: background drift would hit all-off as often), there
   is more than one cause: the stage is narrowed to the edges of the smallest diverged
   mask (a cause is in there) and searched again inside it. One cause beside background
   drift makes such a pair too, so the runs that left the stage's likeliest set out must
   also have diverged clearly more often than all-off (NARROW_BEYOND); until then the
   stage's own model absorbs the drift as background.
3. Peeling. A stage's answer is a cause. When the stage was a narrowed one, or its
   answer's drop-only still diverged while all-off stayed clean (checks.py), another
   cause may remain: a new stage searches every edge left, every cause found off.
4. A later stage (narrowed or peeled) must tell the drift the causes found left from
   background drift. It asks first for clean all-off runs that would show background
   drift as strong as that drift (`_all_off_for`); each set keeps the prior it has in
   the whole graph, a peeled stage's times DISJOINT_CAUSES, the rest is "no cause
   here" (posterior.sub_prior), which settles it once it holds the confidence and (a
   peeled stage) all-on of its edges, drop-only of the union, stayed clean often enough
   to show a cause as strong as the weakest found (`_peel_runs`); and keep-only of its
   answer must diverge twice (the reduce step's core too: reduce_step.py).
   The first stage's not-prefetch waits, too: two causes, whose diverged runs share no
   edge, look like drift without prefetch to the one-cause model, so all-off must be
   shown to diverge about as often as the other runs (checks.py); if it diverges far
   less often, the drift is prefetch's and step 2 narrows.
5. The end. A peeled stage whose answer's drop-only (drop-only of the union of every
   cause) stays clean, that finds no drift, or whose drift is background: culprit-
   found, naming every cause. A narrowed stage that finds nothing (its divergence was
   chance) goes back to every edge left, that mask set aside. Out of runs between
   causes: inconclusive, with the sets found.

Every stage counts every earlier run its universe could have seen (a run that
enabled no edge outside it) as evidence (Bisection.reuse), so nothing is run twice.
The whole answer's confidence: each cause's probability from the runs that enabled
no other cause found (with the others off the one-cause model holds), times the last
stage's own check that none is missing (`_confidence`).

When the runs show that the golden run drifted itself (golden_drift.py), the search
starts again from every run as a golden run that had not drifted would have judged it,
and asks for nothing (`golden_drifted`) until its driver gives it a new golden run.

The interface is Bisection's (the bisect loop, segments and the simulator drive
either): propose, pending, record, cancel, done, result, events, notices.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from bisect_prefetch.search import verdict as v
from bisect_prefetch.search.checks import MIN_DROP_ONLY
from bisect_prefetch.search.evidence import DISJOINT_CAUSES
from bisect_prefetch.search.golden_drift import drift_step, drifted_golden, rejudged
from bisect_prefetch.search.oracle import RunResult
from bisect_prefetch.search.posterior import CLEARLY_ABOVE, EdgePosterior, sub_prior
from bisect_prefetch.search.protocol import Bisection
from bisect_prefetch.search.runlog import Ask, Block
from bisect_prefetch.search.stats import chance_below
from bisect_prefetch.search.verdict import SearchResult
from bisect_prefetch.vocab import (
    DEFAULT_CONFIDENCE,
    VERDICT_FOUND,
    VERDICT_INCONCLUSIVE,
    VERDICT_NO_DRIFT,
    VERDICT_NOT_PREFETCH,
    Mask,
)

# Why a stage searches where it does (Stage.why; the notices say it).
EVERY_EDGE = "every-edge"  # the first stage
PEELED = "peeled"  # every edge not yet a cause
NARROWED = "narrowed"  # the edges of one diverged mask
# Notices that say a stage ended (the next one searches elsewhere).
STAGE_ENDED = ("narrowed", "cause-found", "narrowing-found-nothing")
# The most clean all-off runs a stage asks for first (_all_off_for): drift rarer than
# 1 in 8 runs takes more, and the stage's own double check adds its background controls.
MAX_ALL_OFF = 24
# Narrowing waits until the runs that left the likeliest set out diverge more than twice
# as often as all-off with this chance (_beyond_background). Simulated, one culprit beside
# background drift at 0.02 on 67 edges, 100 searches: accuracy 0.92 -> 0.95 (the one-cause
# search's), mean runs 111 -> 91; two causes beside it (14 edges) 0.93 -> 0.96; two causes
# alone 33 -> 35.5 median runs.
NARROW_BEYOND = 0.9


@dataclass
class Stage:
    """One one-cause search over its universe (the edges it may enable)."""

    universe: Mask
    search: Bisection
    why: str  # EVERY_EDGE, PEELED or NARROWED (its universe is then the diverged mask)


@dataclass(frozen=True)
class Cause:
    """A set found by a stage: the stage's result says how it was checked."""

    edges: tuple[str, ...]
    result: SearchResult
    strength: float  # its per-run chance for the checks (Evidence.strength)


class CauseSearch:
    """Bisection's interface over one or more causes (module docstring).

        search = CauseSearch(edge_ids, confidence=0.95, steps_per_run=30)
        search.golden(30)
        while not search.done:
            ask = search.pending
            search.record(ask.mask, result)
        search.result()   # .culprit_sets: every cause found
    """

    def __init__(self, edge_ids: Sequence[str], *, confidence: float = DEFAULT_CONFIDENCE, max_runs: int | None = None,
                 calibration_runs: int | None = None, all_off_runs: int | str = "auto",
                 steps_per_run: int | None = None, max_errors: int = 3, suspects: Sequence[str] = ()) -> None:
        self._arguments = dict(locals())  # to start again against a new golden run (golden_drift.py)
        del self._arguments["self"]
        self.edge_ids = list(edge_ids)
        self.confidence = confidence
        self.max_runs = max_runs
        self._options = {"confidence": confidence, "all_off_runs": all_off_runs,
                         "steps_per_run": steps_per_run, "max_errors": max_errors}
        self._suspects = list(suspects)
        self.causes: list[Cause] = []
        self.notices: list[dict] = []
        self.history: list[tuple[int, Mask, RunResult]] = []  # (run number, mask, result), every run
        self._earlier: list[tuple[Mask, RunResult]] = []  # earlier commands' runs (reuse)
        self._set_aside: list[Mask] = []  # narrowings that found no cause
        self._orphans: list[Ask] = []  # runs in flight no current stage asked for
        self._finished: list[Block] = []  # the blocks of the stages before the current one
        self._orphan_runs = self._orphan_steps = self._orphan_startups = 0
        self._golden_steps: int | None = None
        self._matched = 0
        self._share = 1.0
        self._result: SearchResult | None = None
        self._alone: dict[tuple[str, ...], float] = {}  # each cause's probability with the others off
        self._narrow_seen = (0, 0)  # (stages, runs) when _narrow last looked
        self.stages: list[Stage] = []
        # The runs compared with the current golden run (golden_drift.py reads them), the
        # step it drifted at until a new one is given (`golden`), and whether a run of
        # several masks was recorded (those are not read).
        self._compared: list[tuple[Mask, RunResult]] = []
        self.golden_drifted: int | None = None
        self._segmented = False
        self._start(frozenset(self.edge_ids), EVERY_EDGE, calibration_runs=calibration_runs)

    # -- the loop (Bisection's interface) ----------------------------------------------------
    @property
    def stage(self) -> Stage:
        return self.stages[-1]

    @property
    def done(self) -> bool:
        self._advance()  # proposing a run may have settled the stage (not-prefetch)
        return self._result is not None

    @property
    def pending(self) -> Ask | None:
        """The next run to ask for; none while a golden run that drifted is not replaced
        (every run would differ from it)."""
        return None if self.done or self.golden_drifted else self.stage.search.pending

    def propose(self, ask: Ask | None = None) -> Ask | None:
        """Bisection.propose; a run planned ahead for a later stage (segments.plan_run plans on a
        copy that may have moved on) is in flight here until a stage can count it."""
        if self.done:
            return None
        if ask is not None and not ask.mask <= self.stage.universe:
            self._orphans.append(ask)
            return ask
        return self.stage.search.propose(ask)

    def plan_trials(self, share: float) -> None:
        self._share = share
        self.stage.search.plan_trials(share)

    def golden(self, steps: int) -> None:
        """The golden run later runs are compared with (a new one after `golden_drifted`)."""
        self._golden_steps, self._matched = steps, 0
        self._compared, self.golden_drifted = [], None
        self.stage.search.golden(steps)

    def reuse(self, mask: Mask, result: RunResult) -> None:
        """An earlier command's run (Bisection.reuse): evidence for every stage that may see it."""
        self.stage.search.reuse(mask, result)
        self._earlier.append((frozenset(mask), result))
        self._compared.append((frozenset(mask), result))
        self._advance()

    def cancel(self, mask: Mask) -> None:
        """A run that will never report (Bisection.cancel). One that a stage ended since it was
        planned may be in flight nowhere any more: nothing to undo then."""
        mask = frozenset(mask)
        orphan = next((a for a in self._orphans if a.mask == mask), None)
        if orphan is not None:
            self._orphans.remove(orphan)
        elif self.stage.search.log.in_flight_of(mask):
            self.stage.search.cancel(mask)

    def record(self, mask: Mask, result: RunResult, *, hint: str | None = None, startup: bool = True,
               matched: int | None = None) -> None:
        """One finished run (Bisection.record). A run planned or asked before a stage ended is
        evidence for the current stage where its mask fits it (as a run the stage did not ask
        for: proposing it now could settle the stage before it is recorded), else counted only."""
        mask, number = frozenset(mask), self.runs_used + 1
        if matched is not None:
            self._matched = max(self._matched, matched)
            self._segmented = True
        self._compared.append((mask, result))
        if (step := self._golden_drift()) is not None:
            self._start_again(step, mask, result, hint=hint, startup=startup)
            return
        orphan = next((a for a in self._orphans if a.mask == mask), None)
        if orphan is not None:
            self._orphans.remove(orphan)
        if self._result is not None or not mask <= self.stage.universe:  # no stage may count it
            self._orphan_runs += 1
            self._orphan_steps += result.steps
            self._orphan_startups += startup
            self.history.append((number, mask, result))
            return
        self.stage.search.record(mask, result, hint=hint, startup=startup, matched=matched)
        self.history.append((number, mask, result))  # after: a stage started from here reuses it
        self._sync_notices()
        self._advance()

    def _golden_drift(self) -> int | None:
        """The step at which the runs show the golden run drifted (golden_drift.py), unless a
        golden run was already read as drifting there: drift at one step in every run, a new
        golden run's too, is the runs' own (and runs of several masks are not read)."""
        if self._segmented or self.golden_drifted is not None:
            return None
        step = drift_step(self._compared)
        seen = [n["step"] for n in self.notices if n["event"] == "golden-drifted"]
        return None if step in seen else step

    def _start_again(self, step: int, mask: Mask, result: RunResult, *, hint: str | None,
                     startup: bool) -> None:
        """The golden run drifted at `step` (golden_drift.py): the search starts again from
        every run so far, each as a correct golden run would have judged it, the golden run
        that drifted among them as an all-off run; it asks for nothing until a new golden
        run is given (`golden`)."""
        earlier = [(m, rejudged(r, step)) for m, r in self._earlier]
        runs = [(m, rejudged(r, step)) for _, m, r in self.history] + [(mask, rejudged(result, step))]
        read_again = sum(bool(r.diverged) and r.first_diff_step == step for _, r in self._compared)
        said = [*self.notices, {"event": "golden-drifted", "step": step, "runs": read_again}]
        self.__init__(**self._arguments)
        self.golden_drifted = step  # and the runs read again are not read for it again
        for m, r in [*earlier, (frozenset(), drifted_golden(step))]:
            self.reuse(m, r)
        for m, r in runs[:-1]:
            self.record(m, r)
        self.record(mask, runs[-1][1], hint=hint, startup=startup)
        self.notices = said + [n for n in self.notices if n not in said]  # what reading again added

    # -- stages -------------------------------------------------------------------------
    def _start(self, universe: Mask, why: str, *, calibration_runs: int | None = None,
               drift: float | None = None) -> None:
        """A new stage over `universe`, with every earlier run it could have seen as evidence;
        drift: the per-run chance of the drift it looks for, which clean all-off runs must
        first rule out as background drift."""
        used = self.runs_used
        ids = [e for e in self.edge_ids if e in universe]
        max_runs = None if self.max_runs is None else max(1, self.max_runs - used)
        search = Bisection(ids, max_runs=max_runs, calibration_runs=calibration_runs,
                           suspects=[s for s in self._suspects if s in universe] if not self.stages
                           else (), **self._options, **self._later(why, len(ids)), all_off_first=self._all_off_for(drift))
        search.log.graph_ids = self.edge_ids
        search.log.numbered_from = used
        for mask, result in self._earlier:
            if mask <= universe:
                search.reuse(mask, result)
        for number, mask, result in self.history:
            if result.completed and mask <= universe:
                search.reuse(mask, result, run=number)
        if self._golden_steps is not None:
            search.golden(self._golden_steps)
            search.log.match_golden(self._matched)
        search.plan_trials(self._share)
        if self.stages:
            self._finished += self.stage.search.events
            self._orphans += self.stage.search.in_flight
        self.stages.append(Stage(universe, search, why))
        self._notices_seen = len(search.notices)
        self.notices += search.notices

    def _later(self, why: str, edges: int) -> dict:
        """A later stage's search: each set keeps the prior it has in the whole graph (a peeled
        stage's times DISJOINT_CAUSES, the chance of one more cause), the rest is "no cause
        here", which settles the stage (the drift left is background drift); keep-only of
        its answer must diverge twice."""
        if why == EVERY_EDGE:
            return {"background_parity": True}
        share = DISJOINT_CAUSES if why == PEELED else 1.0
        return {"prior": sub_prior(edges, len(self.edge_ids), share), "none_settles": True,
                "none_after": self._peel_runs() if why == PEELED else 0, "keep_only_divergences": 2}

    def _all_off_for(self, drift: float | None) -> int:
        """Clean all-off runs that show background drift of this per-run chance with chance
        1 - alpha/2 (at most MAX_ALL_OFF)."""
        if drift is None:
            return 1
        needed = math.log((1 - self.confidence) / 2) / math.log(1 - min(max(drift, 0.02), 0.99))
        return min(MAX_ALL_OFF, math.ceil(needed))

    @staticmethod
    def _rate(runs: Sequence[RunResult]) -> float:
        """Per-run chance of drift these runs showed, under a uniform prior (not evidence.rate's
        Beta(1, 3), which pulls a rate seen in a few runs down and would ask for all-off runs
        against a background far weaker than the drift seen; the stage's own checks, keep-only
        twice and its prior, stand against background drift)."""
        done = [r for r in runs if r.completed]
        return (1 + sum(bool(r.diverged) for r in done)) / (2 + len(done))

    def _sync_notices(self) -> None:
        search = self.stage.search
        self.notices += search.notices[self._notices_seen:]
        self._notices_seen = len(search.notices)

    def _advance(self) -> None:
        """After a run: narrow the stage, or end it and start the next, until one asks for a run."""
        while self._result is None:
            stage = self.stage
            if not stage.search.done:
                if not self._narrow():
                    return
                continue
            self._after(stage, stage.search.result())

    def _narrow(self) -> bool:
        """Diverged runs of this stage that share no edge, while all-off diverged far less
        often than they did, and than the runs without the stage's likeliest set: search
        inside the smallest diverged mask (module docstring, 2). True: a new stage began."""
        search, universe = self.stage.search, self.stage.universe
        if search.checking or search.reducing or len(universe) < 2:
            return False
        seen = (len(self.stages), len(self.history))
        if seen == self._narrow_seen:  # nothing new since the last look
            return False
        self._narrow_seen = seen
        runs = [(m, r) for _, m, r in self.history if r.completed and m <= universe]
        diverged = [m for m, r in runs if m and r.diverged]
        if len(diverged) < 2 or frozenset.intersection(*diverged):
            return False
        off = [r for m, r in runs if not m]
        if off and self._share_diverged(off) * CLEARLY_ABOVE >= self._share_diverged([r for m, r in runs if m]):
            return False  # as often without prefetch: background drift explains them
        if not self._beyond_background(search):
            return False
        candidates = [m for m in diverged if m != universe and m not in self._set_aside]
        if not candidates:
            return False
        within = min(candidates, key=len)
        self.notices.append({"event": "narrowed", "edges_on": len(within), "edges": len(universe),
                             "mask": sorted(within)})
        # The drift the masks that diverged without the mask's edges showed: background drift
        # that strong would show in all-off runs.
        shown = {m for m in diverged if not m & within}
        self._start(within, NARROWED, drift=self._rate([r for m, r in runs if m in shown]))
        return True

    @staticmethod
    def _beyond_background(search: Bisection) -> bool:
        """Whether the runs that left the stage's likeliest set out diverged clearly more often
        than all-off (the golden run's matched steps counted): one cause beside background
        drift explains them otherwise, and the stage's own search absorbs that drift."""
        model = search.model
        top = model.top()  # none leading: every run that enabled an edge left no set out
        d_set, e_set = model.counts(top.edges) if top.kind != "none" else (0, 0.0)
        off = (model.off_divergences, model.off_exposure + search.log.golden_runs())
        without = (model.divergences - d_set - model.off_divergences,
                   model.exposure - e_set - model.off_exposure)
        return chance_below(off, without, CLEARLY_ABOVE) >= NARROW_BEYOND

    @staticmethod
    def _share_diverged(runs: Sequence[RunResult]) -> float:
        return sum(bool(r.diverged) for r in runs) / len(runs)

    def _after(self, stage: Stage, result: SearchResult) -> None:
        """A stage's verdict: a cause to peel, the end, or back from a narrowing."""
        left = frozenset(self.edge_ids) - self._named()
        if result.verdict == VERDICT_FOUND:
            edges = tuple(result.minimal_set)
            ev = stage.search.evidence
            strength = ev.strength(tuple(stage.search.edge_ids.index(e) for e in edges))
            cause = Cause(edges, result, strength)
            self.causes.append(cause)
            another = stage.why == NARROWED or (result.drop_only_diverges and not self._background(result))
            left -= set(cause.edges)
            if another and left:
                self.notices.append({"event": "cause-found", "edges": list(cause.edges),
                                     "number": len(self.causes), "left": len(left)})
                # The drift the masks that diverged without any cause found showed: background
                # drift that strong would show in all-off runs.
                named = self._named()
                shown = {m for _, m, r in self.history if m and not m & named and r.diverged}
                drift = self._rate([r for _, m, r in self.history if m in shown])
                self._start(left, PEELED, calibration_runs=self._peel_runs(), drift=drift)
                return
            self._conclude(result)
        elif stage.why == NARROWED and not _out_of_runs(result):
            self._set_aside.append(stage.universe)
            self.notices.append({"event": "narrowing-found-nothing", "mask": sorted(stage.universe),
                                 "verdict": result.verdict})
            self._start(left, PEELED if self.causes else EVERY_EDGE,
                        calibration_runs=self._peel_runs() if self.causes else None)
        else:
            self._conclude(result)

    def _named(self) -> frozenset[str]:
        return frozenset(e for c in self.causes for e in c.edges)

    def _background(self, result: SearchResult) -> bool:
        return any(f.kind == "background" for f in result.facts)

    def _strength(self) -> float:
        """The weakest cause's per-run chance (Evidence.strength): what a further cause must reach."""
        return max(0.02, min(c.strength for c in self.causes))

    def _peel_runs(self) -> int:
        """Clean runs of drop-only of the union that rule out a further cause as strong as the
        weakest found, at half the error budget (DISJOINT_CAUSES: the prior of one more)."""
        miss = (1 - self.confidence) / 2 / DISJOINT_CAUSES
        needed = math.log(miss) / math.log(1 - min(self._strength(), 0.99)) if miss < 1 else 0
        return max(MIN_DROP_ONLY, math.ceil(needed))

    # -- the verdict -----------------------------------------------------------------------
    def _conclude(self, last: SearchResult) -> None:
        """The whole answer, from the last stage's verdict and the causes peeled before it."""
        causes = self.causes
        if not causes or len(self.stages) == 1:  # one stage: its own verdict, as it said it
            self._result = replace(last, evidence=self._evidence(), runs_used=self.runs_used,
                                   steps_used=self.steps_used, startups=self._startups_or_none(),
                                   culprit_sets=[self._set_json(c) for c in causes])
            return
        self._alone = {c.edges: self._alone_probability(c) for c in causes}
        if last.verdict == VERDICT_INCONCLUSIVE:
            verdict, confidence = VERDICT_INCONCLUSIVE, last.confidence
        else:
            verdict, confidence = VERDICT_FOUND, self._confidence(last)
        sets = [self._set_json(c) for c in causes]
        first = causes[0].result
        first_keep = [next(f for f in c.result.facts if f.kind == "keep-only-diverged") for c in causes]
        facts: list[v.Fact] = [v.Causes(
            tuple(c.edges for c in causes), tuple((f.run, f.step) for f in first_keep),
            *self._union_checked(last), remains=verdict == VERDICT_INCONCLUSIVE,
            background=last.confidence if last.verdict == VERDICT_NOT_PREFETCH else None)]
        facts += [f for f in last.facts if f.kind in ("background", "stopped")]
        self._result = replace(
            first, verdict=verdict, confidence=confidence, culprit_sets=sets, facts=facts,
            evidence=self._evidence(), runs_used=self.runs_used, steps_used=self.steps_used,
            startups=self._startups_or_none(), top_hypotheses=last.top_hypotheses,
            drop_only_diverges=len(causes) > 1 or first.drop_only_diverges)

    def _confidence(self, last: SearchResult) -> float:
        """The chance the whole answer is right: each cause is one (with the others off), and
        none is missing: the last stage's own check (its answer's drop-only; or "no cause
        there" at its probability), or, a last stage without drift, that no further cause as
        strong as the weakest found hid from its clean runs of drop-only of the union."""
        alone = [self._alone[c.edges] for c in self.causes]
        if last.verdict == VERDICT_FOUND:  # the last cause: its stage's confidence says it all
            return math.prod(alone[:-1]) * last.confidence
        if last.verdict == VERDICT_NO_DRIFT:
            clean = self._union_checked(last)[0]
            return math.prod(alone) * (1 - DISJOINT_CAUSES * (1 - self._strength()) ** clean)
        return math.prod(alone) * last.confidence  # not-prefetch: the drift left is background

    def _alone_probability(self, cause: Cause) -> float:
        """The set's posterior probability from the runs that enabled no other cause found:
        with the others off, the one-cause model holds (a cause peeled while another was on
        had its drop-only runs, which the other made diverge, counted against it)."""
        others = self._named() - set(cause.edges)
        ids = [e for e in self.edge_ids if e not in others]
        index = {e: i for i, e in enumerate(ids)}
        model = EdgePosterior(len(ids))
        steps = self._options["steps_per_run"]
        for mask, result in self._earlier + [(m, r) for _, m, r in self.history]:
            if result.completed and not mask & others:
                enabled = np.zeros(len(ids), dtype=bool)
                enabled[[index[e] for e in mask]] = True
                share = 1.0 if result.diverged or not steps else min(1.0, result.steps / steps)
                model.observe(enabled, bool(result.diverged), share)
        return model.probability_of(tuple(index[e] for e in cause.edges))

    def _union_checked(self, last: SearchResult) -> tuple[int, int]:
        """(clean, diverged) runs of drop-only of the union of every cause found."""
        union = frozenset(self.edge_ids) - self._named()
        runs = [r for _, m, r in self.history if m == union and r.completed]
        return sum(not r.diverged for r in runs), sum(bool(r.diverged) for r in runs)

    def _set_json(self, cause: Cause) -> dict:
        """A cause as bisect.json's culprit_sets holds it (docs/contract.md)."""
        keep = frozenset(cause.edges)
        confidence = self._alone.get(cause.edges, cause.result.confidence)
        return {"edges": list(cause.edges), "confidence": confidence,
                "per_run_chance": cause.result.calibration["per_run_chance"],
                "keep_only_runs": [n for n, m, r in self.history if m == keep and r.diverged]}

    def result(self) -> SearchResult:
        if self._result is not None:
            return self._result
        partial = self.stage.search.result()
        return replace(partial, evidence=self._evidence(), runs_used=self.runs_used,
                       steps_used=self.steps_used, culprit_sets=[self._set_json(c) for c in self.causes])

    def _evidence(self) -> list[dict]:
        return [b.to_dict() for b in self.events]

    def _startups_or_none(self) -> int | None:
        return self.startups if self.startups != self.runs_used else None

    # -- reading ----------------------------------------------------------------------------
    @property
    def events(self) -> list[Block]:
        """The blocks of runs of every stage, in order (the current stage's still growing)."""
        return self._finished + self.stage.search.events

    @property
    def in_flight(self) -> list[Ask]:
        return self._orphans + self.stage.search.in_flight

    def _stages_sum(self, what: str) -> int:
        return sum(getattr(s.search, what) for s in self.stages)

    runs_used = property(lambda self: self._stages_sum("runs_used") + self._orphan_runs)
    steps_used = property(lambda self: self._stages_sum("steps_used") + self._orphan_steps)
    startups = property(lambda self: self._stages_sum("startups") + self._orphan_startups)


def _out_of_runs(result: SearchResult) -> bool:
    return any(f.kind == "stopped" and f.reason == "max-runs" for f in result.facts)


# What the bisect loop, segments and the simulator drive: one search, or the search for every cause.
Search = Bisection | CauseSearch
