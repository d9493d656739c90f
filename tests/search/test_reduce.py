"""Noise-aware ddmin (search/reduce.py): levels, chunks, the next test, and its statistics."""

import math

import numpy as np
import pytest

from bisect_prefetch.search import reduce
from bisect_prefetch.search.reduce import Drop, chunks, levels, next_test


def test_levels_double_then_end_at_one_edge_a_chunk():
    assert levels(67) == [2, 4, 8, 16, 32, 64, 67]
    assert levels(3) == [2, 3]
    assert levels(2) == [2]
    assert levels(1) == [1]


@pytest.mark.parametrize("size, g", [(7, 2), (7, 3), (10, 4), (5, 5), (67, 8)])
def test_chunks_cover_the_core_in_order(size, g):
    core = list(range(100, 100 + size))
    parts = chunks(core, g)
    assert len(parts) == g
    assert [i for part in parts for i in part] == core
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_next_test_works_through_the_levels():
    core = tuple(range(6))
    needed = {2: 3, 4: 3, 6: 10}
    clean: dict = {}

    def ask():
        return next_test(core, lambda c: clean.get(c, 0), lambda c: 0, needed)

    assert ask() == Drop((0, 1, 2), 2, 3)
    clean[(0, 1, 2)] = 3
    assert ask() == Drop((3, 4, 5), 2, 3)  # the chunk with fewer runs
    clean[(3, 4, 5)] = 3
    test = ask()
    assert test.granularity == 4 and test.needed == 3
    for part in chunks(core, 4):
        clean[part] = 3
    assert ask() == Drop((0,), 6, 10)  # the last level: one edge a chunk, more runs
    for i in core:
        clean[(i,)] = 10
    assert ask() is None  # every edge's removal stayed clean: 1-minimal


def test_next_test_waits_when_the_runs_in_flight_finish_the_level():
    core = (0, 1, 2)
    needed = {2: 2, 3: 5}
    flying = {(0, 1): 1, (2,): 2}  # chunks at g=2 are (0, 1) and (2,)
    test = next_test(core, lambda c: 1 if c == (0, 1) else 0, lambda c: flying.get(c, 0), needed)
    assert test == Drop(None, 2, 2)


def test_miss_chance_is_the_mean_of_one_minus_q_to_the_n_over_the_posterior():
    d, e, n = 4, 6, 9
    q = np.linspace(0, 1, 200001)[1:-1]
    density = q ** (1 + d - 1) * (1 - q) ** (3 + e - 1)
    expected = float(((1 - q) ** n * density).sum() / density.sum())
    assert reduce.miss_chance(d, e, n) == pytest.approx(expected, rel=1e-4)
    assert reduce.miss_chance(d, e, 0) == pytest.approx(1.0)
    runs = np.arange(0, 30)
    assert np.all(np.diff(reduce.miss_chance(d, e, runs)) < 0)


def test_runs_to_miss_is_the_first_count_under_the_chance():
    n = reduce.runs_to_miss(10, 20, 0.01)
    assert reduce.miss_chance(10, 20, n) <= 0.01 < reduce.miss_chance(10, 20, n - 1)


def test_set_odds_grow_as_the_model_explains_the_runs_worse():
    assert reduce.set_log_odds(2, 67, 5, 3, -10.0) == -math.inf
    base = reduce.set_log_odds(3, 67, 5, 3, -10.0)
    assert reduce.set_log_odds(3, 67, 5, 3, -20.0) == pytest.approx(base + 10.0)
    # More clean runs that enabled the whole core make it a worse explanation.
    assert reduce.set_log_odds(3, 67, 5, 10, -10.0) < base
    # A bigger core holds more sets: more prior mass inside it.
    assert reduce.set_log_odds(6, 67, 5, 3, -10.0) > base


def test_subset_odds_follow_the_size_prior():
    # 2^-(k-2) / C(n, k) per set of k edges: one edge fewer is 2 (n-k+1)/k times as likely.
    n, k = 67, 3
    per_set = {m: 2.0 ** -(m - 2) / math.comb(n, m) for m in (k - 1, k)}
    assert reduce.subset_odds(n, k) == pytest.approx(per_set[k - 1] / per_set[k])
