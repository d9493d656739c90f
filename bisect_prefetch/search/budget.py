"""The run budget: max_runs, or by default BUDGET_FACTOR times the runs an ideal search needs.

An ideal search gains at most the capacity of the one-sided channel per run (a
Z-channel at the estimated q) and needs about log2(sets) + log2(1/alpha) bits;
the calibration comes on top, and the background controls at that q
(all_off_runs="auto"). q is the leading set's posterior mean, so the budget
follows what the runs show, but never below all-on's rate (Beta(1, 3) prior):
drift that no single set or pair explains (three edges needed together) leaves
every set's q low, and the budget must not grow with that. Once the reduce stage
began, at least what it needs (`reduce_budget`).
"""

from __future__ import annotations

import math

from bisect_prefetch.search.evidence import MEMBER_SHARE, Evidence, rate
from bisect_prefetch.search.reduce import COARSE_MISS, levels, subset_odds
from bisect_prefetch.search.stats import z_channel_capacity

# This many times the runs an ideal search needs at the estimated q, on top of the calibration.
BUDGET_FACTOR = 3.0
# Until a run diverges, the search's masks run after the first all-on, for this share
# of calibration_runs runs; all-on again after that (see Bisection._calibrate).
SEARCH_BEFORE_DRIFT = 0.5


def budget(ev: Evidence, reduce_from: tuple[int, int] | None) -> int:
    """The runs the search may use; reduce_from: (runs, core size) when the reduce stage began."""
    if ev.settings.max_runs is not None:
        return ev.settings.max_runs
    if reduce_from is not None:
        return max(search_budget(ev), reduce_budget(ev, reduce_from))
    return search_budget(ev)


def search_budget(ev: Evidence) -> int:
    model, settings = ev.model, ev.settings
    if model.divergences == 0:
        return math.ceil((1 + SEARCH_BEFORE_DRIFT) * settings.calibration_runs) + 1
    n = len(ev.log.edge_ids)
    q = min(max(model.culprit_chance(model.top().edges), ev.all_on_rate(), 0.02), 0.99)
    capacity = z_channel_capacity(q)
    bits = math.log2(n + n * (n - 1) / 2) + math.log2(1 / ev.alpha)
    controls = ev.controls_at(q) if settings.background_controls else 0
    return settings.calibration_runs + math.ceil(BUDGET_FACTOR * bits / capacity) + controls


def reduce_budget(ev: Evidence, reduce_from: tuple[int, int]) -> int:
    """The runs before the reduce stage began, and BUDGET_FACTOR times what ddmin needs
    at the core's rate: every coarse level twice, and a set of three at the last.

    The core's rate is the lower of all-on's and that of the runs that enabled the
    whole core (Beta(1, 3) prior each): one diverged all-on run says 0.4 whatever q is,
    and a budget cut to that runs out in the middle of a reduction at q = 0.1.
    """
    runs, core = reduce_from
    core_rate = rate(*ev.counts(ev.log.core_edges()))
    q = min(max(min(ev.all_on_rate(), core_rate), 0.02), 0.99)
    per_run = -math.log(1 - q)
    coarse = math.log(1 / COARSE_MISS) / per_run
    final = math.log(1 / (ev.alpha * MEMBER_SHARE / 3 / subset_odds(len(ev.log.edge_ids), 3))) / per_run
    needed = 2 * (len(levels(core)) - 1) * coarse + 3 * final
    controls = ev.controls_at(q) if ev.settings.background_controls else 0
    return runs + math.ceil(BUDGET_FACTOR * needed) + controls
