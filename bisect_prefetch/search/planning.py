"""Planning: the mask whose next run tells most about which set causes drift.

Candidates: runs of consecutive surviving edges in graph order (a phase, a
range of layers), their complements, and the k most probable edges (after a
hint), ranked by expected information under the one-sided channel
(posterior.ranked_tests). Near-best masks that read better or double as the
final check win: forward-off and backward-off, and drop-only of the leading
set (NEAR_BEST); keep-only of the leading set, whose divergence ends the
search, with KEEP_SHARE; all-off only when it is the best question outright
(background drift). Runs in flight count as the clean part of a run each is
expected to be, so slots ask different questions.
"""

from __future__ import annotations

import numpy as np

from bisect_prefetch.search.posterior import EdgePosterior, Hypothesis
from bisect_prefetch.search.runlog import RunLog
from bisect_prefetch.vocab import Mask

NEAR_BEST = 0.97
KEEP_SHARE = 0.95


def planning_model(model: EdgePosterior, log: RunLog) -> EdgePosterior:
    """The posterior with each run in flight counted as the clean part of a run it is expected to be."""
    if not log.in_flight:
        return model
    return model.with_pending([(log.enabled(ask.mask), ask.share) for ask in log.in_flight])


def most_informative(model: EdgePosterior, log: RunLog, top: Hypothesis, *, pairs: bool,
                     share: float = 1.0) -> Mask | None:
    """The best mask of the posterior's family for a trial of `share` of a run, or a
    near-best one; None: every one is unresolved."""
    model = planning_model(model, log)
    ranked = [
        (bits, log.keep_only(np.flatnonzero(enabled)))
        for bits, enabled in model.ranked_tests(limit=16, pairs=pairs, share=share)
    ]
    ranked = [(bits, mask) for bits, mask in ranked if not log.unresolved(mask)]
    if not ranked:
        return None
    best_bits, best = ranked[0]

    def bits_of(mask: Mask) -> float:
        return model.information(log.enabled(mask), pairs=pairs, share=share)

    alternatives = [log.all_off]
    if top.edges:
        keep = log.keep_only(top.edges)
        if (bits_of(keep) >= KEEP_SHARE * best_bits and not log.unresolved(keep)
                and not log.tally(keep).divergences):
            return keep
        alternatives.append(log.drop_only(top.edges))
    alive = model.alive
    for phase in ("fwd", "bwd"):
        split = alive & np.array([e.startswith(phase + ":") for e in log.edge_ids])
        if split.any() and split.sum() < alive.sum():
            alternatives.append(log.keep_only(np.flatnonzero(split)))
    threshold = NEAR_BEST * best_bits
    for mask in alternatives:
        bits = bits_of(mask)
        if mask == log.all_off:
            if bits > best_bits and not log.unresolved(mask):
                best_bits, best, threshold = bits, mask, NEAR_BEST * bits
            continue
        if bits >= threshold and not log.unresolved(mask):
            threshold, best = bits, mask
    return best
