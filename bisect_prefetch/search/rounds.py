"""The rounds of the search for every cause (causes.py): each one a one-cause search
(protocol.Bisection) over a shrinking set of edges, its universe.

A round starts with every earlier run its universe could have seen as evidence (a run
that enabled no edge outside it), so nothing is run twice. The first round searches
every edge; a peeled round every edge not yet named as a cause; a narrowed round the
edges of one diverged mask, when two diverged runs share no edge (`narrowing`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bisect_prefetch.search.background import (
    all_off_for,
    as_often_without_prefetch,
    beyond_background,
    rate,
)
from bisect_prefetch.search.evidence import DISJOINT_CAUSES
from bisect_prefetch.search.oracle import RunResult
from bisect_prefetch.search.posterior import sub_prior
from bisect_prefetch.search.protocol import Bisection
from bisect_prefetch.vocab import Mask

# Why a round searches where it does (Round.why; the notices say it).
EVERY_EDGE = "every-edge"  # the first round
PEELED = "peeled"  # every edge not yet a cause
NARROWED = "narrowed"  # the edges of one diverged mask
# Notices that say a round ended (the next one searches elsewhere).
ROUND_ENDED = ("narrowed", "cause-found", "narrowing-found-nothing")

# (run number, mask, result): every run of the search, in the order recorded.
Numbered = tuple[int, Mask, RunResult]


@dataclass
class Round:
    """One one-cause search over its universe (the edges it may enable)."""

    universe: Mask
    search: Bisection
    why: str  # EVERY_EDGE, PEELED or NARROWED (its universe is then the diverged mask)


@dataclass(frozen=True)
class Seen:
    """What a new round counts as evidence: earlier commands' runs, and this search's."""

    earlier: Sequence[tuple[Mask, RunResult]]
    history: Sequence[Numbered]
    golden_steps: int | None
    matched: int  # the steps of the golden run a run matched (segments)
    share: float  # of a run, for a trial (segments.py)


def open_round(universe: Mask, why: str, *, graph_ids: Sequence[str], used: int, max_runs: int | None,
               options: dict, seen: Seen, peel: int, drift: float | None,
               calibration_runs: int | None = None, suspects: Sequence[str] = ()) -> Round:
    """A new round over `universe`, its search numbering runs from `used`; drift: the per-run
    chance of the drift it looks for, which clean all-off runs must first rule out as
    background drift; peel: clean runs of drop-only of the union a peeled round needs."""
    ids = [e for e in graph_ids if e in universe]
    search = Bisection(ids, max_runs=None if max_runs is None else max(1, max_runs - used),
                       calibration_runs=calibration_runs, suspects=[s for s in suspects if s in universe],
                       **options, **_round_options(why, len(ids), len(graph_ids), peel),
                       all_off_first=all_off_for(drift, options["confidence"]))
    search.log.graph_ids = list(graph_ids)
    search.log.numbered_from = used
    for mask, result in seen.earlier:
        if mask <= universe:
            search.reuse(mask, result)
    for number, mask, result in seen.history:
        if result.completed and mask <= universe:
            search.reuse(mask, result, run=number)
    if seen.golden_steps is not None:
        search.golden(seen.golden_steps)
        search.log.match_golden(seen.matched)
    search.plan_trials(seen.share)
    return Round(universe, search, why)


def _round_options(why: str, edges: int, graph_edges: int, peel: int) -> dict:
    """A later round's search: each set keeps the prior it has in the whole graph (a peeled
    round's times DISJOINT_CAUSES, the chance of one more cause), the rest is "no cause
    here", which settles the round (the drift left is background drift); keep-only of
    its answer must diverge twice."""
    if why == EVERY_EDGE:
        return {"background_parity": True}
    share = DISJOINT_CAUSES if why == PEELED else 1.0
    return {"prior": sub_prior(edges, graph_edges, share), "none_settles": True,
            "none_after": peel if why == PEELED else 0, "keep_only_divergences": 2}


def narrowing(current: Round, history: Sequence[Numbered], set_aside: Sequence[Mask]) -> tuple[Mask, float] | None:
    """Diverged runs of this round that share no edge, while all-off diverged far less often
    than they did, and than the runs without the round's likeliest set: the smallest
    diverged mask to search inside (causes.py's docstring, 2), and the drift the masks that
    diverged without its edges showed (background drift that strong would show in all-off
    runs); None: not yet."""
    universe = current.universe
    runs = [(m, r) for _, m, r in history if r.completed and m <= universe]
    diverged = [m for m, r in runs if m and r.diverged]
    if len(diverged) < 2 or frozenset.intersection(*diverged):
        return None
    if as_often_without_prefetch([r for m, r in runs if not m], [r for m, r in runs if m]):
        return None  # background drift explains them
    if not beyond_background(current.search):
        return None
    candidates = [m for m in diverged if m != universe and m not in set_aside]
    if not candidates:
        return None
    within = min(candidates, key=len)
    shown = {m for m in diverged if not m & within}
    return within, rate([r for m, r in runs if m in shown])
