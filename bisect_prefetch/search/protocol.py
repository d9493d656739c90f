"""The bisection protocol: which mask to run next, and what the runs so far show.

Pure: no I/O, no clock, no randomness. The state is a function of the journal's
events alone, so resuming is replaying (`--confidence` and `--max-runs` may change
in between). `record` accepts any mask, not only the one asked for.

Noise model (posterior.py): one set of edges (possibly none, possibly a pair
needed together) causes drift; a run of a mask enabling that whole set diverges
with an unknown per-run chance q, and every run, whatever its mask, may also
diverge by background drift with an unknown per-run chance p0 (zero unless shown
otherwise; all-off runs and every run that did not enable a set measure it).
A set is a culprit only where its q is above p0. Runs that failed (error,
timeout) cost a run and tell nothing; a mask that fails `max_errors` times in a
row is unresolved and not asked again.

The protocol's parts, numbered (an Ask's `stage`, vocab.STAGES; the command
titles each, commands/bisect_words.py stage_title). The next run is that of the
first part whose condition holds:
1. calibrate ("checking that all-on diverges"), until a run diverges: one all-on
   run, then the search's own masks (a search mask's divergence shows the drift
   reproduces and localizes it); nothing diverged after SEARCH_BEFORE_DRIFT of
   `calibration_runs` runs: all-on again. no-drift-reproduced once every edge was
   enabled in `calibration_runs` clean runs, with the per-run chance ruled out.
2. check-off ("checking that all-off is consistent"), after the first divergence:
   all-off, `all_off_runs` times.
3. reduce ("reducing the N edges every diverged run enabled"), for three or more
   edges needed together, outside the posterior's model (reduce_stage.py); a
   1-minimal set goes to the double check of stage 4.
4. double check ("double checking the answer"), once a set reaches the
   confidence and keep-only of it diverged: drop-only and the background
   controls (checks.py). not-prefetch: drift without prefetch (none) reaches the
   confidence and all-off has diverged (the search for every cause: and all-off
   diverges about as often as the other runs; a later cause's search: "no cause
   here" once all-on stayed clean `none_after` times).
5. search ("testing MASK"): the most informative mask (planning.py); once the
   leading set holds KEEP_AT of the posterior, keep-only of it, a stage of its own
   (leading-set: "checking that the leading set is enough"; its divergence settles
   the search, its clean runs lower the set). In a later cause's search, where
   none leads as "no cause here", its all-off runs stop after `all_off_runs` +
   `none_after` clean ones: a single fluke divergence is no drift all-off shares.
Out of runs (budget.py): inconclusive with the best guess so far, or
culprit-found where only the drop-only check was cut short.

Hints (hints.py): `record(..., hint=unit)` and `Bisection(..., suspects=[...])`
reweight the prior softly and learn their reliability; each is a notice.

Slots: `ask = b.propose()` (None: nothing to run now), run it, `b.record(mask,
result)` in any order, `b.cancel(mask)` for a run that will never report. Runs
in flight are never evidence; planning counts each as the clean part of a run it
is expected to be. Serial is one slot. Segments (segments.py): each segment of a
run is a trial of its share of a run, proposed ahead (`propose(ask)`). The golden
run (`golden(steps)`) is one more all-off run: what later runs matched of it is a
background control (RunLog.golden_runs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.search import verdict as v
from bisect_prefetch.search.budget import SEARCH_BEFORE_DRIFT, budget
from bisect_prefetch.search.checks import SEARCH_ON, WITHDRAW, Checks, confirmed
from bisect_prefetch.search.evidence import Evidence, Settings
from bisect_prefetch.search.hints import HintPrior
from bisect_prefetch.search.oracle import RunResult
from bisect_prefetch.search.planning import most_informative
from bisect_prefetch.search.posterior import EdgePosterior, Hypothesis
from bisect_prefetch.search.reduce_stage import CHECK_IN_FLIGHT, ReduceStage
from bisect_prefetch.search.runlog import Ask, RunLog, mask_name, matched_steps  # noqa: F401 (mask_name: re-exported)
from bisect_prefetch.search.verdict import SearchResult
from bisect_prefetch.vocab import (
    DEFAULT_CONFIDENCE,
    STAGE_CALIBRATE,
    STAGE_CHECK_OFF,
    STAGE_LEADING,
    STAGE_SEARCH,
    Mask,
)

# The leading set's posterior from which keep-only of it runs (its divergence ends the search).
KEEP_AT = 0.7
Decision = Ask | v.Finish | None  # None: nothing to run now (wait for the runs in flight)


class Bisection:
    """Noise-aware search for the smallest edge set whose presence makes A/A runs diverge.

    Use, as the bisect command's loop does (commands/bisect_loop.py):

        b = Bisection(edge_ids, confidence=0.95, steps_per_run=30)
        b.golden(30)                      # the golden run every run is compared with
        while not b.done:
            ask = b.pending               # the next run: ask.mask, ask.stage; None: wait
            ...                           # with several slots: b.propose() marks it in
                                          # flight, and the next free slot gets another
            b.record(ask.mask, result)    # a search.oracle.RunResult, in any order
        b.result()                        # the verdict, its facts and evidence

    `b.reuse(mask, result)` counts an earlier command's run as evidence before the
    first run; `b.cancel(mask)` drops a run that will never report; segments.py plans
    a run of several masks (`propose(ask)`, `plan_trials`).
    """

    # The one-cause search (a journal written before several causes) never reads its runs
    # for a golden run that drifted (causes.CauseSearch does, search/golden_drift.py).
    golden_drifted: int | None = None

    def __init__(self, edge_ids: Sequence[str], *, confidence: float = DEFAULT_CONFIDENCE, max_runs: int | None = None,
                 calibration_runs: int | None = None, all_off_runs: int | str = "auto",
                 steps_per_run: int | None = None, max_errors: int = 3, suspects: Sequence[str] = (),
                 all_off_first: int = 1, keep_only_divergences: int = 1,
                 prior: dict[str, float] | None = None, none_settles: bool = False, none_after: int = 0,
                 background_parity: bool = False) -> None:
        """For a later cause's search (causes.py), which tells the drift the causes found left
        from background drift: all_off_first: clean all-off runs stage 2 asks for at least;
        keep_only_divergences: of keep-only of the leading set before it is confirmed; prior:
        of none, single and pair (posterior.sub_prior); none_settles: "no cause here"
        concludes (not-prefetch) without an all-off divergence, once all-on stayed clean
        none_after times; background_parity: not-prefetch once all-off diverges about as often
        as the runs that enabled edges (checks.py)."""
        if not edge_ids:
            raise BisectPrefetchError("the graph has no prefetch edges to bisect")
        if len(set(edge_ids)) != len(edge_ids):
            raise BisectPrefetchError("edge ids must be unique")
        self.settings = Settings.of(confidence=confidence, max_runs=max_runs,
                                    calibration_runs=calibration_runs, all_off_runs=all_off_runs)
        self.settings = replace(self.settings, all_off_runs=max(all_off_first, self.settings.all_off_runs),
                                keep_only_divergences=keep_only_divergences, none_settles=none_settles,
                                none_after=none_after, background_parity=background_parity)
        self.edge_ids = list(edge_ids)
        self.log = RunLog(self.edge_ids, steps_per_run=steps_per_run, max_errors=max_errors)
        self.model = EdgePosterior(len(self.edge_ids), prior)
        self._hints = HintPrior(self.edge_ids)
        self.notices: list[dict] = self._hints.set_suspects(suspects)
        self.model.set_prior_factor(*self._hints.log_factors())
        self.evidence = Evidence(self.log, self.model, self.settings)
        self.reduce = ReduceStage(self.evidence)
        self.checks = Checks(self.evidence, self._budget)  # a method: a deep copy keeps its own
        self.conclusions = v.Conclusions(self.evidence)
        self._pending: Ask | None = None
        self.search_share = 1.0  # of a run, for a trial of stage 5 (segments.py: a segment's)
        self._answer: tuple[int, ...] | None = None  # confirmed, under its double check
        self._result: SearchResult | None = None
        self._stale = True  # the next decision is worked out when first read

    # -- the loop ------------------------------------------------------------------

    @property
    def done(self) -> bool:
        self._refresh()
        return self._result is not None

    @property
    def pending(self) -> Ask | None:
        """The next ask (its stage and target), or None."""
        self._refresh()
        return self._pending

    def propose(self, ask: Ask | None = None) -> Ask | None:
        """The next run for a free slot (or `ask`: a segment planned ahead, segments.py),
        counted as in flight until recorded or cancelled. None: nothing to run now."""
        ask = ask or self.pending
        if ask is not None:
            self.log.propose(ask)
            self._stale = True
        return ask

    def plan_trials(self, share: float) -> None:
        """Stage 5's trials take `share` of a run from now on (segments.py)."""
        self.search_share, self._stale = share, self._stale or share != self.search_share

    def golden(self, steps: int) -> None:
        """The golden run later runs are compared with: `steps` long (RunLog.golden_runs)."""
        self.log.golden_steps, self.log.golden_matched, self._stale = steps, 0, True

    def cancel(self, mask: Mask) -> None:
        """A proposed run that will never report (cancelled, lost with its node)."""
        if self.log.take_in_flight(frozenset(mask)) is None:
            raise BisectPrefetchError("no run of that mask is in flight")
        self._stale = True

    def reuse(self, mask: Mask, result: RunResult, *, run: int | None = None) -> None:
        """An earlier command's run against this golden run, or (run: its number) one of an
        earlier search of this command (causes.py): evidence, not a run of this search."""
        if self.log.runs_used or self.log.in_flight or not result.completed:
            raise BisectPrefetchError("only completed runs are reused, before the search's own")
        self.log.reuse(mask := self._known(mask), result, run)
        self._observe(mask, result)
        self._stale = True
        self._refresh()

    def _observe(self, mask: Mask, result: RunResult) -> None:  # a completed run, any command's
        self.model.observe(self.log.enabled(mask), bool(result.diverged), self.log.fraction(result))
        self.reduce.update()

    def _known(self, mask: Mask) -> Mask:
        mask = frozenset(mask)
        if unknown := sorted(mask - self.log.all_on):
            raise BisectPrefetchError(f"run mask names edges not in the graph: {', '.join(unknown)}")
        return mask

    def record(self, mask: Mask, result: RunResult, *, hint: str | None = None, startup: bool = True,
               matched: int | None = None) -> None:
        """One finished run; `hint`: the unit its localization named (by default RunResult.unit);
        startup: False for a later segment of a run; matched: the steps of the run that matched
        the golden run (None: this trial is the whole run)."""
        if self.done:
            raise BisectPrefetchError("the search is finished; no more runs to record")
        mask = self._known(mask)
        self.log.startups += startup
        self.log.match_golden(matched_steps(result) if matched is None else matched)
        ask = self.log.take_in_flight(mask)
        if ask is None and self.pending is not None and self.pending.mask == mask:
            ask = self.pending
        self.log.record(mask, result, ask)
        if result.completed:
            self._observe(mask, result)
        hint = result.unit if hint is None and result.diverged else hint
        if hint is not None and not result.diverged:
            self.notices.append({"event": "hint-ignored", "unit": hint, "reason": "run-not-diverged"})
        elif hint is not None:
            self.notices.append(self._hints.add_hint(hint))
            self.model.set_prior_factor(*self._hints.log_factors())
        # Worked out at once after every result (not lazily), so the search passes
        # through the same states however often it is read: replay is exact.
        self._stale = True
        self._refresh()

    def _refresh(self) -> None:
        if self._stale:
            self._stale, self._pending = False, None
            if self._result is None:
                decision = self._next()
                if isinstance(decision, Ask):
                    self._pending = decision
                elif decision is not None:
                    self._result = self._conclude(decision)

    def _conclude(self, finish: v.Finish, *, finished: bool = True) -> SearchResult:
        return self.conclusions.conclude(finish, budget=self.budget, reducing=self.reduce.reducing,
                                         finished=finished)

    # -- deciding: the protocol's stages, in the order they take precedence -----------------
    def _next(self) -> Decision:
        log, model = self.log, self.model
        if model.divergences == 0 and self.evidence.clean_cover() >= self.settings.calibration_runs:
            return v.NoDriftReproduced()  # before the budget: the last run may settle it
        runs_budget = self.budget
        if log.used >= runs_budget:
            answer = self.reduce.reduced() if self.reduce.reducing else None
            answer = answer if answer is not None else self._answer
            if answer:  # the set is known to cause drift; only the drop-only check was cut short
                return v.Found(answer)
            return v.Inconclusive("max-runs")
        if log.started >= runs_budget:
            return None  # the last runs are in flight
        # stage 1: checking that all-on diverges (until a run diverges)
        if model.divergences == 0:
            return self._calibrate()
        # stage 2: checking that all-off is consistent
        off = log.tally(log.all_off)
        if (off.clean + log.in_flight_of(log.all_off) < self.settings.all_off_runs
                and not log.unresolved(log.all_off)):
            return log.ask(log.all_off, STAGE_CHECK_OFF)
        # stage 3: reducing the edges every diverged run enabled (three or more needed together)
        if self.reduce.reducing:
            reduced = self.reduce.next()
            return self._checked(reduced) if isinstance(reduced, tuple) else reduced
        # stage 4: double checking the answer (drop-only, background controls)
        if self._answer is None:
            self._answer = confirmed(self.evidence)
        if self._answer is not None:
            return self._checked(self._answer)
        # stage 5: testing the most informative mask (keep-only of a leading set first)
        pairs = model.pairs_likely
        top = model.top(pairs=pairs)
        if (leading := _leading_set(top, log, self.settings)) is not None:
            return leading
        return self._search(top, pairs=pairs)

    def _checked(self, edges: tuple[int, ...]) -> Decision:
        """The double check's next run or conclusion; back to the search where it waits or failed."""
        check = self.checks.double_check(edges)
        if check == WITHDRAW:
            self._answer = None  # the answer no longer stands
        if check in (WITHDRAW, SEARCH_ON):
            return self._search(self.model.top(), pairs=self.model.pairs_likely)
        return check

    def _calibrate(self) -> Decision:
        """Until a run diverges: all-on (_all_on), else the search's own masks (a divergence
        of one shows the drift reproduces and where at once; clean runs narrow the search)."""
        if (all_on := _all_on(self.log, self.settings, self.evidence, self.budget)) is not None:
            return all_on
        return self._search(self.model.top())

    def _search(self, top: Hypothesis, *, pairs: bool = False) -> Decision:
        mask = most_informative(self.model, self.log, top, pairs=pairs, share=self.search_share)
        if mask is None:
            return None if self.log.in_flight else v.Inconclusive("all-unresolved")
        return self.log.ask(mask, STAGE_SEARCH)

    # -- reading --------------------------------------------------------------------------
    def _budget(self) -> int:
        """The runs this search may use (budget.py), in shares of a full run."""
        return budget(self.evidence, self.reduce.began)

    budget = property(_budget)

    checking = property(lambda self: self._answer is not None, doc="an answer is under its double check")
    reducing = property(lambda self: self.reduce.reducing, doc="in the reduce stage (three or more edges)")

    # The run log's records, as the command reads them.
    blocks = property(lambda self: self.log.blocks, doc="the blocks of runs (Block), in order")
    in_flight = property(lambda self: self.log.in_flight, doc="proposed runs not yet recorded")
    runs_used = property(lambda self: self.log.runs_used)
    steps_used = property(lambda self: self.log.steps_used)
    startups = property(lambda self: self.log.startups, doc="training runs the trials took")

    # -- read by the tests only (the product reads pending, blocks and result) -------------
    next_mask = lambda self: None if self.pending is None else self.pending.mask  # noqa: E731
    history = property(lambda self: self.log.history, doc="(mask, RunResult) of every finished run")
    state = property(lambda self: "done" if self.pending is None else self.pending.stage,
                     doc='the protocol stage of the next mask, or "done"')
    posterior = property(lambda self: self.conclusions.top_hypotheses(),
                         doc="the five most probable culprit sets with their probabilities")

    def result(self) -> SearchResult:
        """The verdict; before the search is done, what was learned so far (inconclusive)."""
        return self._result if self.done else self._conclude(v.Inconclusive("not-finished"), finished=False)


def _all_on(log: RunLog, settings: Settings, evidence: Evidence, runs_budget: int) -> Decision:
    """Stage 1's all-on run, until a run diverges, or None: the search's own masks. All-on
    first; after SEARCH_BEFORE_DRIFT of calibration_runs runs with nothing diverged, or once
    the budget left only holds the all-on runs still needed, all-on again: no-drift-reproduced
    needs every edge enabled in calibration_runs clean runs, and all-on enables them all."""
    calibration_runs = settings.calibration_runs
    if log.unresolved(log.all_on):
        return v.Inconclusive("all-on-never-completed")
    started = log.tally(log.all_on).clean + log.in_flight_of(log.all_on)  # a failed run is retried
    late = (log.started >= SEARCH_BEFORE_DRIFT * calibration_runs
            or runs_budget - log.started <= calibration_runs - evidence.clean_cover())
    if (started == 0 or late) and log.in_flight_of(log.all_on) < CHECK_IN_FLIGHT:
        return log.ask(log.all_on, STAGE_CALIBRATE)
    return None


def _leading_set(top: Hypothesis, log: RunLog, settings: Settings) -> Decision:
    """Stage 5's keep-only of the leading set while it holds KEEP_AT of the posterior (its
    divergence settles the search, its clean runs lower the set), or None: search on."""
    keep = log.keep_only(top.edges)
    # In a later cause's search none leads as "no cause here": all-off shows it only
    # against drift all-off would share, so it gets a few runs, not one until it diverges.
    leading = (top.kind != "none" or not settings.none_settles
               or log.tally(keep).clean < settings.all_off_runs + settings.none_after)
    if (leading and top.probability >= KEEP_AT and log.tally(keep).divergences < settings.keep_only_divergences
            and log.in_flight_of(keep) < CHECK_IN_FLIGHT):
        if not log.unresolved(keep):
            return log.ask(keep, STAGE_LEADING, top.edges)
        if top.probability >= settings.confidence:
            return v.Inconclusive("keep-only-never-completed")
    return None
