"""The statistics the search states (search/stats.py): Clopper-Pearson bounds, clean-run counts."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.search.stats import (
    binary_entropy,
    binomial_at_least,
    chance_below,
    clopper_pearson,
    error_share,
    hazard_estimate,
    hazard_for_chance,
    log_beta,
    log_gamma,
    per_run_chance,
    runs_for_clean_verdict,
    upper_bound_none_seen,
    z_channel_capacity,
)


def test_clopper_pearson_matches_published_values():
    # 3 of 10 at 95%: the textbook exact interval is 0.0667 to 0.6525.
    low, high = clopper_pearson(3, 10, 0.95)
    assert low == pytest.approx(0.0667, abs=5e-4)
    assert high == pytest.approx(0.6525, abs=5e-4)


def test_clopper_pearson_ends_have_closed_forms():
    # k = 0: the upper end solves (1-p)^n = alpha/2; k = n: the lower end solves p^n = alpha/2.
    assert clopper_pearson(0, 10)[0] == 0.0
    assert clopper_pearson(0, 10)[1] == pytest.approx(1 - 0.025 ** (1 / 10), abs=1e-9)
    assert clopper_pearson(10, 10)[0] == pytest.approx(0.025 ** (1 / 10), abs=1e-9)
    assert clopper_pearson(10, 10)[1] == 1.0
    assert clopper_pearson(0, 0) == (0.0, 1.0)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 60).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
def test_clopper_pearson_brackets_the_estimate_with_the_stated_tails(kn):
    k, n = kn
    low, high = clopper_pearson(k, n, 0.9)
    assert low <= k / n <= high
    if k > 0:
        assert binomial_at_least(k, n, low) == pytest.approx(0.05, abs=1e-6)
    if k < n:
        assert 1 - binomial_at_least(k + 1, n, high) == pytest.approx(0.05, abs=1e-6)


def test_clopper_pearson_rejects_impossible_counts():
    with pytest.raises(BisectPrefetchError):
        clopper_pearson(5, 3)
    with pytest.raises(BisectPrefetchError):
        clopper_pearson(1, 3, confidence=1.5)


def test_runs_for_clean_verdict_is_the_smallest_sufficient_count():
    assert runs_for_clean_verdict(0.3, 0.05) == 9  # ln 0.05 / ln 0.7 = 8.4
    assert runs_for_clean_verdict(0.1, 0.05) == 29  # ln 0.05 / ln 0.9 = 28.4
    assert runs_for_clean_verdict(0.5, 0.25) == 2  # exactly 2: no rounding up past it


@settings(max_examples=60, deadline=None)
@given(st.floats(0.01, 0.95), st.floats(0.001, 0.5))
def test_runs_for_clean_verdict_bounds_the_miss_chance(q, alpha):
    n = runs_for_clean_verdict(q, alpha)
    assert (1 - q) ** n <= alpha * (1 + 1e-9)
    assert n == 1 or (1 - q) ** (n - 1) > alpha


def test_runs_for_clean_verdict_rejects_chances_outside_zero_one():
    for q, alpha in ((0.0, 0.05), (1.0, 0.05), (0.3, 0.0), (0.3, 1.0)):
        with pytest.raises(BisectPrefetchError):
            runs_for_clean_verdict(q, alpha)


def test_upper_bound_none_seen_is_about_three_over_n():
    bound = upper_bound_none_seen(100)
    assert (1 - bound) ** 100 == pytest.approx(0.05)
    assert bound == pytest.approx(3 / 100, rel=0.02)
    assert upper_bound_none_seen(0) == 1.0


def test_hazard_and_chance_round_trip():
    h = hazard_for_chance(0.3, 100)
    assert per_run_chance(h, 100) == pytest.approx(0.3)
    assert h == pytest.approx(1 - 0.7 ** 0.01)
    with pytest.raises(BisectPrefetchError):
        hazard_for_chance(0.3, 0)


def test_hazard_estimate_recovers_the_hazard_of_simulated_runs():
    rng = np.random.default_rng(4)
    hazard, steps = 0.02, 50
    first = rng.geometric(hazard, size=4000)
    diffs = [int(k) for k in first if k <= steps]
    clean = [steps] * int((first > steps).sum())
    assert hazard_estimate(diffs, clean) == pytest.approx(hazard, rel=0.06)
    assert hazard_estimate([], [50, 50]) is None


def test_error_shares_sum_to_the_budget():
    shares = [error_share(0.05, i) for i in range(1, 200)]
    assert sum(shares) == pytest.approx(0.05 * (1 - 1 / 200))
    assert all(a > b for a, b in zip(shares, shares[1:], strict=False))
    with pytest.raises(BisectPrefetchError):
        error_share(0.05, 0)


def test_log_gamma_matches_the_standard_library():
    xs = np.array([1e-3, 0.1, 0.5, 1.0, 2.5, 7.9, 8.0, 30.0, 1234.5])
    expected = np.array([math.lgamma(x) for x in xs])
    assert np.allclose(log_gamma(xs), expected, rtol=1e-10, atol=1e-10)
    assert float(log_gamma(4.0)) == pytest.approx(math.log(6))
    assert float(log_beta(2.0, 3.0)) == pytest.approx(math.log(1 / 12))


def test_binary_entropy():
    assert binary_entropy(0.5) == pytest.approx(1.0)
    assert binary_entropy(0.0) == pytest.approx(0.0, abs=1e-12)
    assert binary_entropy(1.0) == pytest.approx(0.0, abs=1e-12)
    assert binary_entropy(0.11) == pytest.approx(binary_entropy(0.89))


def test_z_channel_capacity_is_the_best_mutual_information_over_mask_shares():
    # A run enabling share m of the posterior: I = H(q m) - m H(q); its best over m.
    for q in (0.1, 0.3, 0.9):
        m = np.linspace(0.001, 1, 20000)
        best = float((binary_entropy(q * m) - m * binary_entropy(q)).max())
        assert z_channel_capacity(q) == pytest.approx(best, abs=1e-6)
    assert z_channel_capacity(0.3) == pytest.approx(0.177, abs=5e-4)
    assert z_channel_capacity(0.1) == pytest.approx(0.0548, abs=5e-4)


def test_chance_below_compares_two_per_run_chances():
    # The same counts: as likely above as below; clearly apart: near 0 or 1.
    assert chance_below((5, 5), (5, 5)) == pytest.approx(0.5, abs=0.01)
    assert chance_below((0, 20), (20, 0), 2.0) > 0.999
    assert chance_below((20, 0), (0, 20), 2.0) < 0.001
    # Half as often is harder to show than less often, and more runs show it better.
    assert chance_below((2, 8), (5, 5), 2.0) < chance_below((2, 8), (5, 5), 1.0)
    assert chance_below((4, 16), (10, 10), 2.0) > chance_below((2, 8), (5, 5), 2.0)
