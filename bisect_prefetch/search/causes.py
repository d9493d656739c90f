"""Several independent causes: each found by a search of its own, peeled off, and the whole fix checked.

Why. The posterior (posterior.py) holds one cause: a set (one edge, or a pair needed
together). With two independent causes A and B, a run that enables B but not A
diverges, and counts against A: the one-cause posterior is pulled apart and never
settles. So the causes are found one at a time, each by a one-cause search
(protocol.py) over a *universe* that holds only one of them:

1. A round searches the edges not yet named as causes; every edge outside its
   universe stays off in every run it asks for (a found cause too).
2. Narrowing. Without a second cause, every diverged run enables the cause. So once
   two diverged runs of the round share no edge, while all-off diverged far less often
   than they did (CLEARLY_ABOVE: background drift would hit all-off as often), there
   is more than one cause: the round is narrowed to the edges of the smallest diverged
   mask (a cause is in there) and searched again inside it. One cause beside background
   drift makes such a pair too, so the runs that left the round's likeliest set out must
   also have diverged clearly more often than all-off (NARROW_BEYOND); until then the
   round's own model absorbs the drift as background.
3. Peeling. A round's answer is a cause. When the round was a narrowed one, or its
   answer's drop-only still diverged while all-off stayed clean (checks.py), another
   cause may remain: a new round searches every edge left, every cause found off.
4. A later round (narrowed or peeled) must tell the drift the causes found left from
   background drift. It asks first for clean all-off runs that would show background
   drift as strong as that drift (background.all_off_for); each set keeps the prior it has in
   the whole graph, a peeled round's times DISJOINT_CAUSES, the rest is "no cause
   here" (posterior.sub_prior), which settles it once it holds the confidence and (a
   peeled round) all-on of its edges, drop-only of the union, stayed clean often enough
   to show a cause as strong as the weakest found (background.peel_runs); and keep-only of its
   answer must diverge twice (the reduce stage's core too: reduce_stage.py).
   The first round's not-prefetch waits, too: two causes, whose diverged runs share no
   edge, look like drift without prefetch to the one-cause model, so all-off must be
   shown to diverge about as often as the other runs (checks.py); if it diverges far
   less often, the drift is prefetch's and 2 narrows.
5. The end. A peeled round whose answer's drop-only (drop-only of the union of every
   cause) stays clean, that finds no drift, or whose drift is background: culprit-
   found, naming every cause. A narrowed round that finds nothing (its divergence was
   chance) goes back to every edge left, that mask set aside. Out of runs between
   causes: inconclusive, with the sets found.

Every round counts every earlier run its universe could have seen (a run that
enabled no edge outside it) as evidence (Bisection.reuse), so nothing is run twice.
The whole answer's confidence: each cause's probability from the runs that enabled
no other cause found (with the others off the one-cause model holds), times the last
round's own check that none is missing (causes_answer.py).

When the runs show that the golden run drifted itself (golden_drift.py), the search
starts again from every run as a golden run that had not drifted would have judged it,
and asks for nothing (`golden_drifted`) until its driver gives it a new golden run.

The interface is Bisection's (the bisect loop, segments and the simulator drive
either; search/interface.py): propose, pending, record, cancel, done, result, blocks, notices.
Its parts: the rounds (rounds.py), the background-drift judgement between them
(background.py), the whole answer (causes_answer.py) and the replay after a golden run
drifted (golden_drift.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from bisect_prefetch.search.background import is_background, peel_runs, rate
from bisect_prefetch.search.causes_answer import Cause, Found
from bisect_prefetch.search.golden_drift import GoldenWatch, start_again
from bisect_prefetch.search.oracle import RunResult
from bisect_prefetch.search.rounds import (
    EVERY_EDGE,
    NARROWED,
    PEELED,
    Round,
    Seen,
    narrowing,
    open_round,
)
from bisect_prefetch.search.runlog import Ask, Block
from bisect_prefetch.search.verdict import SearchResult
from bisect_prefetch.vocab import DEFAULT_CONFIDENCE, VERDICT_FOUND, Mask


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
        self.causes: list[Cause] = []
        self.notices: list[dict] = []
        self.history: list[tuple[int, Mask, RunResult]] = []  # (run number, mask, result), every run
        self.earlier: list[tuple[Mask, RunResult]] = []  # earlier commands' runs (reuse)
        self.watch = GoldenWatch()  # the golden run and the runs compared with it (golden_drift.py)
        self._share = 1.0
        self._set_aside: list[Mask] = []  # narrowings that found no cause
        self._orphans: list[Ask] = []  # runs in flight no current round asked for
        self._uncounted = {"runs": 0, "steps": 0, "startups": 0}  # runs no round could count
        self._finished: list[Block] = []  # the blocks of the rounds before the current one
        self._narrow_seen = (0, 0)  # (rounds, runs) when _narrow last looked
        self._result: SearchResult | None = None
        self.rounds: list[Round] = []
        self._start(frozenset(self.edge_ids), EVERY_EDGE, calibration_runs=calibration_runs,
                    suspects=suspects)

    def restart(self) -> None:
        """As new, for the replay after a golden run drifted (golden_drift.start_again)."""
        self.__init__(**self._arguments)

    # -- the loop (Bisection's interface) ----------------------------------------------------
    golden_drifted = property(lambda self: self.watch.drifted,
                              doc="the step the golden run drifted at, until `golden` gives a new one")

    @property
    def round(self) -> Round:
        return self.rounds[-1]

    @property
    def done(self) -> bool:
        self._advance()  # proposing a run may have settled the round (not-prefetch)
        return self._result is not None

    @property
    def pending(self) -> Ask | None:
        """The next run to ask for; none while a golden run that drifted is not replaced
        (every run would differ from it)."""
        return None if self.done or self.golden_drifted else self.round.search.pending

    def propose(self, ask: Ask | None = None) -> Ask | None:
        """Bisection.propose; a run planned ahead for a later round (segments.plan_run plans on a
        copy that may have moved on) is in flight here until a round can count it."""
        if self.done:
            return None
        if ask is not None and not ask.mask <= self.round.universe:
            self._orphans.append(ask)
            return ask
        return self.round.search.propose(ask)

    def plan_trials(self, share: float) -> None:
        self._share = share
        self.round.search.plan_trials(share)

    def golden(self, steps: int) -> None:
        """The golden run later runs are compared with (a new one after `golden_drifted`)."""
        self.watch.given(steps)
        self.round.search.golden(steps)

    def reuse(self, mask: Mask, result: RunResult) -> None:
        """An earlier command's run (Bisection.reuse): evidence for every round that may see it."""
        self.round.search.reuse(mask, result)
        self.earlier.append((frozenset(mask), result))
        self.watch.compared.append((frozenset(mask), result))
        self._advance()

    def cancel(self, mask: Mask) -> None:
        """A run that will never report (Bisection.cancel). One that a round ended since it was
        planned may be in flight nowhere any more: nothing to undo then."""
        mask = frozenset(mask)
        orphan = next((a for a in self._orphans if a.mask == mask), None)
        if orphan is not None:
            self._orphans.remove(orphan)
        elif self.round.search.log.in_flight_of(mask):
            self.round.search.cancel(mask)

    def record(self, mask: Mask, result: RunResult, *, hint: str | None = None, startup: bool = True,
               matched: int | None = None) -> None:
        """One finished run (Bisection.record). A run planned or asked before a round ended is
        evidence for the current round where its mask fits it (as a run the round did not ask
        for: proposing it now could settle the round before it is recorded), else counted only."""
        mask, number = frozenset(mask), self.runs_used + 1
        if (step := self.watch.heard(mask, result, matched, self.notices)) is not None:
            start_again(self, step, mask, result, hint=hint, startup=startup)
            return
        orphan = next((a for a in self._orphans if a.mask == mask), None)
        if orphan is not None:
            self._orphans.remove(orphan)
        if self._result is not None or not mask <= self.round.universe:  # no round may count it
            for key, value in (("runs", 1), ("steps", result.steps), ("startups", startup)):
                self._uncounted[key] += value
            self.history.append((number, mask, result))
            return
        self.round.search.record(mask, result, hint=hint, startup=startup, matched=matched)
        self.history.append((number, mask, result))  # after: a round started from here reuses it
        self._sync_notices()
        self._advance()

    # -- rounds -------------------------------------------------------------------------
    def _start(self, universe: Mask, why: str, *, calibration_runs: int | None = None,
               drift: float | None = None, suspects: Sequence[str] = ()) -> None:
        """A new round over `universe` (rounds.open_round); drift: the per-run chance of the
        drift it looks for, which clean all-off runs must first rule out as background drift."""
        seen = Seen(self.earlier, self.history, self.watch.steps, self.watch.matched, self._share)
        new = open_round(universe, why, graph_ids=self.edge_ids, used=self.runs_used, max_runs=self.max_runs,
                         options=self._options, seen=seen, drift=drift, calibration_runs=calibration_runs,
                         suspects=suspects, peel=self._peel_runs() if why == PEELED else 0)
        if self.rounds:
            self._finished += self.round.search.blocks
            self._orphans += self.round.search.in_flight
        self.rounds.append(new)
        self._notices_seen = len(new.search.notices)
        self.notices += new.search.notices

    def _sync_notices(self) -> None:
        search = self.round.search
        self.notices += search.notices[self._notices_seen:]
        self._notices_seen = len(search.notices)

    def _advance(self) -> None:
        """After a run: narrow the round, or end it and start the next, until one asks for a run."""
        while self._result is None:
            current = self.round
            if not current.search.done:
                if not self._narrow():
                    return
                continue
            self._after(current, current.search.result())

    def _narrow(self) -> bool:
        """Narrow the round where its runs show more than one cause (rounds.narrowing).
        True: a new round began."""
        search, universe = self.round.search, self.round.universe
        if search.checking or search.reducing or len(universe) < 2:
            return False
        seen = (len(self.rounds), len(self.history))
        if seen == self._narrow_seen:  # nothing new since the last look
            return False
        self._narrow_seen = seen
        narrowed = narrowing(self.round, self.history, self._set_aside)
        if narrowed is None:
            return False
        within, drift = narrowed
        self.notices.append({"event": "narrowed", "edges_on": len(within), "edges": len(universe),
                             "mask": sorted(within), "round": len(self.rounds) + 1})
        self._start(within, NARROWED, drift=drift)
        return True

    def _after(self, ended: Round, result: SearchResult) -> None:
        """A round's verdict: a cause to peel, the end, or back from a narrowing."""
        left = frozenset(self.edge_ids) - self._found().named()
        if result.verdict == VERDICT_FOUND:
            edges = tuple(result.minimal_set)
            strength = ended.search.evidence.strength(tuple(ended.search.edge_ids.index(e) for e in edges))
            self.causes.append(Cause(edges, result, strength))
            another = ended.why == NARROWED or (result.drop_only_diverges and not is_background(result))
            left -= set(edges)
            if another and left:
                self.notices.append({"event": "cause-found", "edges": list(edges), "number": len(self.causes),
                                     "left": len(left), "round": len(self.rounds) + 1})
                # The drift the masks that diverged without any cause found showed: background
                # drift that strong would show in all-off runs.
                named = self._found().named()
                shown = {m for _, m, r in self.history if m and not m & named and r.diverged}
                drift = rate([r for _, m, r in self.history if m in shown])
                self._start(left, PEELED, calibration_runs=self._peel_runs(), drift=drift)
                return
            self._conclude(result)
        elif ended.why == NARROWED and not _out_of_runs(result):
            self._set_aside.append(ended.universe)
            self.notices.append({"event": "narrowing-found-nothing", "mask": sorted(ended.universe),
                                 "verdict": result.verdict, "round": len(self.rounds) + 1})
            self._start(left, PEELED if self.causes else EVERY_EDGE,
                        calibration_runs=self._peel_runs() if self.causes else None)
        else:
            self._conclude(result)

    def _peel_runs(self) -> int:
        return peel_runs(self.confidence, [c.strength for c in self.causes])

    # -- the verdict -----------------------------------------------------------------------
    def _found(self) -> Found:
        return Found(self.edge_ids, self.causes, self.history, self.earlier, self.confidence,
                     self._options["steps_per_run"])

    def _totals(self) -> dict:
        startups = self.startups if self.startups != self.runs_used else None
        return {"evidence": [b.to_dict() for b in self.blocks], "runs_used": self.runs_used,
                "steps_used": self.steps_used, "startups": startups}

    def _conclude(self, last: SearchResult) -> None:
        """The whole answer, from the last round's verdict and the causes peeled before it."""
        self._result = self._found().conclude(last, rounds=len(self.rounds), totals=self._totals())

    def result(self) -> SearchResult:
        if self._result is not None:
            return self._result
        found = self._found()
        return replace(self.round.search.result(), evidence=self._totals()["evidence"], runs_used=self.runs_used,
                       steps_used=self.steps_used, culprit_sets=[found.set_json(c) for c in self.causes])

    # -- reading ----------------------------------------------------------------------------
    @property
    def blocks(self) -> list[Block]:
        """The blocks of runs of every round, in order (the current round's still growing)."""
        return self._finished + self.round.search.blocks

    @property
    def in_flight(self) -> list[Ask]:
        return self._orphans + self.round.search.in_flight

    def _rounds_sum(self, what: str) -> int:
        return sum(getattr(r.search, what) for r in self.rounds)

    runs_used = property(lambda self: self._rounds_sum("runs_used") + self._uncounted["runs"])
    steps_used = property(lambda self: self._rounds_sum("steps_used") + self._uncounted["steps"])
    startups = property(lambda self: self._rounds_sum("startups") + self._uncounted["startups"])


def _out_of_runs(result: SearchResult) -> bool:
    return any(f.kind == "stopped" and f.reason == "max-runs" for f in result.facts)
