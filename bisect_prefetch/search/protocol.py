"""The bisection protocol: which mask to run next, and what the runs so far show.

Pure: no I/O, no clock, no randomness. The state is a function of the recorded
runs alone, so resuming is replaying: feed the journal's results back through
`record` in order and the search is where it was (and `--confidence` or
`--max-runs` can change between the two). `record` accepts any mask, not only
the one asked for.

Noise model (see posterior.py): one set of edges (possibly none, possibly a
pair needed together) causes drift; a run of a mask enabling that whole set
diverges with an unknown per-run chance q, any other run stays clean. A
divergence is conclusive; a clean run only lowers the odds of the sets its mask
enabled. Runs that failed (error, timeout) cost a run and tell nothing; a mask
that fails `max_errors` times is unresolved and not asked again.

Steps, each narrated as a block of runs in `events`:
1. calibrate: all-on until it diverges. None within `calibration_runs` runs:
   no-drift-reproduced, with the per-run chance ruled out (about 3/n).
2. check-off: all-off, `all_off_runs` times. A divergence: not-prefetch.
3. search: the mask whose next run gives the most expected information about
   the culprit set (posterior.py), the structured split (forward-off or
   backward-off) when it is nearly as good. Runs of a mask stop at its first
   divergence (the posterior moves on); clean runs repeat only while the mask
   stays the best question. Calibration runs count as evidence about q.
4. double check, once a set reaches the confidence: keep-only(set) must have
   diverged (run it until it does; its clean runs lower the set's probability
   and the search resumes if it falls below); then drop-only(set) runs until
   enough clean runs to miss a cause as strong as the one found with chance at
   most alpha: removing the set removes drift. A divergence there is reported:
   another set causes drift too.
5. fallback: when the posterior says three or more edges are needed together,
   ddmin over the surviving edges, each test run until a divergence or a clean
   verdict sized from a Clopper-Pearson lower bound of q, with the error budget
   split over those verdicts.
Out of runs (`max_runs`): inconclusive, with the best hypotheses so far.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.search.ddmin import DeltaDebugger
from bisect_prefetch.search.oracle import RunResult
from bisect_prefetch.search.posterior import EdgePosterior, Hypothesis
from bisect_prefetch.search.stats import (
    clopper_pearson,
    error_share,
    hazard_estimate,
    runs_for_clean_verdict,
    upper_bound_none_seen,
)
from bisect_prefetch.select import describe

VERDICTS = ("culprit-found", "no-drift-reproduced", "not-prefetch", "inconclusive")
# A mask that reads better (forward-off, backward-off) or doubles as the final check
# (drop-only of the leading set) wins when it gives this share of the best information.
NEAR_BEST = 0.9
# Prior chance that another set, disjoint from the answer, also causes drift: outside
# the posterior's one-cause model, so only drop-only(answer) runs can rule it out.
DISJOINT_CAUSES = 0.1
KEEP_SHARE = 0.85


@dataclass
class Block:
    """Consecutive runs of one mask in one protocol step: one narrated line, one evidence row."""

    step: str  # calibrate | check-off | search | keep-only | drop-only | ddmin | extra
    title: str  # what the step checks, e.g. "checking that all-on diverges"
    mask: str  # short name of the mask
    edges: int  # enabled edges
    first_run: int  # 1-based number of the block's first run in the whole search
    runs: int = 0
    divergences: int = 0
    errors: int = 0
    first_diff_steps: list[int] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        if self.divergences:
            return "diverged"
        if self.runs > self.errors:
            return "clean"
        return "unresolved"

    @property
    def line(self) -> str:
        """The verdict line, e.g. "diverged at run 2 (step 17)" or "clean (9 runs)"."""
        failed = f", {self.errors} failed" if self.errors else ""
        if self.divergences:
            return f"diverged at run {self.runs} (step {self.first_diff_steps[-1]}){failed}"
        clean = self.runs - self.errors
        if clean:
            return f"clean ({clean} run{'s' * (clean != 1)}{failed})"
        return f"unresolved ({self.errors} run{'s' * (self.errors != 1)} failed)"

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


@dataclass(frozen=True)
class Ask:
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
    evidence: list[dict]
    calibration: dict  # per_run_chance, interval, hazard_per_step, runs, divergences
    facts: list[str]  # the checked statements behind the verdict, in words
    drop_only_diverges: bool | None = None  # None when not checked
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
    repeat; then `b.result()`. `b.pending` says which step the next mask belongs to.
    """

    def __init__(
        self,
        edge_ids: Sequence[str],
        *,
        confidence: float = 0.95,
        max_runs: int = 200,
        calibration_runs: int | None = None,
        all_off_runs: int = 1,
        drop_runs: int | None = None,
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
        # Default: a quarter of the budget, enough to rule out per-run chances near 0.06.
        self.calibration_runs = calibration_runs or max(1, min(max_runs, max(10, max_runs // 4)))
        self.all_off_runs = all_off_runs
        self.drop_runs = drop_runs
        self.steps_per_run = steps_per_run
        self.max_errors = max_errors

        self.model = EdgePosterior(len(self.edge_ids))
        self.history: list[tuple[frozenset[str], RunResult]] = []
        self.events: list[Block] = []
        self.runs_used = 0
        self.steps_used = 0
        self.pending: Ask | None = None
        self._last_mask: frozenset[str] | None = None
        self._tally: dict[frozenset[str], _Tally] = {}
        self._answer: Hypothesis | None = None
        self._answer_confidence = 0.0
        self._ddmin: DeltaDebugger | None = None
        self._dd_q_low = 0.0
        self._dd_clean = 0
        self._dd_spent = 0.0
        self._dd_verdicts = 0
        self._result: SearchResult | None = None
        self._all_on = frozenset(self.edge_ids)
        self._phases = {
            phase: np.array([e.startswith(phase + ":") for e in self.edge_ids]) for phase in ("fwd", "bwd")
        }
        self._all_off: frozenset[str] = frozenset()
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
        if not result.completed:
            tally.errors += 1
            block.errors += 1
        else:
            if result.diverged:
                tally.divergences += 1
                block.divergences += 1
                block.first_diff_steps.append(result.first_diff_step or result.steps)
            else:
                tally.clean += 1
            self.model.observe(self._enabled(mask), bool(result.diverged), self._fraction(result))
            self._ddmin_observe(mask, bool(result.diverged))
        self._decide()

    def _block_for(self, mask: frozenset[str]) -> Block:
        ask = self.pending if self.pending is not None and self.pending.mask == mask else None
        step = ask.step if ask else "extra"
        last = self.events[-1] if self.events else None
        if last is not None and last.step == step and self._last_mask == mask:
            return last
        title = ask.title if ask else f"recorded run of {mask_name(mask, self.edge_ids)}"
        block = Block(step, title, mask_name(mask, self.edge_ids), len(mask), self.runs_used)
        self.events.append(block)
        self._last_mask = mask
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
        return ",".join(self.edge_ids[i] for i in sorted(edges)) or "(no edge)"

    def _tally_of(self, mask: frozenset[str]) -> _Tally:
        return self._tally.get(mask, _Tally())

    def _unresolved(self, mask: frozenset[str]) -> bool:
        return self._tally_of(mask).errors >= self.max_errors

    def _ask(self, mask: frozenset[str], step: str, title: str) -> None:
        self.pending = Ask(mask, step, title)

    # -- deciding ----------------------------------------------------------------------
    def _decide(self) -> None:
        self.pending = None
        if self.done:
            return
        if self.runs_used >= self.max_runs:
            if self._answer is not None and self._tally_of(self._keep_only(self._answer.edges)).divergences:
                # The set is known to cause drift; only the drop-only check was cut short.
                return self._finish_found()
            return self._finish_inconclusive(f"the run budget (--max-runs {self.max_runs}) ran out")
        if self._tally_of(self._all_off).divergences:
            return self._finish_not_prefetch()
        on = self._tally_of(self._all_on)
        if self.model.divergences == 0:
            if on.clean >= self.calibration_runs:
                return self._finish_no_drift()
            if self._unresolved(self._all_on):
                return self._finish_inconclusive("all-on never completed a run")
            return self._ask(self._all_on, "calibrate", "checking that all-on diverges")
        off = self._tally_of(self._all_off)
        if off.clean < self.all_off_runs and not self._unresolved(self._all_off):
            return self._ask(self._all_off, "check-off", "checking that all-off is consistent")
        if self._answer is None:
            self._search()
        if self._answer is not None:
            self._double_check()

    def _search(self) -> None:
        # Pairs needed together are weighed only once they are the likely answer:
        # until then the search and its stop rule work given that none is needed.
        pairs = self.model.pairs_likely
        top = self.model.top(pairs=pairs)
        if top.probability >= self.confidence:
            keep = self._keep_only(top.edges)
            if self._tally_of(keep).divergences:
                # A divergence of keep-only(set) rules out every other set, pairs too.
                self._answer = top
                self._answer_confidence = self.model.probability_of(top.edges)
                return
            if not self._unresolved(keep):
                name = "all-off" if not top.edges else f"keep-only:{self._names(top.edges)}"
                return self._ask(keep, "keep-only", f"double checking the answer: {name} should diverge")
        if self._ddmin is not None or self._stalled():
            return self._ddmin_step()
        mask = self._most_informative(top, pairs=pairs)
        if mask is None:
            return self._finish_inconclusive("every informative mask is unresolved")
        self._ask(mask, "search", f"testing {mask_name(mask, self.edge_ids)}")

    def _most_informative(self, top: Hypothesis, *, pairs: bool) -> frozenset[str] | None:
        """The best mask of the posterior's family, or a near-best one that reads better.

        Near-best alternatives: the structured splits (forward-off, backward-off),
        and drop-only and keep-only of the leading set, whose runs are also the
        final double check.
        """
        ranked = [
            (bits, self._keep_only(np.flatnonzero(enabled)))
            for bits, enabled in self.model.ranked_tests(limit=16, pairs=pairs)
        ]
        ranked = [(bits, mask) for bits, mask in ranked if not self._unresolved(mask)]
        if not ranked:
            return None
        best_bits, best = ranked[0]
        alive = self.model.alive
        alternatives = []
        for phase in ("fwd", "bwd"):
            split = alive & self._phases[phase]
            if split.any() and split.sum() < alive.sum():
                alternatives.append(self._keep_only(np.flatnonzero(split)))
        if top.edges:
            keep = self._keep_only(top.edges)
            if (self.model.information(self._enabled(keep), pairs=pairs) >= KEEP_SHARE * best_bits
                    and not self._unresolved(keep)):
                return keep
            alternatives += [self._drop_only(top.edges), keep]
        threshold = NEAR_BEST * best_bits
        for mask in alternatives:
            bits = self.model.information(self._enabled(mask), pairs=pairs)
            if bits >= threshold and not self._unresolved(mask):
                threshold, best = bits, mask
        return best

    def _stalled(self) -> bool:
        """True when the posterior cannot explain the runs: a set of three or more edges."""
        return False

    # -- ddmin fallback ------------------------------------------------------------------
    def _ddmin_step(self) -> None:
        if self._ddmin is None:
            alive = [int(i) for i in np.flatnonzero(self.model.alive)]
            self._ddmin = DeltaDebugger(alive)
            # Half the error budget goes to the bound on q, half to the clean verdicts.
            runs, divergences = self._covering_counts(alive)
            self._dd_q_low = clopper_pearson(divergences, runs, 1.0 - self.alpha)[0]
            self._dd_spent = self.alpha / 2
        test = self._ddmin.test
        if test is None:
            self._answer = Hypothesis("many", tuple(sorted(self._ddmin.current)), 0.0)
            self._answer_confidence = 1.0 - self._dd_spent
            return
        mask = self._keep_only(test)
        self._ask(mask, "ddmin", f"ddmin: testing {mask_name(mask, self.edge_ids)}")

    def _ddmin_needed(self) -> int:
        share = error_share(self.alpha / 2, self._dd_verdicts + 1)
        if self._dd_q_low <= 0.0:
            return self.max_runs
        return runs_for_clean_verdict(self._dd_q_low, share)

    def _ddmin_observe(self, mask: frozenset[str], diverged: bool) -> None:
        dd = self._ddmin
        if dd is None or dd.test is None or mask != self._keep_only(dd.test):
            return
        if diverged:
            dd.report(True)
            self._dd_clean = 0
            return
        self._dd_clean += 1
        if self._dd_clean >= self._ddmin_needed():
            self._dd_verdicts += 1
            self._dd_spent += error_share(self.alpha / 2, self._dd_verdicts)
            dd.report(False)
            self._dd_clean = 0

    # -- double check -----------------------------------------------------------------------
    def _double_check(self) -> None:
        edges = self._answer.edges
        keep, drop = self._keep_only(edges), self._drop_only(edges)
        if not self._tally_of(keep).divergences:
            if self._unresolved(keep):
                return self._finish_inconclusive("keep-only of the answer never completed a run")
            return self._ask(keep, "keep-only", f"double checking the answer: keep-only:{self._names(edges)} should diverge")
        tally = self._tally_of(drop)
        if tally.divergences or self._drop_settled(tally.clean) or self._unresolved(drop):
            return self._finish_found()
        self._ask(drop, "drop-only", f"double checking the answer: drop-only:{self._names(edges)} should be consistent")

    def _drop_settled(self, clean: int) -> bool:
        """Enough clean drop-only runs: the answer's total error fits the budget."""
        if self.drop_runs is not None:
            return clean >= self.drop_runs
        return self._answer_error() + self._second_cause_error(clean) <= self.alpha

    def _answer_error(self) -> float:
        """Chance the answer is wrong inside the model (ddmin: the error budget it spent)."""
        if self._ddmin is not None:
            return 1.0 - self._answer_confidence
        return 1.0 - self.model.probability_of(self._answer.edges)

    def _second_cause_error(self, clean: int) -> float:
        """Chance another disjoint cause, as strong as the answer, hid from `clean` drop-only runs."""
        return DISJOINT_CAUSES * self.model.miss_chance(self._answer.edges, clean)

    # -- finishing ------------------------------------------------------------------------------
    def _covering_counts(self, edges: Sequence[int]) -> tuple[int, int]:
        """Completed runs whose mask enabled every edge of the set, and how many diverged."""
        wanted = self._keep_only(edges)
        runs = divergences = 0
        for mask, result in self.history:
            if result.completed and wanted <= mask:
                runs += 1
                divergences += bool(result.diverged)
        return runs, divergences

    def _chance_interval(self, edges: Sequence[int]) -> tuple[float, float, float]:
        """Point estimate and interval of the set's per-run chance, from the runs enabling it."""
        runs, divergences = self._covering_counts(edges)
        if runs == 0:
            return 0.0, 0.0, 1.0
        low, high = clopper_pearson(divergences, runs, self.confidence)
        return divergences / runs, low, high

    def _calibration(self, edges: Sequence[int]) -> dict:
        wanted = self._keep_only(edges)
        diffs, clean_steps = [], []
        for mask, result in self.history:
            if result.completed and wanted <= mask:
                if result.diverged:
                    diffs.append(result.first_diff_step or result.steps)
                else:
                    clean_steps.append(result.steps)
        runs, divergences = self._covering_counts(edges)
        estimate = divergences / runs if runs else None
        low, high = clopper_pearson(divergences, runs, self.confidence) if runs else (0.0, 1.0)
        return {
            "per_run_chance": estimate,
            "interval": [low, high],
            "interval_confidence": self.confidence,
            "hazard_per_step": hazard_estimate(diffs, clean_steps),
            "runs": runs,
            "divergences": divergences,
            "first_diff_steps": diffs,
        }

    def _make_result(self, verdict, minimal, confidence, facts, *, drop=None, finished=True, edges=()):
        return SearchResult(
            verdict=verdict,
            minimal_set=[self.edge_ids[i] for i in sorted(minimal)],
            confidence=float(confidence),
            runs_used=self.runs_used,
            steps_used=self.steps_used,
            evidence=[b.to_dict() for b in self.events],
            calibration=self._calibration(edges),
            facts=facts,
            drop_only_diverges=drop,
            top_hypotheses=self._top_hypotheses(),
            finished=finished,
        )

    def _top_hypotheses(self) -> list[dict]:
        return [
            {"kind": h.kind, "edges": [self.edge_ids[i] for i in h.edges], "probability": h.probability}
            for h in self.model.ranked(5)
        ]

    def _finish_no_drift(self) -> None:
        n = self._tally_of(self._all_on).clean
        bound = upper_bound_none_seen(n, self.confidence)
        fact = (
            f"all-on: {n} runs, none diverged: a per-run chance of {bound:.3g} or more "
            f"is ruled out at {self.confidence:.0%} (fewer than 3/{n})"
        )
        self._result = self._make_result("no-drift-reproduced", (), self.confidence, [fact])

    def _finish_not_prefetch(self) -> None:
        off = self._tally_of(self._all_off)
        fact = (
            f"all-off diverged ({off.divergences} of {off.clean + off.divergences} runs): "
            "drift happens with every prefetch edge off, so it has another cause"
        )
        self._result = self._make_result("not-prefetch", (), 1.0, [fact])

    def _finish_inconclusive(self, why: str) -> None:
        top = self.model.top()
        fact = f"stopped: {why}; best guess {self._describe_set(top.edges)} at {top.probability:.3f}"
        self._result = self._make_result("inconclusive", (), top.probability, [fact], edges=top.edges)

    def _describe_set(self, edges: Sequence[int]) -> str:
        return "no edge (background drift)" if not edges else "{" + self._names(edges) + "}"

    def _finish_found(self) -> None:
        edges = self._answer.edges
        keep, drop = self._keep_only(edges), self._drop_only(edges)
        names = self._names(edges)
        run, result = next(
            (i + 1, r) for i, (m, r) in enumerate(self.history) if m == keep and r.diverged
        )
        facts = [
            f"keep-only:{names} diverged (run {run}, step {result.first_diff_step}): "
            "the set is enough for drift"
        ]
        tally = self._tally_of(drop)
        drop_diverges = bool(tally.divergences)
        # A drop-only divergence settles the second-cause question; otherwise its
        # chance of hiding counts against the answer.
        confidence = 1.0 - self._answer_error()
        if not drop_diverges:
            confidence -= self._second_cause_error(tally.clean)
        if drop_diverges:
            facts.append(
                f"drop-only:{names} still diverges: another set of edges causes drift too"
            )
        elif tally.clean:
            facts.append(
                f"drop-only:{names}: {tally.clean} runs, all consistent: removing the set removes drift"
            )
        elif tally.errors:
            facts.append(f"drop-only:{names} could not be run ({tally.errors} failed)")
        else:
            facts.append(f"drop-only:{names} was not run: the run budget ran out")
        if len(edges) > 1:
            facts.append("removing any one edge of the set stops drift (1-minimal)")
        self._result = self._make_result(
            "culprit-found", edges, confidence, facts, drop=drop_diverges if tally.clean or drop_diverges else None,
            edges=edges,
        )

    # -- reading --------------------------------------------------------------------------------
    @property
    def state(self) -> str:
        """The protocol step of the next mask, or "done"."""
        return "done" if self.pending is None else self.pending.step

    @property
    def posterior(self) -> list[dict]:
        """The five most probable culprit sets with their probabilities."""
        return self._top_hypotheses()

    def result(self) -> SearchResult:
        """The verdict; before the search is done, what was learned so far (inconclusive)."""
        if self._result is not None:
            return self._result
        top = self.model.top()
        fact = f"not finished; best guess {self._describe_set(top.edges)} at {top.probability:.3f}"
        return self._make_result(
            "inconclusive", (), top.probability, [fact], finished=False, edges=top.edges
        )
