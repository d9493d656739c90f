"""Background drift against the drift the causes leave: the judgement the search for every
cause (causes.py) makes between its rounds.

A later round must tell the drift the causes found left from drift without prefetch
(background drift), which would hit all-off runs as often as any other. These are the
figures it decides by: how often runs diverged, how many clean all-off runs would show
background drift as strong, whether the runs that left the leading set out diverged
clearly more often than all-off, and how many clean runs of drop-only of the union rule
out one more cause as strong as the weakest found.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from bisect_prefetch.search.checks import MIN_DROP_ONLY
from bisect_prefetch.search.evidence import DISJOINT_CAUSES
from bisect_prefetch.search.oracle import RunResult
from bisect_prefetch.search.posterior import CLEARLY_ABOVE
from bisect_prefetch.search.protocol import Bisection
from bisect_prefetch.search.stats import chance_below
from bisect_prefetch.search.verdict import SearchResult

# The most clean all-off runs a round asks for first (all_off_for): drift rarer than
# 1 in 8 runs takes more, and the round's own double check adds its background controls.
MAX_ALL_OFF = 24
# Narrowing waits until the runs that left the likeliest set out diverge more than twice
# as often as all-off with this chance (beyond_background). Simulated, one culprit beside
# background drift at 0.02 on 67 edges, 100 searches: accuracy 0.92 -> 0.95 (the one-cause
# search's), mean runs 111 -> 91; two causes beside it (14 edges) 0.93 -> 0.96; two causes
# alone 33 -> 35.5 median runs.
NARROW_BEYOND = 0.9


def all_off_for(drift: float | None, confidence: float) -> int:
    """Clean all-off runs that show background drift of this per-run chance with chance
    1 - alpha/2 (at most MAX_ALL_OFF)."""
    if drift is None:
        return 1
    needed = math.log((1 - confidence) / 2) / math.log(1 - min(max(drift, 0.02), 0.99))
    return min(MAX_ALL_OFF, math.ceil(needed))


def rate(runs: Sequence[RunResult]) -> float:
    """Per-run chance of drift these runs showed, under a uniform prior (not evidence.rate's
    Beta(1, 3), which pulls a rate seen in a few runs down and would ask for all-off runs
    against a background far weaker than the drift seen; the round's own checks, keep-only
    twice and its prior, stand against background drift)."""
    done = [r for r in runs if r.completed]
    return (1 + sum(bool(r.diverged) for r in done)) / (2 + len(done))


def share_diverged(runs: Sequence[RunResult]) -> float:
    return sum(bool(r.diverged) for r in runs) / len(runs)


def as_often_without_prefetch(off: Sequence[RunResult], on: Sequence[RunResult]) -> bool:
    """All-off runs diverged about as often as the runs that enabled edges (within
    CLEARLY_ABOVE): background drift explains those."""
    return bool(off) and share_diverged(off) * CLEARLY_ABOVE >= share_diverged(on)


def beyond_background(search: Bisection) -> bool:
    """Whether the runs that left the round's likeliest set out diverged clearly more often
    than all-off (the golden run's matched steps counted): one cause beside background
    drift explains them otherwise, and the round's own search absorbs that drift."""
    model = search.model
    top = model.top()  # none leading: every run that enabled an edge left no set out
    d_set, e_set = model.counts(top.edges) if top.kind != "none" else (0, 0.0)
    off = (model.off_divergences, model.off_exposure + search.log.golden_runs())
    without = (model.divergences - d_set - model.off_divergences,
               model.exposure - e_set - model.off_exposure)
    return chance_below(off, without, CLEARLY_ABOVE) >= NARROW_BEYOND


def is_background(result: SearchResult) -> bool:
    """The round's verdict read the drift it saw as background drift."""
    return any(f.kind == "background" for f in result.facts)


def weakest(strengths: Sequence[float]) -> float:
    """The weakest cause's per-run chance (Evidence.strength): what a further cause must reach."""
    return max(0.02, min(strengths))


def peel_runs(confidence: float, strengths: Sequence[float]) -> int:
    """Clean runs of drop-only of the union that rule out a further cause as strong as the
    weakest found, at half the error budget (DISJOINT_CAUSES: the prior of one more)."""
    miss = (1 - confidence) / 2 / DISJOINT_CAUSES
    needed = math.log(miss) / math.log(1 - min(weakest(strengths), 0.99)) if miss < 1 else 0
    return max(MIN_DROP_ONLY, math.ceil(needed))
