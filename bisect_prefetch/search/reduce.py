"""Noise-aware delta debugging: a diverging set of edges reduced to a 1-minimal one.

For drift that needs three or more edges together, which the posterior's model
(none, one edge, a pair) cannot name. protocol.py switches here when that model
explains the runs worse than "some set of three or more, inside the edges every
diverged run enabled" does (`set_log_odds`), and only while all-off never
diverged.

With no background drift every diverged run enabled the whole culprit set, so it
lies inside the core: the edges every diverged run enabled. A test drops a chunk
X of the core, i.e. runs keep-only(core - X):
  - it diverges: X holds no needed edge; the core (an intersection) loses X;
  - it stays clean n times: X holds a needed edge, or an unneeded X was unlucky,
    with chance E[(1-q)^n], q the per-run chance of runs enabling the core
    (Beta(1, 3) prior, as the posterior's).
Chunks follow ddmin's granularity: the core split in graph order into g
contiguous chunks, g = 2, 4, 8, ... and last |core|, one edge each. A level is
done when every chunk has diverged or stayed clean enough: COARSE_MISS below the
last level (a chunk kept there by bad luck is split and tested again at the next),
and at the last level the member's share of the error budget, against the prior
odds of the set without it (`subset_odds`: the core keeps whichever edges every
diverged run happened to enable, so among many edges some unneeded one may have
had a run of luck). Then each edge's removal was shown to clear the drift: the
core is 1-minimal.

Pure: the state is the core and the clean runs so far, both from the journal.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from bisect_prefetch.search.posterior import Q_PRIOR
from bisect_prefetch.search.stats import log_beta

# Prior chance that three or more edges are needed together (beside the posterior's
# none, single and pair, which share the rest): as much as a pair's. A set of k edges
# gets 2^-(k-2) of it. In simulation 0.01 switched late (median run 187 on 67 edges, 15%
# of the searches ran out of runs first), 0.2 too often for one culprit at q = 0.1.
SET_PRIOR = 0.05
# A clean chunk below the last level may still be unneeded with this chance.
COARSE_MISS = 0.3

Chunk = tuple[int, ...]  # edge indices, in graph order


def log_evidence(divergences: float, clean):
    """log of the chance of these runs under a set every diverged run enabled:
    E[q^d (1-q)^e] over the Beta(1, 3) prior (clean may be an array)."""
    a, b = Q_PRIOR
    out = log_beta(a + divergences, b + np.asarray(clean, dtype=float)) - log_beta(a, b)
    return float(out) if np.ndim(out) == 0 else out


def miss_chance(divergences: float, clean: float, runs):
    """Chance that `runs` clean runs all miss drift as strong as the set's:
    E[(1-q)^runs] over q's posterior Beta(1 + d, 3 + e); runs may be an array."""
    a, b = Q_PRIOR[0] + divergences, Q_PRIOR[1] + clean
    out = np.exp(log_beta(a, b + np.asarray(runs, dtype=float)) - log_beta(a, b))
    return float(out) if np.ndim(out) == 0 else out


def runs_to_miss(divergences: float, clean: float, chance: float, limit: int = 1000) -> int:
    """Clean runs after which drift as strong as the core's hides with at most this chance."""
    n = 1
    while miss_chance(divergences, clean, n) > chance and n < limit:
        n += 1
    return n


def subset_odds(edges: int, size: int) -> float:
    """Prior odds of a set one edge smaller against a set of `size` edges (the size prior
    over the graph's `edges` edges): a member is shown needed only against these odds."""
    return 2.0 * (edges - size + 1) / size


def set_log_odds(core_size: int, edges: int, divergences: float, triple_clean,
                 model_log_evidence: float) -> float:
    """log odds of "a set of three or more edges needed together" against the posterior's
    model, for a core of `core_size` edges (every diverged run enabled them all).

    triple_clean: the clean runs that enabled each set of three inside the core (all
    C(core_size, 3) of them), or one number no set of three inside it falls below (the
    clean runs that enabled the whole core): then the odds are an upper bound. Sets of
    three count at their mean evidence; a larger set fits at most as well as the best
    set of three inside it (every run that enabled it enabled them).
    """
    if core_size < 3:
        return -math.inf
    logs = np.atleast_1d(log_evidence(divergences, np.asarray(triple_clean, dtype=float)))
    best = float(logs.max())
    mean = best + math.log(float(np.mean(np.exp(logs - best))))
    terms = [math.log(0.5) + _log_choose(core_size, 3) - _log_choose(edges, 3) + mean]
    terms += [-(k - 2) * math.log(2) + _log_choose(core_size, k) - _log_choose(edges, k) + best
              for k in range(4, core_size + 1)]
    top = max(terms)
    inside = top + math.log(sum(math.exp(t - top) for t in terms))
    return math.log(SET_PRIOR) + inside - math.log(1 - SET_PRIOR) - model_log_evidence


def _log_choose(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def levels(size: int) -> list[int]:
    """ddmin's granularities for a core of this size: 2, 4, 8, ... then one edge a chunk."""
    out, g = [], 2
    while g < size:
        out.append(g)
        g *= 2
    return out + [size]


def chunks(core: Sequence[int], g: int) -> list[Chunk]:
    """The core (in graph order) in g contiguous chunks of near-equal size."""
    bounds = np.linspace(0, len(core), g + 1).round().astype(int)
    return [tuple(core[lo:hi]) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True) if hi > lo]


@dataclass(frozen=True)
class Drop:
    """The chunk whose removal to test next, at this granularity (None: wait for runs in flight)."""

    chunk: Chunk | None
    granularity: int
    needed: int  # clean runs in all for this chunk's test


def next_test(core: Sequence[int], clean_without: Callable[[Chunk], float],
              in_flight: Callable[[Chunk], int], needed_at: dict[int, int]) -> Drop | None:
    """The chunk to test next, or None when every level is done (the core is 1-minimal).

    clean_without(chunk): clean runs that enabled the rest of the core without the
    chunk; in_flight(chunk): such runs still running; needed_at[g]: the clean runs a
    chunk at granularity g needs. The chunk with the fewest runs goes first, so every
    chunk of a level gets its chance to diverge early.
    """
    for g in levels(len(core)):
        clean = {c: clean_without(c) for c in chunks(core, g)}
        open_chunks = [c for c, n in clean.items() if n < needed_at[g]]
        if not open_chunks:
            continue
        started = {c: clean[c] + in_flight(c) for c in open_chunks}
        chunk = min(open_chunks, key=started.get)
        if started[chunk] >= needed_at[g]:
            return Drop(None, g, needed_at[g])  # enough runs in flight: wait for them
        return Drop(chunk, g, needed_at[g])
    return None
