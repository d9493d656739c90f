import numpy as np
import pytest

from bisect_prefetch.search.posterior import Q_PRIOR, SECOND_CAUSE, EdgePosterior, _run_sums
from bisect_prefetch.search.stats import log_beta


def mask(n, on):
    enabled = np.zeros(n, dtype=bool)
    enabled[list(on)] = True
    return enabled


def total(p):
    return p.none + p.single.sum() + p.pair.sum()


def test_a_divergence_rules_out_every_set_its_mask_did_not_enable():
    post = EdgePosterior(5)
    post.observe(mask(5, [1, 2]), diverged=True)
    p = post.probabilities()
    assert total(p) == pytest.approx(1.0)
    assert list(np.flatnonzero(p.single)) == [1, 2]
    assert list(zip(*np.nonzero(p.pair), strict=True)) == [(1, 2)]
    assert p.none > 0  # drift without prefetch diverges under any mask


def test_a_clean_run_only_lowers_the_sets_it_enabled():
    post = EdgePosterior(4)
    post.observe(mask(4, range(4)), diverged=True)
    post.observe(mask(4, [0]), diverged=False)
    p = post.probabilities()
    assert p.single[0] < p.single[1] == pytest.approx(p.single[2])
    assert p.pair[0, 1] == pytest.approx(p.pair[2, 3])  # a pair needs both: {0} alone was no test


def test_divergence_enabling_a_ruled_out_edge_only_strikes():
    post = EdgePosterior(4)
    post.observe(mask(4, [0, 1]), diverged=True)  # rules out 2 and 3
    post.observe(mask(4, [1, 2, 3]), diverged=True)  # enables ruled-out edges: a second cause?
    p = post.probabilities()
    assert p.single[0] > 0
    # Edge 1 explains two divergences, edge 0 one plus a strike (Beta(1, 3) prior on q).
    a, b = Q_PRIOR
    expected = SECOND_CAUSE * np.exp(log_beta(a + 1, b) - log_beta(a + 2, b))
    assert p.single[0] / p.single[1] == pytest.approx(float(expected))


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
    q = np.linspace(1e-6, 1 - 1e-6, 200_001)
    density = q ** d * (1 - q) ** (e + 2)  # Beta(1 + d, 3 + e)
    density /= density.sum()
    for n in (0, 1, 5):
        assert post.miss_chance((0,), n) == pytest.approx((density * (1 - q) ** n).sum(), rel=1e-4)


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
    post.observe(mask(6, [1, 2, 3, 4]), diverged=True)  # rules out 0 and 5
    ranked = post.ranked_tests(limit=50, pairs=pairs)
    assert [bits for bits, _ in ranked] == sorted((bits for bits, _ in ranked), reverse=True)
    for bits, enabled in ranked:
        assert not enabled[[0, 5]].any()  # ruled-out edges stay off
        assert bits == pytest.approx(post.information(enabled, pairs=pairs), abs=1e-12)
