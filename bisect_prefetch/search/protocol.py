"""The bisection protocol: which mask to run next, and what the runs so far show.

Pure: no I/O, no clock, no randomness. The state is a function of the recorded
runs alone, so resuming is replaying: feed the journal's results back through
`record` in order and the search is where it was (`--confidence` and
`--max-runs` may change in between). `record` accepts any mask, not only the
one asked for.

Noise model (posterior.py): one set of edges (possibly none, possibly a pair
needed together) causes drift; a run of a mask enabling that whole set diverges
with an unknown per-run chance q, any other run stays clean. A divergence is
conclusive; a clean run only lowers the odds of the sets its mask enabled. Runs
that failed (error, timeout) cost a run and tell nothing; a mask that fails
`max_errors` times in a row is unresolved and not asked again.

Steps, each narrated as a block of runs in `events`:
1. calibrate: all-on until it diverges. No divergence within `calibration_runs`
   runs: no-drift-reproduced, with the per-run chance that is ruled out (about 3/n).
2. check-off: all-off, `all_off_runs` times. A divergence: not-prefetch.
3. search: the mask whose next run tells most (expected information) about
   which set causes drift, among runs of consecutive surviving edges in graph
   order (a phase, a range of layers) and their complements. Near-best masks that read better or double as the
   final check win: forward-off and backward-off (the structured split), and
   keep-only or drop-only of the leading set. A mask's runs stop at its first
   divergence (the posterior moves on); clean runs repeat only while the mask
   stays the best question. The calibration runs count as evidence about q.
4. double check, once a set reaches the confidence: keep-only(set) must have
   diverged (it runs until it does; its clean runs lower the set's probability
   and the search resumes if it falls below), which also rules out every other
   set; then drop-only(set) runs until the chance that another, disjoint cause
   as strong as this one hid from them fits the error budget (prior
   DISJOINT_CAUSES): removing the set removes drift. A divergence there means
   another set causes drift too, or drift needs no prefetch edge at all: all-off
   runs again until it diverges (not-prefetch) or has stayed consistent long
   enough to miss drift as strong as the set's with chance at most alpha.
Out of runs (`max_runs`): inconclusive, with the best hypotheses so far (or,
when only the drop-only check was cut short, the set with a lower confidence).
Sets of three or more edges needed together are outside the model: the search
ends inconclusive on them (delta debugging finds them, at many times the runs;
see simulate.ddmin_repeats).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.search.oracle import RunResult
from bisect_prefetch.search.posterior import EdgePosterior, Hypothesis
from bisect_prefetch.search.stats import (
    clopper_pearson,
    hazard_estimate,
    upper_bound_none_seen,
)
from bisect_prefetch.select import describe

VERDICTS = ("culprit-found", "no-drift-reproduced", "not-prefetch", "inconclusive")
# A mask that reads better (forward-off, backward-off) or doubles as the final
# check (drop-only of the leading set) wins with this share of the best information;
# keep-only of the leading set, whose divergence ends the search, with KEEP_SHARE.
NEAR_BEST = 0.9
KEEP_SHARE = 0.85
# Prior chance that another set, disjoint from the answer, also causes drift: it is
# outside the posterior's one-cause model, so only drop-only(answer) runs rule it out.
DISJOINT_CAUSES = 0.1


@dataclass
class Block:
    """Consecutive runs of one mask in one protocol step: one narrated line, one evidence row."""

    step: str  # calibrate | check-off | search | keep-only | drop-only | extra
    title: str  # what the step checks, e.g. "checking that all-on diverges"
    mask: str  # short name of the mask
    edges: int  # enabled edges
    first_run: int  # 1-based number of the block's first run in the whole search
    enabled: frozenset[str] = frozenset()
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

    @property
    def line(self) -> str:
        """The verdict line, e.g. "diverged at run 2 (step 17)" or "clean (9 runs)"."""
        failed = f", {self.errors} failed" if self.errors else ""
        if self.divergences:
            return f"diverged at run {self.diverged_at} (step {self.first_diff_steps[0]}){failed}"
        clean = self.runs - self.errors
        if clean:
            return f"clean ({_runs(clean)}{failed})"
        return f"unresolved ({_runs(self.errors)} failed)"

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


def _runs(n: int) -> str:
    return f"{n} run{'s' * (n != 1)}"


@dataclass
class _Tally:
    clean: int = 0
    divergences: int = 0
    errors: int = 0
    failing: int = 0  # failed runs since the last completed one


@dataclass(frozen=True)
class Ask:
    """The next mask and the protocol step it belongs to."""

    mask: frozenset[str]
    step: str
    title: str


@dataclass(frozen=True)
class SearchResult:
    verdict: str  # one of VERDICTS
    minimal_set: list[str]
    confidence: float
    runs_used: int
    steps_used: int
    evidence: list[dict]  # one row per block of runs (Block.to_dict)
    calibration: dict  # per_run_chance, interval, hazard_per_step, runs, divergences, ...
    facts: list[str]  # the checked statements behind the verdict, in words
    drop_only_diverges: bool | None = None  # None when drop-only was not run
    top_hypotheses: list[dict] = field(default_factory=list)
    finished: bool = True


def mask_name(mask: frozenset[str], edge_ids: Sequence[str]) -> str:
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
        max_runs: int = 200,
        calibration_runs: int | None = None,
        all_off_runs: int = 1,
        steps_per_run: int | None = None,
        max_errors: int = 3,
    ) -> None:
        if not edge_ids:
            raise BisectPrefetchError("the graph has no prefetch edges to bisect")
        if len(set(edge_ids)) != len(edge_ids):
            raise BisectPrefetchError("edge ids must be unique")
        if not 0.0 < confidence < 1.0:
            raise BisectPrefetchError(f"--confidence must be between 0 and 1, got {confidence}")
        if max_runs < 1:
            raise BisectPrefetchError(f"--max-runs must be at least 1, got {max_runs}")
        self.edge_ids = list(edge_ids)
        self._index = {e: i for i, e in enumerate(self.edge_ids)}
        self.confidence = confidence
        self.alpha = 1.0 - confidence
        self.max_runs = max_runs
        # Default: a quarter of the budget (50 of 200 rules out chances above 0.06).
        self.calibration_runs = calibration_runs or min(max_runs, max(10, max_runs // 4))
        self.all_off_runs = all_off_runs
        self.steps_per_run = steps_per_run
        self.max_errors = max_errors

        self.model = EdgePosterior(len(self.edge_ids))
        self.history: list[tuple[frozenset[str], RunResult]] = []
        self.events: list[Block] = []
        self.runs_used = 0
        self.steps_used = 0
        self.pending: Ask | None = None
        self._tally: dict[frozenset[str], _Tally] = {}
        self._all_on = frozenset(self.edge_ids)
        self._all_off: frozenset[str] = frozenset()
        self._phases = {
            phase: np.array([e.startswith(phase + ":") for e in self.edge_ids])
            for phase in ("fwd", "bwd")
        }
        self._answer: tuple[int, ...] | None = None
        self._result: SearchResult | None = None
        self._decide()

    # -- the loop ------------------------------------------------------------------
    def next_mask(self) -> frozenset[str] | None:
        return None if self.pending is None else self.pending.mask

    @property
    def done(self) -> bool:
        return self._result is not None

    def record(self, mask: frozenset[str], result: RunResult) -> None:
        if self.done:
            raise BisectPrefetchError("the search is finished; no more runs to record")
        mask = frozenset(mask)
        unknown = sorted(mask - self._all_on)
        if unknown:
            raise BisectPrefetchError(f"run mask names edges not in the graph: {', '.join(unknown)}")
        self.history.append((mask, result))
        self.runs_used += 1
        self.steps_used += result.steps
        block = self._block_for(mask)
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
            self.model.observe(self._enabled(mask), bool(result.diverged), self._fraction(result))
        self._decide()

    def _block_for(self, mask: frozenset[str]) -> Block:
        ask = self.pending if self.pending is not None and self.pending.mask == mask else None
        step = ask.step if ask else "extra"
        last = self.events[-1] if self.events else None
        if last is not None and last.step == step and last.enabled == mask:
            return last
        name = mask_name(mask, self.edge_ids)
        title = ask.title if ask else f"recorded run of {name}"
        block = Block(step, title, name, len(mask), self.runs_used, enabled=mask)
        self.events.append(block)
        return block

    def _fraction(self, result: RunResult) -> float:
        """How much of a full run a clean run covered (1 when the run length is unknown)."""
        if result.diverged or not self.steps_per_run:
            return 1.0
        return min(1.0, result.steps / self.steps_per_run)

    # -- masks ------------------------------------------------------------------------
    def _enabled(self, mask: frozenset[str]) -> np.ndarray:
        enabled = np.zeros(len(self.edge_ids), dtype=bool)
        enabled[[self._index[e] for e in mask]] = True
        return enabled

    def _keep_only(self, edges: Sequence[int]) -> frozenset[str]:
        return frozenset(self.edge_ids[i] for i in edges)

    def _drop_only(self, edges: Sequence[int]) -> frozenset[str]:
        return self._all_on - self._keep_only(edges)

    def _names(self, edges: Sequence[int]) -> str:
        return ",".join(self.edge_ids[i] for i in sorted(edges))

    def _tally_of(self, mask: frozenset[str]) -> _Tally:
        return self._tally.get(mask, _Tally())

    def _unresolved(self, mask: frozenset[str]) -> bool:
        return self._tally_of(mask).failing >= self.max_errors

    def _ask(self, mask: frozenset[str], step: str, title: str) -> None:
        self.pending = Ask(mask, step, title)

    # -- deciding ----------------------------------------------------------------------
    def _decide(self) -> None:
        self.pending = None
        if self.done:
            return
        if self.runs_used >= self.max_runs:
            if self._answer is not None and self._tally_of(self._keep_only(self._answer)).divergences:
                # The set is known to cause drift; only the drop-only check was cut short.
                return self._finish_found()
            return self._finish_inconclusive(f"the run budget (--max-runs {self.max_runs}) ran out")
        if self._tally_of(self._all_off).divergences:
            return self._finish_not_prefetch()
        on = self._tally_of(self._all_on)
        if self.model.divergences == 0 and on.clean >= self.calibration_runs:
            return self._finish_no_drift()
        if self.model.divergences == 0:
            if self._unresolved(self._all_on):
                return self._finish_inconclusive("all-on never completed a run")
            return self._ask(self._all_on, "calibrate", "checking that all-on diverges")
        off = self._tally_of(self._all_off)
        if off.clean < self.all_off_runs and not self._unresolved(self._all_off):
            return self._ask(self._all_off, "check-off", "checking that all-off is consistent")
        if self._answer is None:
            self._search()
        if self._answer is not None and not self.done:
            self._double_check()

    def _search(self) -> None:
        # Pairs needed together are weighed only once they are the likely answer;
        # until then the search and its stop rule work given that none is needed.
        pairs = self.model.pairs_likely
        top = self.model.top(pairs=pairs)
        if top.probability >= self.confidence:
            keep = self._keep_only(top.edges)
            if self._tally_of(keep).divergences:
                # That divergence ruled out every other set, pairs included.
                self._answer = top.edges
                return
            if not self._unresolved(keep):
                name = f"keep-only:{self._names(top.edges)}" if top.edges else "all-off"
                return self._ask(keep, "keep-only", f"double checking the answer: {name} should diverge")
        mask = self._most_informative(top, pairs=pairs)
        if mask is None:
            return self._finish_inconclusive("every informative mask is unresolved")
        self._ask(mask, "search", f"testing {mask_name(mask, self.edge_ids)}")

    def _most_informative(self, top: Hypothesis, *, pairs: bool) -> frozenset[str] | None:
        """The best mask of the posterior's family, or a near-best one (see NEAR_BEST)."""
        ranked = [
            (bits, self._keep_only(np.flatnonzero(enabled)))
            for bits, enabled in self.model.ranked_tests(limit=16, pairs=pairs)
        ]
        ranked = [(bits, mask) for bits, mask in ranked if not self._unresolved(mask)]
        if not ranked:
            return None
        best_bits, best = ranked[0]

        def bits_of(mask: frozenset[str]) -> float:
            return self.model.information(self._enabled(mask), pairs=pairs)

        alternatives = []
        keep = self._keep_only(top.edges)
        if top.edges and not self._tally_of(keep).divergences:
            # Once keep-only(leader) has diverged, drop-only(leader) is left to the
            # double check, which tells a second cause from drift without prefetch.
            if bits_of(keep) >= KEEP_SHARE * best_bits and not self._unresolved(keep):
                return keep
            alternatives.append(self._drop_only(top.edges))
        alive = self.model.alive
        for phase in ("fwd", "bwd"):
            split = alive & self._phases[phase]
            if split.any() and split.sum() < alive.sum():
                alternatives.append(self._keep_only(np.flatnonzero(split)))
        threshold = NEAR_BEST * best_bits
        for mask in alternatives:
            bits = bits_of(mask)
            if bits >= threshold and not self._unresolved(mask):
                threshold, best = bits, mask
        return best

    # -- double check -----------------------------------------------------------------------
    def _double_check(self) -> None:
        edges = self._answer
        keep, drop = self._keep_only(edges), self._drop_only(edges)
        if not self._tally_of(keep).divergences:
            if self._unresolved(keep):
                return self._finish_inconclusive("keep-only of the answer never completed a run")
            return self._ask(keep, "keep-only", f"double checking the answer: keep-only:{self._names(edges)} should diverge")
        tally = self._tally_of(drop)
        if tally.divergences:
            # Another cause, or drift without prefetch: all-off tells them apart.
            off = self._tally_of(self._all_off)
            if off.clean >= self._runs_to_miss(self.alpha) or self._unresolved(self._all_off):
                return self._finish_found()
            return self._ask(self._all_off, "check-off", "drop-only still diverges: checking that all-off is consistent")
        if self._drop_settled(tally.clean) or self._unresolved(drop):
            return self._finish_found()
        self._ask(drop, "drop-only", f"double checking the answer: drop-only:{self._names(edges)} should be consistent")

    def _drop_settled(self, clean: int) -> bool:
        return self._answer_error() + self._second_cause_error(clean) <= self.alpha

    def _runs_to_miss(self, chance: float) -> int:
        """Clean runs after which drift as strong as the answer's hides with at most this chance."""
        n = 1
        while self.model.miss_chance(self._answer, n) > chance and n < self.max_runs:
            n += 1
        return n

    def _answer_error(self) -> float:
        """Chance the answer is wrong inside the posterior's model."""
        return 1.0 - self.model.probability_of(self._answer)

    def _second_cause_error(self, clean: int) -> float:
        """Chance another disjoint cause, as strong as the answer, hid from `clean` drop-only runs."""
        return DISJOINT_CAUSES * self.model.miss_chance(self._answer, clean)

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
        n = self._tally_of(self._all_on).clean
        bound = upper_bound_none_seen(n, self.confidence)
        fact = (
            f"all-on: {n} runs, none diverged: a per-run chance of {bound:.3g} or more "
            f"is ruled out at {self.confidence:.0%} (fewer than 3/{n})"
        )
        self._result = self._result_of("no-drift-reproduced", (), self.confidence, [fact])

    def _finish_not_prefetch(self) -> None:
        off = self._tally_of(self._all_off)
        fact = (
            f"all-off diverged ({off.divergences} of {off.clean + off.divergences} runs): "
            "drift happens with every prefetch edge off, so it has another cause"
        )
        self._result = self._result_of("not-prefetch", (), 1.0, [fact])

    def _finish_inconclusive(self, why: str) -> None:
        self._result = self._result_of(
            "inconclusive", (), self.model.top().probability, [self._guess(f"stopped: {why}")]
        )

    def _guess(self, why: str) -> str:
        top = self.model.top()
        guess = "{" + self._names(top.edges) + "}" if top.edges else "no edge (drift without prefetch)"
        return f"{why}; best guess {guess} at probability {top.probability:.3f}"

    def _finish_found(self) -> None:
        edges = self._answer
        keep, drop = self._keep_only(edges), self._drop_only(edges)
        names = self._names(edges)
        run, result = next(
            (i + 1, r) for i, (m, r) in enumerate(self.history) if m == keep and r.diverged
        )
        facts = [
            f"keep-only:{names} diverged (run {run}, step {result.first_diff_step}): "
            "the set is enough for drift"
        ]
        if len(edges) > 1:
            facts.append(self._each_needed(edges))
        tally = self._tally_of(drop)
        drop_diverges = bool(tally.divergences)
        confidence = 1.0 - self._answer_error()
        if drop_diverges:
            # Settles the second-cause question: the set is a cause, not the only one.
            off = self._tally_of(self._all_off)
            facts.append(
                f"drop-only:{names} still diverges while all-off stayed consistent "
                f"({_runs(off.clean)}): another set of edges causes drift too"
            )
        else:
            confidence -= self._second_cause_error(tally.clean)
            if tally.clean:
                facts.append(
                    f"drop-only:{names}: {_runs(tally.clean)}, all consistent: removing the set removes drift"
                )
            elif tally.errors:
                facts.append(f"drop-only:{names} could not be run ({tally.errors} failed)")
            else:
                facts.append(f"drop-only:{names} was not run: the run budget ran out")
        ran_drop = drop_diverges or tally.clean > 0
        self._result = self._result_of(
            "culprit-found", edges, max(confidence, 0.0), facts, drop=drop_diverges if ran_drop else None
        )

    def _each_needed(self, edges: Sequence[int]) -> str:
        """The evidence that every edge of a pair is needed: runs enabling only one of them."""
        a, b = (self.edge_ids[i] for i in edges)

        def clean_with_only(x: str, y: str) -> int:
            return sum(1 for m, r in self.history if r.completed and not r.diverged and x in m and y not in m)

        return (
            f"each edge of the set is needed: {_runs(clean_with_only(a, b))} enabling {a} without {b} "
            f"and {_runs(clean_with_only(b, a))} enabling {b} without {a} stayed consistent"
        )

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
        if self._result is not None:
            return self._result
        return self._result_of(
            "inconclusive", (), self.model.top().probability, [self._guess("not finished")],
            finished=False,
        )
