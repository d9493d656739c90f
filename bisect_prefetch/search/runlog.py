"""The run log: the one place a proposed or finished run of the search is written.

Every count the protocol reads is a query of it: a mask's tally, the runs in
flight, the blocks of consecutive runs (one narrated line and one evidence row
each), the clean and diverged runs as matrices over the edges, and the core
(the edges every diverged run enabled, drop-only runs of the double check
apart: their divergence shows a second cause, not where the answer lies).

Words: a protocol *stage* (STAGES) is a block of the search's runs; a *round* is one
one-cause search of the search for every cause (rounds.py); a *step* is always a
training step of a run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from bisect_prefetch.search.oracle import RunResult
from bisect_prefetch.select import describe
from bisect_prefetch.vocab import CLEAN, DIVERGED, DROP_ONLY, KEEP_ONLY, STAGE_EXTRA, Mask

# Why a check-off stage runs again late in the search (Ask.context, Block.context).
AFTER_DROP_ONLY_DIVERGED = "drop-only-diverged"
BACKGROUND_CONTROL = "background-control"  # all_off_runs="auto": ruling out background drift
BACKGROUND_PARITY = "background-parity"  # not-prefetch, or several causes? (checks.py)
NO_CAUSE_HERE = "no-cause-here"  # a later cause's search: all-on clean, no cause left (checks.py)


@dataclass(frozen=True)
class Ask:
    """The next run: its mask and the protocol stage it belongs to."""

    mask: Mask
    stage: str  # one of STAGES
    target: tuple[str, ...] = ()  # keep-only, drop-only, reduce: the answer set being checked
    context: str | None = None  # AFTER_DROP_ONLY_DIVERGED, BACKGROUND_CONTROL or None
    # The share of a full run it takes: 1 for a run of its own, a segment's steps over
    # steps_per_run for a segment of a longer run (segments.py). Budgets count it.
    share: float = 1.0


@dataclass
class Block:
    """Consecutive runs of one mask in one protocol stage: one narrated line, one evidence row."""

    stage: str  # one of STAGES
    mask: str  # short name of the mask
    edges: int  # enabled edges
    first_run: int  # 1-based number of the block's first run in the whole search
    enabled: Mask = frozenset()
    target: tuple[str, ...] = ()
    context: str | None = None
    runs: int = 0
    divergences: int = 0
    errors: int = 0
    first_diff_steps: list[int] = field(default_factory=list)
    diverged_at: int | None = None  # run (1-based, within the block) of the first divergence

    @property
    def verdict(self) -> str:
        if self.divergences:
            return DIVERGED
        return CLEAN if self.runs > self.errors else "unresolved"

    def to_dict(self) -> dict:
        """An evidence row of the bisect JSON (docs/contract.md: "step" names the stage)."""
        return {
            "step": self.stage,
            "mask": self.mask,
            "edges": self.edges,
            "runs": self.runs,
            "divergences": self.divergences,
            "errors": self.errors,
            "first_diff_steps": list(self.first_diff_steps),
            "verdict": self.verdict,
        }


@dataclass
class Tally:
    clean: int = 0
    divergences: int = 0
    errors: int = 0
    failing: int = 0  # failed runs since the last completed one


def matched_steps(result: RunResult) -> int:
    """Steps of a whole run that matched the golden run: those before its first difference."""
    if not result.completed:
        return 0
    return (result.first_diff_step or result.steps) - 1 if result.diverged else result.steps


def mask_name(mask: Mask, edge_ids: Sequence[str]) -> str:
    """A preset name where one fits, else the enabled (or disabled) run of edges."""
    name = describe(mask, edge_ids)
    if not name.endswith(" on"):
        return name
    on = [i for i, e in enumerate(edge_ids) if e in mask]
    off = [i for i, e in enumerate(edge_ids) if e not in mask]
    for word, idx in ((KEEP_ONLY, on), (DROP_ONLY, off)):
        if idx[-1] - idx[0] + 1 == len(idx):
            return f"{word} {edge_ids[idx[0]]} .. {edge_ids[idx[-1]]} ({len(idx)} edges)"
    return name


class RunLog:
    """Proposed and finished runs of one search, and the queries over them."""

    def __init__(self, edge_ids: Sequence[str], *, steps_per_run: int | None, max_errors: int) -> None:
        self.edge_ids = list(edge_ids)
        self._index = {e: i for i, e in enumerate(self.edge_ids)}
        self.steps_per_run = steps_per_run
        self.max_errors = max_errors
        self.all_on: Mask = frozenset(self.edge_ids)
        self.all_off: Mask = frozenset()
        self.history: list[tuple[Mask, RunResult]] = []
        self.blocks: list[Block] = []
        self.in_flight: list[Ask] = []  # proposed runs not yet recorded, oldest first
        self.runs_used = 0  # trials: runs of one mask, or segments of a run (segments.py)
        self.steps_used = 0
        self.used = 0.0  # trials in shares of a full run (Ask.share): what the budget counts
        self.startups = 0  # training runs launched for the search's trials
        self.earlier = 0  # runs of earlier commands taken as evidence (reuse), not runs of this search
        # Runs of an earlier search of the same command taken as evidence (causes.py): (run, mask, result).
        self.earlier_runs: list[tuple[int, Mask, RunResult]] = []
        self.numbered_from = 0  # runs of the command before this search's first (causes.py)
        self.graph_ids = self.edge_ids  # what a mask is named against: the whole graph's edges
        self.golden_steps = 0  # the golden run's steps (Bisection.golden)
        self.golden_matched = 0  # its first steps that some run compared with it matched
        self._tally: dict[Mask, Tally] = {}
        self._clean: list[tuple[np.ndarray, float]] = []
        self._diverged: list[np.ndarray] = []
        self.core = np.ones(len(self.edge_ids), dtype=bool)

    # -- writing ------------------------------------------------------------------------
    def propose(self, ask: Ask) -> None:
        self.in_flight.append(ask)

    def take_in_flight(self, mask: Mask) -> Ask | None:
        """The oldest proposed run of mask, no longer in flight (None: there was none)."""
        for i, ask in enumerate(self.in_flight):
            if ask.mask == mask:
                return self.in_flight.pop(i)
        return None

    def record(self, mask: Mask, result: RunResult, ask: Ask | None) -> None:
        """One finished run of mask, for the stage of `ask` (None: a run nobody asked for)."""
        self.history.append((mask, result))
        self.runs_used += 1
        self.used += ask.share if ask else 1.0
        self.steps_used += result.steps
        block = self._block_for(mask, ask)
        block.runs += 1
        tally = self._tally.setdefault(mask, Tally())
        tally.failing = 0 if result.completed else tally.failing + 1
        if not result.completed:
            tally.errors += 1
            block.errors += 1
            return
        if result.diverged:
            block.divergences += 1
            block.first_diff_steps.append(result.first_diff_step or result.steps)
            if block.diverged_at is None:
                block.diverged_at = block.runs
        self._observe(mask, result, tally, core=not (ask and ask.stage == DROP_ONLY))

    def reuse(self, mask: Mask, result: RunResult, run: int | None = None) -> None:
        """A completed run of an earlier command (an all-off run of the same experiment,
        compared with the same golden run), or of an earlier search of this command (`run`:
        its number there): evidence like a run of this search, but not one of its runs (no
        block, no run or step counted, no place in history)."""
        self.earlier += 1
        if run is not None:
            self.earlier_runs.append((run, mask, result))
        self._observe(mask, result, self._tally.setdefault(mask, Tally()), core=True)

    def _observe(self, mask: Mask, result: RunResult, tally: Tally, *, core: bool) -> None:
        enabled = self.enabled(mask)
        if result.diverged:
            tally.divergences += 1
            self._diverged.append(enabled)
            if core:
                self.core &= enabled
        else:
            tally.clean += 1
            self._clean.append((enabled, self.fraction(result)))

    def _block_for(self, mask: Mask, ask: Ask | None) -> Block:
        stage = ask.stage if ask else STAGE_EXTRA
        last = self.blocks[-1] if self.blocks else None
        if last is not None and last.stage == stage and last.enabled == mask:
            return last
        block = Block(stage, mask_name(mask, self.graph_ids), len(mask), self.numbered_from + self.runs_used,
                      enabled=mask, target=ask.target if ask else (), context=ask.context if ask else None)
        self.blocks.append(block)
        return block

    def match_golden(self, steps: int) -> None:
        """A run matched the golden run through this step (matched_steps)."""
        self.golden_matched = max(self.golden_matched, steps)

    def golden_runs(self) -> float:
        """The golden run as a clean all-off run, in runs: the steps of it some run matched.
        It is one more all-off run, and a run that matched it through step m shows that it
        had not drifted by step m (drift at step g would make every run differ by step g)."""
        if not self.steps_per_run:
            return 0.0
        return min(self.golden_steps, self.golden_matched) / self.steps_per_run

    # -- masks ------------------------------------------------------------------------
    def enabled(self, mask: Mask) -> np.ndarray:
        enabled = np.zeros(len(self.edge_ids), dtype=bool)
        enabled[[self._index[e] for e in mask]] = True
        return enabled

    def keep_only(self, edges: Sequence[int]) -> Mask:
        return frozenset(self.edge_ids[i] for i in edges)

    def drop_only(self, edges: Sequence[int]) -> Mask:
        return self.all_on - self.keep_only(edges)

    def ids(self, edges: Sequence[int]) -> tuple[str, ...]:
        return tuple(self.edge_ids[i] for i in sorted(edges))

    def ask(self, mask: Mask, stage: str, target: Sequence[int] = (), context: str | None = None) -> Ask:
        return Ask(mask, stage, self.ids(target), context)

    def fraction(self, result: RunResult) -> float:
        """How much of a full run a clean run covered (1 when the run length is unknown)."""
        if result.diverged or not self.steps_per_run:
            return 1.0
        return min(1.0, result.steps / self.steps_per_run)

    # -- queries ------------------------------------------------------------------------
    def tally(self, mask: Mask) -> Tally:
        return self._tally.get(mask, Tally())

    def unresolved(self, mask: Mask) -> bool:
        """The mask failed max_errors times in a row: it is not asked again."""
        return self.tally(mask).failing >= self.max_errors

    def in_flight_of(self, mask: Mask) -> int:
        return sum(1 for ask in self.in_flight if ask.mask == mask)

    @property
    def started(self) -> float:
        """Trials finished or in flight, in shares of a full run."""
        return self.used + sum(ask.share for ask in self.in_flight)

    def core_edges(self) -> tuple[int, ...]:
        return tuple(int(i) for i in np.flatnonzero(self.core))

    def clean_matrix(self) -> tuple[np.ndarray, np.ndarray]:
        """Every clean run's enabled edges (a row each) and the share of a run it covered."""
        if not self._clean:
            return np.zeros((0, len(self.edge_ids)), dtype=bool), np.zeros(0)
        return np.array([e for e, _ in self._clean]), np.array([f for _, f in self._clean])

    def diverged_enabling(self, edges: Sequence[int]) -> int:
        """Diverged runs that enabled every edge of the set."""
        return sum(1 for enabled in self._diverged if enabled[list(edges)].all())

    def covering(self, mask: Mask) -> list[RunResult]:
        """Completed runs whose mask enabled every edge of `mask`."""
        return [r for m, r in self.history if r.completed and mask <= m]

    def first_divergence(self, mask: Mask) -> tuple[int, RunResult]:
        """The first diverged run of exactly this mask: (1-based run number in the command, result);
        an earlier search's run (causes.py) where this search ran none."""
        own = [(self.numbered_from + i + 1, m, r) for i, (m, r) in enumerate(self.history)]
        return next((n, r) for n, m, r in self.earlier_runs + own if m == mask and r.diverged)

    def clean_with_without(self, rest: set[str], edge: str) -> int:
        """Clean runs that enabled every edge of `rest` but not `edge`."""
        return sum(1 for m, r in self.history
                   if r.completed and not r.diverged and rest <= m and edge not in m)

    def clean_runs_of(self, stage: str, mask: Mask) -> int:
        """Clean runs of blocks of this stage and mask."""
        return sum(b.runs - b.errors - b.divergences for b in self.blocks
                   if b.stage == stage and b.enabled == mask)


def clean_without(edges: Sequence[int], left_out: Sequence[int], matrix: np.ndarray,
                  fractions: np.ndarray) -> float:
    """Clean runs (as shares of a run) that enabled the set but none of `left_out`."""
    rest = [i for i in edges if i not in left_out]
    hits = matrix[:, rest].all(axis=1) & ~matrix[:, list(left_out)].any(axis=1)
    return float(fractions[hits].sum())
