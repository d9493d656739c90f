"""The edge posterior (search/posterior.py): what clean and diverged runs say about each set."""

import numpy as np
import pytest

from bisect_prefetch.search.posterior import EdgePosterior, _run_sums


def mask(n, on):
    enabled = np.zeros(n, dtype=bool)
    enabled[list(on)] = True
    return enabled


def total(p):
    return p.none + p.single.sum() + p.pair.sum()


def test_a_divergence_all_but_rules_out_every_set_its_mask_did_not_enable():
    post = EdgePosterior(5)
    post.observe(mask(5, [1, 2]), diverged=True)
    p = post.probabilities()
    assert total(p) == pytest.approx(1.0)
    # Only background drift could explain it for the others: a small share.
    assert p.single[[0, 3, 4]].max() < 0.05 * p.single[[1, 2]].min()
    assert p.pair[1, 2] > 10 * p.pair[0, 3]
    assert p.none > 0  # drift without prefetch diverges under any mask


def test_a_clean_run_only_lowers_the_sets_it_enabled():
    post = EdgePosterior(4)
    post.observe(mask(4, range(4)), diverged=True)
    post.observe(mask(4, [0]), diverged=False)
    p = post.probabilities()
    assert p.single[0] < p.single[1] == pytest.approx(p.single[2])
    assert p.pair[0, 1] == pytest.approx(p.pair[2, 3])  # a pair needs both: {0} alone was no test


def test_all_off_divergences_move_the_posterior_to_drift_without_prefetch():
    post = EdgePosterior(6)
    post.observe(mask(6, range(6)), diverged=True)
    for diverged in (True, False, True, True, False, True):
        post.observe(mask(6, []), diverged=diverged)
    assert post.top().kind == "none" and post.top().probability > 0.9
    assert 0.3 < post.background() < 0.9


def test_a_culprit_clearly_above_the_background_stays_the_answer():
    post = EdgePosterior(6)
    for _ in range(6):
        post.observe(mask(6, [2]), diverged=True)
        post.observe(mask(6, [0, 1, 3, 4, 5]), diverged=False)
        post.observe(mask(6, []), diverged=False)
    post.observe(mask(6, []), diverged=True)  # one background divergence
    top = post.top()
    assert top.edges == (2,) and top.probability > 0.9
    assert post.background() < 0.2


def test_conditional_posterior_without_pairs():
    post = EdgePosterior(3)
    post.observe(mask(3, range(3)), diverged=True)
    c = post.conditional(pairs=False)
    assert not c.pair.any()
    assert c.none + c.single.sum() == pytest.approx(1.0)
    assert post.top(pairs=False).kind in ("single", "none")


def test_miss_chance_is_the_expected_clean_streak_of_the_posterior_chance():
    post = EdgePosterior(2)
    for diverged in (True, False, True, False, False):
        post.observe(mask(2, [0]), diverged=diverged)
    d, e = post.counts((0,))
    assert (d, e) == (2, 3)
    # Every run enabled edge 0: q follows about Beta(1 + d, 3 + e), a little lower where p0 > 0 takes a share.
    q = np.linspace(1e-6, 1 - 1e-6, 200_001)
    density = q ** d * (1 - q) ** (e + 2)
    density /= density.sum()
    for n in (0, 1, 5):
        assert post.miss_chance((0,), n) == pytest.approx((density * (1 - q) ** n).sum(), rel=0.2)
    many = post.miss_chance((0,), np.array([0, 1, 5]))
    assert many[0] == pytest.approx(1.0) and many[1] > many[2]


def test_runs_in_flight_count_for_planning_only():
    post = EdgePosterior(4)
    post.observe(mask(4, range(4)), diverged=True)
    plan = post.with_pending([(mask(4, [0, 1]), 1.0)])
    assert plan.probabilities().single[0] < post.probabilities().single[0]
    assert post.single_exposure.sum() == 0  # the real posterior did not move
    chance = post.divergence_chance(mask(4, [0, 1]))
    assert plan.single_exposure[0] == pytest.approx(1 - chance)


def test_run_sums_match_brute_force():
    rng = np.random.default_rng(2)
    k = 7
    single = rng.random(k)
    pair = np.triu(rng.random((k, k)), 1)
    starts, ends = np.triu_indices(k + 1, k=1)
    inside, outside = _run_sums(single, pair, starts, ends)
    for s, e, got_in, got_out in zip(starts, ends, inside, outside, strict=True):
        run = np.zeros(k, dtype=bool)
        run[s:e] = True
        for chosen, got in ((run, got_in), (~run, got_out)):
            expected = single[chosen].sum() + pair[np.outer(chosen, chosen)].sum()
            assert got == pytest.approx(expected)


@pytest.mark.parametrize("pairs", [True, False])
def test_ranked_tests_score_what_information_says(pairs):
    post = EdgePosterior(6)
    post.observe(mask(6, range(6)), diverged=True)
    post.observe(mask(6, [0, 1, 2]), diverged=False)
    for _ in range(3):
        post.observe(mask(6, [1, 2, 3, 4]), diverged=True)  # all but rules out 0 and 5
    for _ in range(12):
        post.observe(mask(6, []), diverged=False)  # and little background drift to explain it
    ranked = post.ranked_tests(limit=50, pairs=pairs)
    assert [bits for bits, _ in ranked] == sorted((bits for bits, _ in ranked), reverse=True)
    assert not post.alive[[0, 5]].any()
    for bits, enabled in ranked:
        assert not enabled[[0, 5]].any()  # ruled-out edges stay off
        assert bits == pytest.approx(post.information(enabled, pairs=pairs), abs=1e-12)
