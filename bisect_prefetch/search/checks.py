"""The checks: the answer's double check and the background controls.

Each returns what to do next, never sets it: a run to ask for (Ask), a
conclusion (Found, NotPrefetch), None (wait for the runs in flight), SEARCH_ON
(the check waits or failed; the search goes on with the answer kept) or
WITHDRAW (the answer no longer stands; the search goes on without it).

The double check of an answer whose keep-only diverged: drop-only(answer)
runs, at least MIN_DROP_ONLY times and until the chance that another, disjoint
cause as strong as this one hid from every clean run that enabled it fits the
error budget (evidence.DISJOINT_CAUSES; the search's own clean runs count). A
divergence there means another set causes drift too, or background drift, or
that the answer's one keep-only divergence was background drift: keep-only must
diverge again, then all-off runs until the posterior tells them apart. With
all_off_runs="auto", all-off runs last until background drift as strong as the
answer's would have shown with chance 1 - alpha/2 (`background_controls`).

An answer of none (`not_prefetch`), in the search for every cause (causes.py): all-off
and all-on runs until all-off is shown to diverge about as often as the other runs, or far
less often (several causes, not drift without prefetch); in a later cause's search, all-on
of its edges must stay clean `none_after` times before "no cause here" stands.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from bisect_prefetch.search.evidence import Evidence
from bisect_prefetch.search.posterior import CLEARLY_ABOVE
from bisect_prefetch.search.reduce_stage import CHECK_IN_FLIGHT
from bisect_prefetch.search.runlog import (
    AFTER_DROP_ONLY_DIVERGED,
    BACKGROUND_CONTROL,
    BACKGROUND_PARITY,
    NO_CAUSE_HERE,
    Ask,
)
from bisect_prefetch.search.stats import chance_below
from bisect_prefetch.search.verdict import Found, NotPrefetch
from bisect_prefetch.vocab import DROP_ONLY, KEEP_ONLY, STAGE_CALIBRATE, STAGE_CHECK_OFF

# Clean drop-only runs of the answer a culprit-found verdict needs at least: the answer's
# own keep-only divergence may have been background drift, and drop-only then still
# enables the real cause (background p0 = 0.02 beside a culprit at q = 0.3: accuracy
# 0.86 without, 0.94 with 2, 0.98 with 3, over 100 simulated searches each).
MIN_DROP_ONLY = 3
SEARCH_ON = "search-on"
WITHDRAW = "withdraw"

Check = Ask | Found | NotPrefetch | str | None


def confirmed(ev: Evidence) -> tuple[int, ...] | None:
    """The leading set when it holds the confidence and keep-only of it diverged.

    While all-off never diverged, a set counts whatever its rate next to the
    background: a second, disjoint cause looks like background drift to the model.
    """
    model, log = ev.model, ev.log
    top = model.top(pairs=model.pairs_likely, any_rate=not log.tally(log.all_off).divergences)
    needed = ev.settings.keep_only_divergences
    if top.probability >= ev.settings.confidence and not top.edges and ev.settings.none_settles:
        return top.edges
    if top.probability >= ev.settings.confidence and log.tally(log.keep_only(top.edges)).divergences >= needed:
        return top.edges
    return None


class Checks:
    def __init__(self, ev: Evidence, budget: Callable[[], int]) -> None:
        self.ev = ev
        self.log = ev.log
        self.budget = budget

    def double_check(self, edges: tuple[int, ...]) -> Check:
        """What the double check of this answer needs next."""
        if not edges:  # none: drift without prefetch, or no cause among a later search's edges
            return self.not_prefetch()
        log, ev = self.log, self.ev
        off_mask, drop = log.all_off, log.drop_only(edges)
        if log.tally(drop).divergences:
            if len(edges) > 2:
                # Another cause beside the set (background drift, once all-off diverges, ends
                # the reduce stage): all-off runs until drift as strong as the set's would show.
                return self._all_off_until(edges, ev.controls_for(edges), waiting=None)
            # Another cause, or background drift: all-off runs tell them apart. And the
            # answer itself may be background drift that keep-only happened to catch
            # once: it stands beside another cause only once keep-only diverged again.
            keep = log.keep_only(edges)
            if log.tally(keep).divergences < 2 and not log.unresolved(keep):
                if confirmed(ev) != edges:
                    return WITHDRAW
                return log.ask(keep, KEEP_ONLY, edges) if log.in_flight_of(keep) < CHECK_IN_FLIGHT else None
            if log.tally(off_mask).divergences:
                # Background drift: the answer stands only if it is still clearly above it.
                return Found(edges) if confirmed(ev) == edges else WITHDRAW
            return self._all_off_until(edges, self._runs_to_miss(edges, ev.alpha), waiting=SEARCH_ON)
        needed = self._drop_needed(edges)
        if needed > 0 and not log.unresolved(drop):
            return log.ask(drop, DROP_ONLY, edges) if log.in_flight_of(drop) < needed else SEARCH_ON
        return self.background_controls(edges)

    def not_prefetch(self) -> Check:
        """An answer of none: drift without prefetch (all-off diverged), or, in a later cause's
        search, no cause among its edges."""
        settings = self.ev.settings
        if settings.none_settles:
            return self._no_cause_here()
        return self._background_parity() if settings.background_parity else NotPrefetch()

    def _background_parity(self) -> Check:
        """Drift without prefetch, or several causes (the one-cause model takes them for it)?
        Under drift without prefetch every mask diverges as often as all-off. Runs until the
        chance that all-off diverges less than 1/CLEARLY_ABOVE as often as the runs that
        enabled edges is within alpha (not-prefetch, its confidence counting that chance) or
        beyond 1 - alpha (the drift is prefetch's: the answer is withdrawn, the search goes
        on and causes.py narrows it): all-off runs, or all-on runs where those are fewer."""
        log, alpha, model = self.log, self.ev.alpha, self.ev.model
        off = (model.off_divergences, model.off_exposure)
        on = (model.divergences - model.off_divergences, model.exposure - model.off_exposure)
        below = chance_below(off, on, CLEARLY_ABOVE)
        if below <= alpha or log.unresolved(log.all_off) or log.unresolved(log.all_on):
            return NotPrefetch(doubt=below)
        if below >= 1 - alpha:
            return WITHDRAW
        fewer_on = sum(on) + log.in_flight_of(log.all_on) < sum(off) + log.in_flight_of(log.all_off)
        mask, stage = (log.all_on, STAGE_CALIBRATE) if fewer_on else (log.all_off, STAGE_CHECK_OFF)
        if log.in_flight_of(mask) < CHECK_IN_FLIGHT:
            return log.ask(mask, stage, (), BACKGROUND_PARITY)
        return None

    def _no_cause_here(self) -> Check:
        """A later cause's search settles on "no cause among these edges" once all-on (every
        cause found off) stayed clean `none_after` times: a cause left there would show."""
        log, needed = self.log, self.ev.settings.none_after
        if confirmed(self.ev) != ():
            return WITHDRAW
        if log.tally(log.all_on).clean >= needed or log.unresolved(log.all_on):
            return NotPrefetch()
        if log.tally(log.all_on).clean + log.in_flight_of(log.all_on) < needed:
            return log.ask(log.all_on, STAGE_CALIBRATE, (), NO_CAUSE_HERE)
        return None

    def _all_off_until(self, edges: tuple[int, ...], needed: int, *, waiting: str | None) -> Check:
        """All-off runs after drop-only diverged, until `needed` stayed clean (or all-off is unresolved)."""
        log = self.log
        off = log.tally(log.all_off)
        if off.clean >= needed or log.unresolved(log.all_off):
            return Found(edges)
        if off.clean + log.in_flight_of(log.all_off) < needed:
            return log.ask(log.all_off, STAGE_CHECK_OFF, edges, AFTER_DROP_ONLY_DIVERGED)
        return waiting

    def background_controls(self, edges: tuple[int, ...]) -> Check:
        """all_off_runs="auto": clean all-off runs until background drift as strong as the
        answer's would have shown with chance 1 - alpha/2 (controls the drop-only runs share)."""
        log, ev = self.log, self.ev
        if ev.settings.background_controls and not log.unresolved(log.all_off):
            if log.tally(log.all_off).divergences and confirmed(ev) != edges:
                return WITHDRAW  # background drift showed: the answer must stand clearly above it
            controls = max(0, math.ceil(ev.controls_for(edges) - ev.controls(edges) - 1e-9))
            if controls > 0:
                if log.in_flight_of(log.all_off) < controls:
                    return log.ask(log.all_off, STAGE_CHECK_OFF, edges, BACKGROUND_CONTROL)
                return SEARCH_ON
        return Found(edges)

    def _drop_needed(self, edges: tuple[int, ...]) -> int:
        """Clean drop-only runs still needed before the answer's error fits the budget,
        and before drift without prefetch as strong as all-on's would have shown."""
        ev = self.ev
        spare = ev.alpha - ev.answer_error(edges)
        if spare <= 0:
            return 1
        done = self.log.tally(self.log.drop_only(edges)).clean
        for extra in range(max(0, MIN_DROP_ONLY - done), 400):
            if ev.second_cause_error(edges, extra) <= spare and ev.background_miss(edges, extra) <= ev.alpha / 2:
                return extra
        return 400

    def _runs_to_miss(self, edges: tuple[int, ...], chance: float) -> int:
        """Clean runs after which drift as strong as the answer's hides with at most this chance."""
        n, budget = 1, self.budget()
        while self.ev.miss(edges, n) > chance and n < budget:
            n += 1
        return n
