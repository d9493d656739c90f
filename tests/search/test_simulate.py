"""The simulated oracle (search/simulate.py): its culprit rule, background drift, failures, and each stream's own noise."""

import math

from bisect_prefetch.graph import from_policy
from bisect_prefetch.search.simulate import SimulatedOracle
from bisect_prefetch.search.stats import hazard_for_chance

EDGES = from_policy("fsdp2-chain", 4).edge_ids()
CULPRIT = "bwd:layers.2->layers.1"
STEPS = 40


def oracle(culprits=(CULPRIT,), *, q=0.3, seed=7, trial=0, **options):
    return SimulatedOracle(list(culprits), hazard=hazard_for_chance(q, STEPS), steps=STEPS,
                           seed=seed, trial=trial, **options)


def divergence_rate(o, mask, runs=3000):
    return sum(bool(o.run(mask).diverged) for _ in range(runs)) / runs


def test_runs_diverge_only_while_the_rule_holds_at_the_stated_chance():
    o = oracle(q=0.3)
    assert divergence_rate(o, frozenset(EDGES) - {CULPRIT}, runs=500) == 0.0
    rate = divergence_rate(o, frozenset([CULPRIT]))
    assert abs(rate - 0.3) < 4 * math.sqrt(0.3 * 0.7 / 3000)


def test_a_diverging_run_stops_at_its_first_difference():
    o = oracle(q=0.9)
    results = [o.run(frozenset([CULPRIT])) for _ in range(50)]
    diverged = [r for r in results if r.diverged]
    assert diverged
    for r in diverged:
        assert r.outcome == "stopped-early" and r.steps == r.first_diff_step <= STEPS
    for r in results:
        if not r.diverged:
            assert r.outcome == "ok" and r.steps == STEPS and r.first_diff_step is None


def test_a_set_needed_together_diverges_only_when_all_are_enabled():
    pair = ["fwd:layers.0->layers.1", CULPRIT]
    o = oracle(pair, q=0.6, together=True)
    assert divergence_rate(o, frozenset([pair[0]]), runs=300) == 0.0
    assert divergence_rate(o, frozenset([pair[1]]), runs=300) == 0.0
    assert divergence_rate(o, frozenset(pair), runs=300) > 0.4


def test_background_drift_reaches_all_off():
    o = oracle([], q=0.3, background=hazard_for_chance(0.5, STEPS))
    assert divergence_rate(o, frozenset(), runs=400) > 0.35


def test_failures_come_from_their_own_stream():
    o = oracle(error_rate=0.5)
    outcomes = [o.run(frozenset(EDGES)).outcome for _ in range(200)]
    assert 60 < outcomes.count("error") < 140


def test_each_culprit_meets_the_same_noise_whatever_else_runs():
    # The k-th run that enables the culprit first differs at the same step, so two
    # search policies that interleave other masks differently meet the same draws.
    first, second = oracle(seed=3), oracle(seed=3)
    plain = [first.run(frozenset([CULPRIT])) for _ in range(30)]
    other = frozenset(["fwd:layers.0->layers.1"])
    mixed = []
    for i in range(30):
        for _ in range(i % 3):
            second.run(other)
        mixed.append(second.run(frozenset(EDGES)))
    assert [r.first_diff_step for r in plain] == [r.first_diff_step for r in mixed]
    assert [r.first_diff_step for r in plain] != [
        r.first_diff_step for r in (oracle(seed=4).run(frozenset([CULPRIT])) for _ in range(30))
    ]
