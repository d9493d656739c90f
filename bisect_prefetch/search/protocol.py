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

Steps, each a block of runs in `events` (structured: the command words them):
1. calibrate: one all-on run, then the search's own masks until a run diverges
   (a search mask's divergence shows the drift reproduces and localizes it; more
   all-on runs would only measure q). Nothing diverged after half of
   `calibration_runs` runs: all-on again. no-drift-reproduced once every edge
   was enabled in `calibration_runs` clean runs, with the per-run chance that is
   ruled out (about 3/n).
2. check-off, after the first divergence: all-off, `all_off_runs` times; later
   all-off runs come whenever they are the most informative question
   (background drift).
3. search: the mask whose next run tells most (expected information) about
   which set causes drift, among runs of consecutive surviving edges in graph
   order (a phase, a range of layers), their complements, and the k most
   probable edges (after a hint). Near-best masks that read better or double as
   the final check win: forward-off and backward-off, and drop-only of the
   leading set. Once the leading set holds KEEP_AT of the posterior, keep-only of
   it runs (its divergence settles the search, its clean runs lower the set).
4. double check, once a set reaches the confidence: keep-only(set) must have
   diverged; then drop-only(set) runs, at least MIN_DROP_ONLY times and until
   the chance that another, disjoint cause as strong as this one hid from every
   clean run that enabled it fits the error budget (prior DISJOINT_CAUSES; the
   search's own clean runs count). A divergence there means another set causes
   drift too, or background drift, or that the set's one keep-only divergence
   was background drift: keep-only must diverge again, then all-off runs until
   the posterior tells them apart. With all_off_runs="auto" (the default),
   all-off runs last until background drift as strong as the answer's would
   have shown (see _background_controls_needed). not-prefetch: drift without
   prefetch (none) reaches the confidence and all-off has diverged.
5. reduce, for three or more edges needed together (outside the posterior's
   model): once "a set of three or more inside the core" (the edges every diverged
   run enabled) explains the runs better than the model does, and while all-off
   never diverged, noise-aware ddmin (reduce.py) reduces the core to a 1-minimal
   set: keep-only(core) diverges, then each chunk of the core is dropped until it
   diverges (the core shrinks) or stays clean often enough; at the last level each
   edge's removal stays clean until the chance that it was not needed fits the
   member's share of the error budget (MEMBER_SHARE). Then the double check of
   step 4 (drop-only, background controls). This works for a set of any size, so a
   switch made in error still ends right, only later.
Out of runs (`max_runs`; by default scaled with the graph and the estimated q,
see `budget`): inconclusive, with the best hypothesis so far (STOPPED fact).

Hints (hints.py): `record(mask, result, hint=unit)` takes the localized unit of a
diverged run (by default `result.unit`), `Bisection(..., suspects=[edge ids])` the audit's suspects; both
reweight the prior softly and learn their own reliability. The verdict and its
confidence stay those of the runs. Each hint, and each one ignored, becomes a
structured event in `notices` (see hints.py for the shapes).

Parallel runs (slots). The driver keeps every slot busy:
    ask = b.propose()        # None: nothing to run now (done, or wait for a result)
    ... start ask.mask; journal {"event": "proposed", "mask": [...]}
    b.record(mask, result, hint=...)  # any order; journal {"event": "completed", ...}
    b.cancel(mask)           # a proposed run that will never report (lost, cancelled)
A proposal weighs what finished and what is still in flight: runs in flight never
count as evidence; for choosing the next mask each counts as the clean part of a
run it is expected to be (its predicted chance to stay clean), so slots ask
different questions. Replaying the same sequence of proposed / completed /
cancelled events gives the same decisions; on resume with any slot count, replay
the journal, then cancel() the proposals that will not report. The serial loop
(`next_mask()` then `record()`) is the same with one slot.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import combinations

import numpy as np

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.search.hints import HintPrior
from bisect_prefetch.search.oracle import RunResult
from bisect_prefetch.search.posterior import EdgePosterior, Hypothesis
from bisect_prefetch.search.reduce import (
    COARSE_MISS,
    Drop,
    levels,
    next_test,
    runs_to_miss,
    set_log_odds,
    subset_odds,
)
from bisect_prefetch.search.reduce import miss_chance as set_miss_chance
from bisect_prefetch.search.stats import (
    clopper_pearson,
    hazard_estimate,
    upper_bound_none_seen,
    z_channel_capacity,
)
from bisect_prefetch.select import describe
from bisect_prefetch.vocab import Mask

VERDICTS = ("culprit-found", "no-drift-reproduced", "not-prefetch", "inconclusive")
# A mask that reads better (forward-off, backward-off) or doubles as the final
# check (drop-only of the leading set) wins with this share of the best information;
# keep-only of the leading set, whose divergence ends the search, with KEEP_SHARE.
NEAR_BEST = 0.97
KEEP_SHARE = 0.95
# Prior chance that another set, disjoint from the answer, also causes drift: it is
# outside the posterior's one-cause model, so only drop-only(answer) runs rule it out.
DISJOINT_CAUSES = 0.1
# The leading set's posterior from which keep-only of it runs (its divergence ends the search).
KEEP_AT = 0.7
# Default budget: this many times the runs an ideal search needs at the estimated q,
# on top of the calibration (see Bisection.budget).
BUDGET_FACTOR = 3.0
# Clean drop-only runs of the answer a culprit-found verdict needs at least: the answer's
# own keep-only divergence may have been background drift, and drop-only then still
# enables the real cause (background p0 = 0.02 beside a culprit at q = 0.3: accuracy
# 0.86 without, 0.94 with 2, 0.98 with 3, over 100 simulated searches each).
MIN_DROP_ONLY = 3
# Runs of one check mask in flight at once, at most (calibration, keep-only).
CHECK_IN_FLIGHT = 2
# Until a run diverges, the search's masks run after the first all-on, for this share
# of calibration_runs runs; all-on again after that (see Bisection._before_drift).
SEARCH_BEFORE_DRIFT = 0.5
# A set of three or more (reduce step): its members' removals share this part of the
# error budget; the second-cause check (drop-only) the rest.
MEMBER_SHARE = 0.8


def _rate(divergences: float, clean: float) -> float:
    """Posterior mean per-run chance of drift from these runs, under a Beta(1, 3) prior."""
    return (1 + divergences) / (4 + divergences + clean)


STEPS = ("calibrate", "check-off", "search", "reduce", "keep-only", "drop-only", "extra")
# Why a check-off step runs again late in the search (Ask.context, Block.context).
AFTER_DROP_ONLY_DIVERGED = "drop-only-diverged"
BACKGROUND_CONTROL = "background-control"  # all_off_runs="auto": ruling out background drift


@dataclass
class Block:
    """Consecutive runs of one mask in one protocol step: one narrated line, one evidence row."""

    step: str  # one of STEPS
    mask: str  # short name of the mask
    edges: int  # enabled edges
    first_run: int  # 1-based number of the block's first run in the whole search
    enabled: Mask = frozenset()
    target: tuple[str, ...] = ()  # keep-only, drop-only: the answer set being checked
    context: str | None = None  # AFTER_DROP_ONLY_DIVERGED or None
    runs: int = 0
    divergences: int = 0
    errors: int = 0
    first_diff_steps: list[int] = field(default_factory=list)
    diverged_at: int | None = None  # run (1-based, within the block) of the first divergence

    @property
    def verdict(self) -> str:
        if self.divergences:
            return "diverged"
        return "clean" if self.runs > self.errors else "unresolved"

    def to_dict(self) -> dict:
        return {
            "step": self.step,
            "mask": self.mask,
            "edges": self.edges,
            "runs": self.runs,
            "divergences": self.divergences,
            "errors": self.errors,
            "first_diff_steps": list(self.first_diff_steps),
            "verdict": self.verdict,
        }


@dataclass
class _Tally:
    clean: int = 0
    divergences: int = 0
    errors: int = 0
    failing: int = 0  # failed runs since the last completed one


@dataclass(frozen=True)
class Ask:
    """The next mask and the protocol step it belongs to."""

    mask: Mask
    step: str  # one of STEPS
    target: tuple[str, ...] = ()  # keep-only, drop-only: the answer set being checked
    context: str | None = None  # AFTER_DROP_ONLY_DIVERGED or None


# Fact kinds: the checked statements behind a verdict.
BACKGROUND = "background"  # runs, divergences of all-off; chance: estimated p0
NO_DRIFT = "no-drift"  # runs: clean runs enabling each edge (the least); clean: (all-on's,); chance: ruled out
ALL_OFF_DIVERGED = "all-off-diverged"  # runs, divergences of all-off
STOPPED = "stopped"  # reason (STOP_REASONS), limit; edges, chance: the best guess
KEEP_ONLY_DIVERGED = "keep-only-diverged"  # edges; run, step: the divergence
# edges; clean: per edge, clean runs with the rest of the set but without it; chance: the
# chance that some edge was not needed after all (a set from the reduce step; None for a pair)
EACH_NEEDED = "each-needed"
DROP_ONLY_DIVERGES = "drop-only-diverges"  # edges; runs: clean all-off runs
DROP_ONLY_CONSISTENT = "drop-only-consistent"  # edges; runs: clean drop-only runs
DROP_ONLY_FAILED = "drop-only-failed"  # edges; errors
DROP_ONLY_NOT_RUN = "drop-only-not-run"  # edges
# runs: clean control runs (all-off, drop-only of the double check); chance: the per-run
# chance of drift without prefetch they rule out; strength: the answer's per-run chance
BACKGROUND_RULED_OUT = "background-ruled-out"
STOP_REASONS = (
    "max-runs", "all-on-never-completed", "all-unresolved", "keep-only-never-completed",
    "not-finished",
)


@dataclass(frozen=True)
class Fact:
    """One checked statement behind a verdict, as numbers; the command words it."""

    kind: str
    edges: tuple[str, ...] = ()
    runs: int = 0
    divergences: int = 0
    errors: int = 0
    run: int | None = None
    step: int | None = None
    chance: float | None = None
    clean: tuple[int, ...] = ()
    reason: str | None = None
    limit: int | None = None
    strength: float | None = None


@dataclass(frozen=True)
class SearchResult:
    verdict: str  # one of VERDICTS
    minimal_set: list[str]
    confidence: float
    runs_used: int
    steps_used: int
    evidence: list[dict]  # one row per block of runs (Block.to_dict)
    calibration: dict  # per_run_chance, interval, hazard_per_step, runs, divergences, ...
    facts: list[Fact]  # the checked statements behind the verdict
    drop_only_diverges: bool | None = None  # None when drop-only was not run
    top_hypotheses: list[dict] = field(default_factory=list)
    finished: bool = True


@lru_cache(maxsize=8)
def _triples(m: int) -> np.ndarray:
    """Every set of three of m items, as three index columns."""
    return np.array(list(combinations(range(m), 3))).reshape(-1, 3).T


def mask_name(mask: Mask, edge_ids: Sequence[str]) -> str:
    """A preset name where one fits, else the enabled (or disabled) run of edges."""
    name = describe(mask, edge_ids)
    if not name.endswith(" on"):
        return name
    on = [i for i, e in enumerate(edge_ids) if e in mask]
    off = [i for i, e in enumerate(edge_ids) if e not in mask]
    for word, idx in (("keep-only", on), ("drop-only", off)):
        if idx[-1] - idx[0] + 1 == len(idx):
            return f"{word} {edge_ids[idx[0]]} .. {edge_ids[idx[-1]]} ({len(idx)} edges)"
    return name


class Bisection:
    """Noise-aware search for the smallest edge set whose presence makes A/A runs diverge.

    Use: `mask = b.next_mask()` (None when done), run it, `b.record(mask, result)`,
    repeat; then `b.result()`. `b.pending` says which step the next mask is for.
    """

    def __init__(
        self,
        edge_ids: Sequence[str],
        *,
        confidence: float = 0.95,
        max_runs: int | None = None,
        calibration_runs: int | None = None,
        all_off_runs: int | str = "auto",
        steps_per_run: int | None = None,
        max_errors: int = 3,
        suspects: Sequence[str] = (),
    ) -> None:
        if not edge_ids:
            raise BisectPrefetchError("the graph has no prefetch edges to bisect")
        if len(set(edge_ids)) != len(edge_ids):
            raise BisectPrefetchError("edge ids must be unique")
        if not 0.0 < confidence < 1.0:
            raise BisectPrefetchError(f"--confidence must be between 0 and 1, got {confidence}")
        if max_runs is not None and max_runs < 1:
            raise BisectPrefetchError(f"--max-runs must be at least 1, got {max_runs}")
        self.edge_ids = list(edge_ids)
        self._index = {e: i for i, e in enumerate(self.edge_ids)}
        self.confidence = confidence
        self.alpha = 1.0 - confidence
        self.max_runs = max_runs
        # Default: a quarter of the budget, 50 without one (rules out chances above 0.06).
        self.calibration_runs = calibration_runs or (min(max_runs, max(10, max_runs // 4)) if max_runs else 50)
        if all_off_runs != "auto" and not (isinstance(all_off_runs, int) and all_off_runs >= 1):
            raise BisectPrefetchError(f"all_off_runs must be a count >= 1 or auto, got {all_off_runs!r}")
        # auto (the default): one all-off run after the first divergence, and before a
        # culprit-found verdict enough all-off and drop-only runs to rule out background
        # drift as strong as the answer's (see _background_controls_needed). A count: that
        # many all-off runs only: cheaper, but background drift as strong as a culprit
        # then passes for one in about one search in seven, and the verdict's
        # confidence, which counts the chance that it hid from the controls, is low.
        self.background_controls = all_off_runs == "auto"
        self.all_off_runs = 1 if all_off_runs == "auto" else all_off_runs
        self.steps_per_run = steps_per_run
        self.max_errors = max_errors

        self.model = EdgePosterior(len(self.edge_ids))
        self._hints = HintPrior(self.edge_ids)
        self.notices: list[dict] = self._hints.set_suspects(suspects)
        self.model.set_prior_factor(*self._hints.log_factors())
        self.in_flight: list[Ask] = []  # proposed runs not yet recorded, oldest first
        self.history: list[tuple[Mask, RunResult]] = []
        self.events: list[Block] = []
        self.runs_used = 0
        self.steps_used = 0
        self._pending: Ask | None = None
        self._answer: tuple[int, ...] | None = None  # confirmed, under its double check
        self._stale = True  # the next ask is worked out when first read
        self._tally: dict[Mask, _Tally] = {}
        self._all_on = frozenset(self.edge_ids)
        self._all_off: Mask = frozenset()
        self._phases = {
            phase: np.array([e.startswith(phase + ":") for e in self.edge_ids])
            for phase in ("fwd", "bwd")
        }
        self._result: SearchResult | None = None
        # The reduce step: the edges every diverged run enabled, every clean run's mask
        # (with the share of a run it covered), and whether a set of three or more leads.
        self._core = np.ones(len(self.edge_ids), dtype=bool)
        self._clean: list[tuple[np.ndarray, float]] = []
        self._diverged: list[np.ndarray] = []
        self._reducing = False
        self._reduce_from: tuple[int, int] | None = None  # (runs, core size) when it first began
        self._decide()

    # -- the loop ------------------------------------------------------------------
    def next_mask(self) -> Mask | None:
        return None if self.pending is None else self.pending.mask

    @property
    def done(self) -> bool:
        self._refresh()
        return self._result is not None

    @property
    def pending(self) -> Ask | None:
        """The next ask (its step and target), or None."""
        self._refresh()
        return self._pending

    def _refresh(self) -> None:
        if self._stale:
            self._stale = False
            self._work_out()

    def propose(self) -> Ask | None:
        """The next run for a free slot, counted as in flight until recorded or cancelled.

        None: nothing to run now (the search is done, or it waits for a result).
        """
        ask = self.pending
        if ask is not None:
            self.in_flight.append(ask)
            self._decide()
        return ask

    def cancel(self, mask: Mask) -> None:
        """A proposed run that will never report (cancelled, lost with its node)."""
        ask = self._take_in_flight(frozenset(mask))
        if ask is None:
            raise BisectPrefetchError("no run of that mask is in flight")
        self._decide()

    def _take_in_flight(self, mask: Mask) -> Ask | None:
        for i, ask in enumerate(self.in_flight):
            if ask.mask == mask:
                return self.in_flight.pop(i)
        return None

    def record(self, mask: Mask, result: RunResult, *, hint: str | None = None) -> None:
        """One finished run; `hint`: the unit its localization named (first divergent gradient),
        by default the run's own (RunResult.unit)."""
        if self.done:
            raise BisectPrefetchError("the search is finished; no more runs to record")
        mask = frozenset(mask)
        unknown = sorted(mask - self._all_on)
        if unknown:
            raise BisectPrefetchError(f"run mask names edges not in the graph: {', '.join(unknown)}")
        ask = self._take_in_flight(mask)
        if ask is None and self.pending is not None and self.pending.mask == mask:
            ask = self.pending
        self.history.append((mask, result))
        self.runs_used += 1
        self.steps_used += result.steps
        block = self._block_for(mask, ask)
        block.runs += 1
        tally = self._tally.setdefault(mask, _Tally())
        tally.failing = 0 if result.completed else tally.failing + 1
        if not result.completed:
            tally.errors += 1
            block.errors += 1
        elif result.diverged:
            tally.divergences += 1
            block.divergences += 1
            block.first_diff_steps.append(result.first_diff_step or result.steps)
            if block.diverged_at is None:
                block.diverged_at = block.runs
        else:
            tally.clean += 1
        if result.completed:
            enabled = self._enabled(mask)
            self.model.observe(enabled, bool(result.diverged), self._fraction(result))
            if result.diverged:
                self._diverged.append(enabled)
                # drop-only of a set diverging shows a second cause (or background
                # drift), not where the set lies.
                if not (ask and ask.step == "drop-only"):
                    self._core &= enabled
            else:
                self._clean.append((enabled, self._fraction(result)))
            self._reducing = self._set_leads()
            if self._reducing and self._reduce_from is None:
                self._reduce_from = (self.runs_used, int(self._core.sum()))
        if hint is None and result.diverged:
            hint = result.unit
        if hint is not None:
            self._take_hint(hint, bool(result.diverged))
        # Worked out at once after every result (not lazily), so the search passes
        # through the same states however often it is read: replay is exact.
        self._decide()
        self._refresh()

    def _take_hint(self, unit: str, diverged: bool) -> None:
        if not diverged:
            self.notices.append({"event": "hint-ignored", "unit": unit, "reason": "run-not-diverged"})
            return
        self.notices.append(self._hints.add_hint(unit))
        self.model.set_prior_factor(*self._hints.log_factors())

    def _block_for(self, mask: Mask, ask: Ask | None) -> Block:
        step = ask.step if ask else "extra"
        last = self.events[-1] if self.events else None
        if last is not None and last.step == step and last.enabled == mask:
            return last
        block = Block(step, mask_name(mask, self.edge_ids), len(mask), self.runs_used, enabled=mask,
                      target=ask.target if ask else (), context=ask.context if ask else None)
        self.events.append(block)
        return block

    def _fraction(self, result: RunResult) -> float:
        """How much of a full run a clean run covered (1 when the run length is unknown)."""
        if result.diverged or not self.steps_per_run:
            return 1.0
        return min(1.0, result.steps / self.steps_per_run)

    # -- masks ------------------------------------------------------------------------
    def _enabled(self, mask: Mask) -> np.ndarray:
        enabled = np.zeros(len(self.edge_ids), dtype=bool)
        enabled[[self._index[e] for e in mask]] = True
        return enabled

    def _keep_only(self, edges: Sequence[int]) -> Mask:
        return frozenset(self.edge_ids[i] for i in edges)

    def _drop_only(self, edges: Sequence[int]) -> Mask:
        return self._all_on - self._keep_only(edges)

    def _ids(self, edges: Sequence[int]) -> tuple[str, ...]:
        return tuple(self.edge_ids[i] for i in sorted(edges))

    def _tally_of(self, mask: Mask) -> _Tally:
        return self._tally.get(mask, _Tally())

    def _unresolved(self, mask: Mask) -> bool:
        return self._tally_of(mask).failing >= self.max_errors

    def _ask(self, mask: Mask, step: str, target: Sequence[int] = (),
             context: str | None = None) -> None:
        self._pending = Ask(mask, step, self._ids(target), context)

    def _in_flight_of(self, mask: Mask) -> int:
        return sum(1 for ask in self.in_flight if ask.mask == mask)

    # -- the budget ---------------------------------------------------------------------
    @property
    def budget(self) -> int:
        """max_runs, or by default BUDGET_FACTOR times the runs an ideal search needs.

        An ideal search gains at most the capacity of the one-sided channel per run
        (a Z-channel at the estimated q) and needs about log2(sets) + log2(1/alpha)
        bits; the calibration comes on top, and the background controls at that q
        (all_off_runs="auto"). q is the leading set's posterior mean,
        so the budget follows what the runs show, but never below all-on's rate
        (Beta(1, 3) prior): drift that no single set or pair explains (three edges
        needed together) leaves every set's q low, and the budget must not grow
        with that. Once the reduce step began, at least what it needs (_reduce_budget).
        """
        if self.max_runs is not None:
            return self.max_runs
        if self._reduce_from is not None:
            return max(self._search_budget(), self._reduce_budget())
        return self._search_budget()

    def _search_budget(self) -> int:
        if self.model.divergences == 0:
            return math.ceil((1 + SEARCH_BEFORE_DRIFT) * self.calibration_runs) + 1
        n = len(self.edge_ids)
        q = min(max(self.model.culprit_chance(self.model.top().edges), self._all_on_rate(), 0.02), 0.99)
        capacity = z_channel_capacity(q)
        bits = math.log2(n + n * (n - 1) / 2) + math.log2(1 / self.alpha)
        controls = self._controls_at(q) if self.background_controls else 0
        return self.calibration_runs + math.ceil(BUDGET_FACTOR * bits / capacity) + controls

    def _reduce_budget(self) -> int:
        """The runs before the reduce step began, and BUDGET_FACTOR times what ddmin needs
        at the core's rate: every coarse level twice, and a set of three at the last.

        The core's rate is the lower of all-on's and that of the runs that enabled the
        whole core (Beta(1, 3) prior each): one diverged all-on run says 0.4 whatever q is,
        and a budget cut to that runs out in the middle of a reduction at q = 0.1.
        """
        runs, core = self._reduce_from
        core_rate = _rate(*self._counts(self._core_edges()))
        q = min(max(min(self._all_on_rate(), core_rate), 0.02), 0.99)
        per_run = -math.log(1 - q)
        coarse = math.log(1 / COARSE_MISS) / per_run
        final = math.log(1 / (self.alpha * MEMBER_SHARE / 3 / subset_odds(len(self.edge_ids), 3))) / per_run
        needed = 2 * (len(levels(core)) - 1) * coarse + 3 * final
        controls = self._controls_at(q) if self.background_controls else 0
        return runs + math.ceil(BUDGET_FACTOR * needed) + controls

    # -- deciding ----------------------------------------------------------------------
    def _decide(self) -> None:
        self._stale = True

    def _work_out(self) -> None:
        self._pending = None
        if self._result is not None:
            return
        if self.model.divergences == 0 and self._clean_cover() >= self.calibration_runs:
            return self._finish_no_drift()  # before the budget: the last run may settle it
        budget = self.budget
        if self.runs_used >= budget:
            answer = self._answer
            if self._reducing and self._next_drop(self._core_edges()) is None:
                answer = self._core_edges()  # reduced: 1-minimal, its keep-only diverged
            if answer is not None and answer != ():
                # The set is known to cause drift; only the drop-only check was cut short.
                return self._finish_found(answer)
            return self._finish_inconclusive("max-runs")
        if self.runs_used + len(self.in_flight) >= budget:
            return  # the last runs are in flight
        if self.model.divergences == 0:
            return self._before_drift()
        off = self._tally_of(self._all_off)
        if (off.clean + self._in_flight_of(self._all_off) < self.all_off_runs
                and not self._unresolved(self._all_off)):
            return self._ask(self._all_off, "check-off")
        if self._reducing:
            return self._reduce()
        if self._answer is None:
            self._answer = self._confirmed()
        if self._answer is not None:
            return self._double_check(self._answer)
        pairs = self.model.pairs_likely
        top = self.model.top(pairs=pairs)
        keep = self._keep_only(top.edges)
        if (top.probability >= KEEP_AT and not self._tally_of(keep).divergences
                and self._in_flight_of(keep) < CHECK_IN_FLIGHT):
            if not self._unresolved(keep):
                return self._ask(keep, "keep-only", top.edges)
            if top.probability >= self.confidence:
                return self._finish_inconclusive("keep-only-never-completed")
        self._search(top, pairs=pairs)

    def _before_drift(self) -> None:
        """Until a run diverges: all-on first, then the search's own masks.

        A search mask's divergence shows the drift reproduces and where it comes
        from at once, and its clean runs narrow the search, where more all-on runs
        would only measure q. After SEARCH_BEFORE_DRIFT of calibration_runs runs
        with nothing diverged, or once the budget left only holds the all-on runs
        still needed, all-on again: no-drift-reproduced needs every edge enabled in
        calibration_runs clean runs, and all-on enables them all.
        """
        if self._unresolved(self._all_on):
            return self._finish_inconclusive("all-on-never-completed")
        on = self._tally_of(self._all_on)
        started = on.clean + self._in_flight_of(self._all_on)  # a failed run is retried
        started_runs = self.runs_used + len(self.in_flight)
        late = (started_runs >= SEARCH_BEFORE_DRIFT * self.calibration_runs
                or self.budget - started_runs <= self.calibration_runs - self._clean_cover())
        if (started == 0 or late) and self._in_flight_of(self._all_on) < CHECK_IN_FLIGHT:
            return self._ask(self._all_on, "calibrate")
        self._search(self.model.top())

    def _clean_cover(self) -> int:
        """Clean runs that enabled every edge, counted for the edge enabled least."""
        return int(self.model.single_exposure.min() + 1e-9)

    def _confirmed(self) -> tuple[int, ...] | None:
        """The leading set when it holds the confidence and keep-only of it diverged.

        While all-off never diverged, a set counts whatever its rate next to the
        background: a second, disjoint cause looks like background drift to the model.
        """
        pairs = self.model.pairs_likely
        top = self.model.top(pairs=pairs, any_rate=not self._tally_of(self._all_off).divergences)
        if top.probability >= self.confidence and self._tally_of(self._keep_only(top.edges)).divergences:
            return top.edges
        return None

    def _search(self, top: Hypothesis, *, pairs: bool = False) -> None:
        mask = self._most_informative(top, pairs=pairs)
        if mask is None:
            if self.in_flight:
                return
            return self._finish_inconclusive("all-unresolved")
        self._ask(mask, "search")

    def _search_on(self) -> None:
        """Back to the search, from the posterior's leading set (a check is waiting or failed)."""
        self._search(self.model.top(), pairs=self.model.pairs_likely)

    def _planning_model(self) -> EdgePosterior:
        """The posterior with each run in flight counted as the clean part of a run it is expected to be."""
        if not self.in_flight:
            return self.model
        return self.model.with_pending([self._enabled(ask.mask) for ask in self.in_flight])

    def _most_informative(self, top: Hypothesis, *, pairs: bool) -> Mask | None:
        """The best mask of the posterior's family, or a near-best one (see NEAR_BEST)."""
        model = self._planning_model()
        ranked = [
            (bits, self._keep_only(np.flatnonzero(enabled)))
            for bits, enabled in model.ranked_tests(limit=16, pairs=pairs)
        ]
        ranked = [(bits, mask) for bits, mask in ranked if not self._unresolved(mask)]
        if not ranked:
            return None
        best_bits, best = ranked[0]

        def bits_of(mask: Mask) -> float:
            return model.information(self._enabled(mask), pairs=pairs)

        alternatives = [self._all_off]
        if top.edges:
            keep = self._keep_only(top.edges)
            if (bits_of(keep) >= KEEP_SHARE * best_bits and not self._unresolved(keep)
                    and not self._tally_of(keep).divergences):
                return keep
            alternatives.append(self._drop_only(top.edges))
        alive = model.alive
        for phase in ("fwd", "bwd"):
            split = alive & self._phases[phase]
            if split.any() and split.sum() < alive.sum():
                alternatives.append(self._keep_only(np.flatnonzero(split)))
        threshold = NEAR_BEST * best_bits
        for mask in alternatives:
            bits = bits_of(mask)
            if mask == self._all_off:
                # all-off only when it is the best question outright (background drift).
                if bits > best_bits and not self._unresolved(mask):
                    best_bits, best, threshold = bits, mask, NEAR_BEST * bits
                continue
            if bits >= threshold and not self._unresolved(mask):
                threshold, best = bits, mask
        return best

    # -- reduce: three or more edges needed together -----------------------------------------
    def _set_leads(self) -> bool:
        """Whether the reduce step runs: once a set of three or more edges inside the core
        explains the runs better than the posterior's model, while all-off never diverged
        (background drift breaks the core: a diverged run need not enable the set)."""
        if (not self.model.divergences or self._tally_of(self._all_off).divergences
                or self._core.sum() < 3):
            return False  # a core of one or two edges: the posterior's model takes over again
        if self._reducing:
            return True
        core = self._core_edges()
        divergences, clean = self._counts(core)
        evidence = self.model.log_evidence()
        if set_log_odds(len(core), len(self.edge_ids), divergences, clean, evidence) <= 0:
            return False  # not even the bound: the core itself fits no better than that
        return set_log_odds(len(core), len(self.edge_ids), divergences, self._triple_clean(core),
                            evidence) > 0

    def _triple_clean(self, core: tuple[int, ...]) -> np.ndarray:
        """Clean runs (as shares of a run) that enabled each set of three edges of the core."""
        matrix, fractions = self._clean_matrix()
        inside = matrix[:, list(core)].astype(float)
        m = len(core)
        pairs = (inside[:, :, None] * inside[:, None, :]).reshape(len(inside), m * m)
        cube = ((inside * fractions[:, None]).T @ pairs).reshape(m, m, m)
        a, b, c = _triples(m)
        return cube[a, b, c]

    def _core_edges(self) -> tuple[int, ...]:
        return tuple(int(i) for i in np.flatnonzero(self._core))

    def _reduce(self) -> None:
        """The next run of the reduce step (see reduce.py), or the double check once the core is 1-minimal."""
        core = self._core_edges()
        keep = self._keep_only(core)
        if not self._tally_of(keep).divergences:
            # The set itself must diverge: the verdict rests on that run.
            if self._unresolved(keep):
                return self._finish_inconclusive("keep-only-never-completed")
            if self._in_flight_of(keep) < CHECK_IN_FLIGHT:
                return self._ask(keep, "reduce", core)
            return
        test = self._next_drop(core)
        if test is None:
            return self._double_check(core)
        if test.chunk is None:
            return  # the runs in flight finish the level
        mask = self._keep_only([i for i in core if i not in test.chunk])
        if self._unresolved(mask):
            return self._finish_inconclusive("all-unresolved")
        self._ask(mask, "reduce", core)

    def _next_drop(self, core: tuple[int, ...]) -> Drop | None:
        """The chunk of the core to drop next (reduce.next_test); None: the core is 1-minimal."""
        if not self._tally_of(self._keep_only(core)).divergences:
            return Drop(None, 0, 0)  # keep-only(core) must diverge first
        divergences, clean = self._counts(core)
        coarse = runs_to_miss(divergences, clean, COARSE_MISS)
        final = runs_to_miss(divergences, clean, self._member_alpha(core))
        needed_at = {g: final if g == len(core) else coarse for g in levels(len(core))}
        matrix, fractions = self._clean_matrix()

        def clean_without(chunk: tuple[int, ...]) -> float:
            return self._clean_without(core, chunk, matrix, fractions)

        def in_flight(chunk: tuple[int, ...]) -> int:
            return self._in_flight_of(self._keep_only([i for i in core if i not in chunk]))

        return next_test(core, clean_without, in_flight, needed_at)

    def _clean_matrix(self) -> tuple[np.ndarray, np.ndarray]:
        """Every clean run's enabled edges (a row each) and the share of a run it covered."""
        if not self._clean:
            return np.zeros((0, len(self.edge_ids)), dtype=bool), np.zeros(0)
        return np.array([e for e, _ in self._clean]), np.array([f for _, f in self._clean])

    @staticmethod
    def _clean_without(edges: Sequence[int], left_out: Sequence[int], matrix: np.ndarray,
                       fractions: np.ndarray) -> float:
        """Clean runs (as shares of a run) that enabled the set but none of `left_out`."""
        rest = [i for i in edges if i not in left_out]
        hits = matrix[:, rest].all(axis=1) & ~matrix[:, list(left_out)].any(axis=1)
        return float(fractions[hits].sum())

    def _counts(self, edges: Sequence[int]) -> tuple[float, float]:
        """(divergences, clean runs) of the runs that enabled every edge of the set."""
        edges = tuple(edges)
        if len(edges) <= 2:
            return self.model.counts(edges)
        divergences = sum(1 for enabled in self._diverged if enabled[list(edges)].all())
        matrix, fractions = self._clean_matrix()
        return float(divergences), float(fractions[matrix[:, list(edges)].all(axis=1)].sum())

    def _miss(self, edges: Sequence[int], runs):
        """Chance that `runs` clean runs all miss drift as strong as the set's (runs may be an array)."""
        edges = tuple(edges)
        if len(edges) <= 2:
            return self.model.miss_chance(edges, runs)
        return set_miss_chance(*self._counts(edges), runs)

    def _members_error(self, edges: Sequence[int]) -> float:
        """A set from the reduce step: the chance that some member was not needed after all.

        Per member: the runs without it that stayed clean all missed drift by chance,
        against the prior odds of the set without it. The odds matter: the core keeps
        whichever edges every diverged run happened to enable, so among many edges
        some unneeded one may have had a clean run of luck.
        """
        matrix, fractions = self._clean_matrix()
        odds = subset_odds(len(self.edge_ids), len(edges))
        return float(sum(min(1.0, odds * self._miss(edges, self._clean_without(edges, (i,), matrix, fractions)))
                         for i in edges))

    def _member_alpha(self, edges: Sequence[int]) -> float:
        """The chance of each member's removal missing drift that fits its share of the error budget."""
        return self.alpha * MEMBER_SHARE / len(edges) / subset_odds(len(self.edge_ids), len(edges))

    # -- double check -----------------------------------------------------------------------
    def _double_check(self, edges: tuple[int, ...]) -> None:
        if not edges:
            # Drift without prefetch explains the runs and all-off diverged.
            return self._finish_not_prefetch()
        drop = self._drop_only(edges)
        tally = self._tally_of(drop)
        if tally.divergences and len(edges) > 2:
            # Another cause beside the set (background drift, once all-off diverges, ends
            # the reduce step): all-off runs until drift as strong as the set's would show.
            needed = self._controls_for(edges)
            off = self._tally_of(self._all_off)
            if off.clean >= needed or self._unresolved(self._all_off):
                return self._finish_found(edges)
            if off.clean + self._in_flight_of(self._all_off) < needed:
                return self._ask(self._all_off, "check-off", edges, AFTER_DROP_ONLY_DIVERGED)
            return
        if tally.divergences:
            # Another cause, or background drift: all-off runs tell them apart. And the
            # answer itself may be background drift that keep-only happened to catch
            # once: it stands beside another cause only once keep-only diverged again.
            keep = self._keep_only(edges)
            if self._tally_of(keep).divergences < 2 and not self._unresolved(keep):
                if self._confirmed() != edges:
                    self._answer = None
                    return self._search_on()
                if self._in_flight_of(keep) < CHECK_IN_FLIGHT:
                    return self._ask(keep, "keep-only", edges)
                return
            off = self._tally_of(self._all_off)
            if off.divergences:
                # Background drift: the answer stands only if it is still clearly above it.
                if self._confirmed() == edges:
                    return self._finish_found(edges)
                self._answer = None
                return self._search_on()
            if off.clean >= self._runs_to_miss(edges, self.alpha) or self._unresolved(self._all_off):
                return self._finish_found(edges)
            if off.clean + self._in_flight_of(self._all_off) < self._runs_to_miss(edges, self.alpha):
                return self._ask(self._all_off, "check-off", edges, AFTER_DROP_ONLY_DIVERGED)
            return self._search_on()
        needed = self._drop_needed(edges)
        if needed > 0 and not self._unresolved(drop):
            if self._in_flight_of(drop) < needed:
                return self._ask(drop, "drop-only", edges)
            return self._search_on()
        if self.background_controls and not self._unresolved(self._all_off):
            if self._tally_of(self._all_off).divergences and self._confirmed() != edges:
                # Background drift showed: the answer must stand clearly above it.
                self._answer = None
                return self._search_on()
            controls = self._background_controls_needed(edges)
            if controls > 0:
                if self._in_flight_of(self._all_off) < controls:
                    return self._ask(self._all_off, "check-off", edges, BACKGROUND_CONTROL)
                return self._search_on()
        self._finish_found(edges)

    def _background_controls_needed(self, edges: tuple[int, ...]) -> int:
        """More clean all-off runs needed before background drift as strong as the
        answer's would have shown with chance 1 - alpha/2.

        Only runs that could not have singled the answer out count: all-off, and the
        drop-only runs of the double check. The search's other runs without the answer
        do not: under background drift the answer is the set every diverged run happened
        to enable, so those runs are clean by selection.
        """
        return max(0, self._controls_for(edges) - self._controls(edges))

    def _controls(self, edges: tuple[int, ...]) -> int:
        """Clean runs that could not have singled the answer out: all-off, and the
        drop-only runs of the double check."""
        drop = self._drop_only(edges)
        checked = sum(b.runs - b.errors - b.divergences for b in self.events
                      if b.step == "drop-only" and b.enabled == drop)
        return self._tally_of(self._all_off).clean + checked

    def _controls_for(self, edges: tuple[int, ...]) -> int:
        """Clean control runs that show background drift as strong as the answer's
        with chance 1 - alpha/2, or more where the answer's other errors leave less of
        the error budget (the verdict's confidence counts all three, see _finish_found)."""
        spare = self.alpha - self._answer_error(edges) - self._second_cause_error(edges)
        return self._controls_at(self._strength(edges), min(self.alpha / 2, max(spare, self.alpha / 100)))

    def _controls_at(self, chance: float, miss: float | None = None) -> int:
        """Clean control runs that show drift of this per-run chance with chance 1 - miss
        (default alpha/2)."""
        return math.ceil(math.log(miss or self.alpha / 2) / math.log(1 - chance))

    def _strength(self, edges: tuple[int, ...]) -> float:
        """The answer's per-run chance for the background check: the lower of its
        posterior mean (which the runs that singled it out make lean high) and
        all-on's rate (Beta(1, 3) prior), which no choice of the search biases."""
        if len(edges) > 2:
            rate = _rate(*self._counts(edges))
        else:
            rate = self.model.culprit_chance(edges)
        return min(rate, self._all_on_rate(), 0.999)

    def _all_on_rate(self) -> float:
        """Posterior mean per-run chance of all-on runs (Beta(1, 3) prior)."""
        on = self._tally_of(self._all_on)
        return _rate(on.divergences, on.clean)

    def _drop_needed(self, edges: tuple[int, ...]) -> int:
        """Clean drop-only runs still needed before the answer's error fits the budget,
        and before drift without prefetch as strong as all-on's would have shown."""
        spare = self.alpha - self._answer_error(edges)
        if spare <= 0:
            return 1
        done = self._tally_of(self._drop_only(edges)).clean
        for extra in range(max(0, MIN_DROP_ONLY - done), 400):
            if (self._second_cause_error(edges, extra) <= spare
                    and self._background_miss(edges, extra) <= self.alpha / 2):
                return extra
        return 400

    def _background_miss(self, edges: tuple[int, ...], extra: int = 0) -> float:
        """Chance that background drift as strong as all-on's hid from every clean run
        without the answer (`extra` more of them).

        The strength comes from the all-on runs alone (Beta(1, 3) prior), not from the
        runs that singled the answer out, which a search's own choices make lean high.
        """
        strength = self._all_on_rate()
        clean_without = self.model.exposure - self._counts(edges)[1] + extra
        return (1 - strength) ** clean_without

    def _runs_to_miss(self, edges: tuple[int, ...], chance: float) -> int:
        """Clean runs after which drift as strong as the answer's hides with at most this chance."""
        n = 1
        while self._miss(edges, n) > chance and n < self.budget:
            n += 1
        return n

    def _answer_error(self, edges: tuple[int, ...]) -> float:
        """Chance the answer is wrong inside the posterior's model (a set of three or more:
        that some member was not needed)."""
        if len(edges) > 2:
            return self._members_error(edges)
        return 1.0 - self.model.probability_of(edges)

    def _second_cause_error(self, edges: tuple[int, ...], extra: int = 0) -> float:
        """Chance another disjoint cause, as strong as the answer, hid from every clean run.

        A second cause is one more edge outside the answer; each clean run that enabled
        it (drop-only runs enable them all; `extra` more of those) is a chance missed.
        """
        outside = np.ones(len(self.edge_ids), dtype=bool)
        outside[list(edges)] = False
        if not outside.any():
            return 0.0
        clean = self.model.single_exposure[outside] + extra
        return DISJOINT_CAUSES * float(np.mean(self._miss(edges, clean)))

    # -- finishing ------------------------------------------------------------------------------
    def _covering(self, edges: Sequence[int]) -> list[RunResult]:
        """Completed runs whose mask enabled every edge of the set (no set: all-on's runs)."""
        wanted = self._keep_only(edges) if edges else self._all_on
        return [r for mask, r in self.history if r.completed and wanted <= mask]

    def _calibration(self, edges: Sequence[int]) -> dict:
        """The per-run chance and per-step hazard, from the runs that enabled the set.

        Those runs include the divergences that singled the set out, so the
        estimate leans high; the interval says how far to trust it.
        """
        runs = self._covering(edges)
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

    def _result_of(self, verdict, minimal, confidence, facts, *, drop=None, finished=True):
        return SearchResult(
            verdict=verdict,
            minimal_set=[self.edge_ids[i] for i in sorted(minimal)],
            confidence=float(confidence),
            runs_used=self.runs_used,
            steps_used=self.steps_used,
            evidence=[b.to_dict() for b in self.events],
            calibration=self._calibration(minimal),
            facts=facts,
            drop_only_diverges=drop,
            top_hypotheses=self.posterior,
            finished=finished,
        )

    def _finish_no_drift(self) -> None:
        n = self._clean_cover()
        fact = Fact(NO_DRIFT, runs=n, clean=(self._tally_of(self._all_on).clean,),
                    chance=upper_bound_none_seen(n, self.confidence))
        self._result = self._result_of("no-drift-reproduced", (), self.confidence, [fact])

    def _finish_not_prefetch(self) -> None:
        off = self._tally_of(self._all_off)
        fact = Fact(ALL_OFF_DIVERGED, runs=off.clean + off.divergences, divergences=off.divergences,
                    chance=self.model.background())
        self._result = self._result_of("not-prefetch", (), self.model.probability_of(()), [fact])

    def _finish_inconclusive(self, reason: str) -> None:
        self._result = self._result_of(
            "inconclusive", (), self.model.top().probability, [self._stopped(reason)]
        )

    def _stopped(self, reason: str) -> Fact:
        """Why the search stopped, with its best guess (no edges: drift without prefetch;
        in the reduce step the core, at the chance that each of its edges is needed)."""
        limit = self.budget if reason == "max-runs" else None
        if self._reducing:
            core = self._core_edges()
            return Fact(STOPPED, edges=self._ids(core), chance=max(0.0, 1.0 - self._members_error(core)),
                        reason=reason, limit=limit)
        top = self.model.top()
        return Fact(STOPPED, edges=self._ids(top.edges), chance=top.probability, reason=reason, limit=limit)

    def _finish_found(self, edges: tuple[int, ...]) -> None:
        keep, drop = self._keep_only(edges), self._drop_only(edges)
        ids = self._ids(edges)
        run, result = next(
            (i + 1, r) for i, (m, r) in enumerate(self.history) if m == keep and r.diverged
        )
        facts = [Fact(KEEP_ONLY_DIVERGED, edges=ids, run=run, step=result.first_diff_step)]
        if len(edges) > 1:
            facts.append(self._each_needed(edges))
        tally = self._tally_of(drop)
        drop_diverges = bool(tally.divergences)
        confidence = 1.0 - self._answer_error(edges)
        if drop_diverges:
            # Settles the second-cause question: the set is a cause, not the only one.
            facts.append(Fact(DROP_ONLY_DIVERGES, edges=ids, runs=self._tally_of(self._all_off).clean))
        else:
            confidence -= self._second_cause_error(edges)
            if tally.clean:
                facts.append(Fact(DROP_ONLY_CONSISTENT, edges=ids, runs=tally.clean))
            elif tally.errors:
                facts.append(Fact(DROP_ONLY_FAILED, edges=ids, errors=tally.errors))
            else:
                facts.append(Fact(DROP_ONLY_NOT_RUN, edges=ids))
        ran_drop = drop_diverges or tally.clean > 0
        off = self._tally_of(self._all_off)
        if off.divergences:
            # Background drift beside the culprit: the set's rate stands clearly above it.
            facts.append(Fact(BACKGROUND, runs=off.clean + off.divergences, divergences=off.divergences,
                              chance=self.model.background()))
        elif not drop_diverges:
            # What the control runs rule out (all_off_runs="auto": enough for drift
            # without prefetch as strong as the answer's; otherwise as many as ran). The
            # chance that such drift hid from every control is part of the verdict's error.
            runs, strength = self._controls(edges), self._strength(edges)
            confidence -= (1 - strength) ** runs
            facts.append(Fact(BACKGROUND_RULED_OUT, edges=ids, runs=runs,
                              chance=upper_bound_none_seen(runs, self.confidence), strength=strength))
        self._result = self._result_of(
            "culprit-found", edges, max(confidence, 0.0), facts, drop=drop_diverges if ran_drop else None
        )

    def _each_needed(self, edges: Sequence[int]) -> Fact:
        """The evidence that every edge of the set is needed: clean runs with the rest of it but not that edge."""
        ids = self._ids(edges)

        def clean_without(edge: str) -> int:
            rest = set(ids) - {edge}
            return sum(1 for m, r in self.history
                       if r.completed and not r.diverged and rest <= m and edge not in m)

        chance = self._members_error(edges) if len(edges) > 2 else None
        return Fact(EACH_NEEDED, edges=ids, clean=tuple(clean_without(e) for e in ids), chance=chance)

    # -- reading --------------------------------------------------------------------------------
    @property
    def state(self) -> str:
        """The protocol step of the next mask, or "done"."""
        return "done" if self.pending is None else self.pending.step

    @property
    def posterior(self) -> list[dict]:
        """The five most probable culprit sets with their probabilities."""
        return [
            {"kind": h.kind, "edges": [self.edge_ids[i] for i in h.edges], "probability": h.probability}
            for h in self.model.ranked(5)
        ]

    def result(self) -> SearchResult:
        """The verdict; before the search is done, what was learned so far (inconclusive)."""
        if self.done:
            return self._result
        return self._result_of(
            "inconclusive", (), self.model.top().probability, [self._stopped("not-finished")],
            finished=False,
        )
