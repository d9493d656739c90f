"""The plain delta-debugging baseline the benchmarks compare against (benchmarks/ddmin.py)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.ddmin import DeltaDebugger, split


def run_ddmin(items, fails):
    dd = DeltaDebugger(items)
    tests = 0
    while dd.test is not None:
        dd.report(fails(set(dd.test)))
        tests += 1
    return set(dd.current), tests


def test_split_covers_items_in_order():
    assert split(list(range(7)), 3) == [(0, 1, 2), (3, 4), (5, 6)]
    assert split([1, 2], 5) == [(1,), (2,)]


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 24).flatmap(lambda n: st.tuples(st.just(n), st.sets(st.integers(0, n - 1), min_size=1, max_size=3))))
def test_ddmin_finds_the_set_needed_together(case):
    n, needed = case
    found, _ = run_ddmin(range(n), lambda subset: needed <= subset)
    assert found == needed


def test_ddmin_result_is_one_minimal_when_several_sets_fail():
    # Fails if it holds {1, 2} or {5}: any answer must fail and lose that by dropping any element.
    def fails(subset):
        return {1, 2} <= subset or 5 in subset

    found, _ = run_ddmin(range(8), fails)
    assert fails(found)
    assert all(not fails(found - {x}) for x in found)


def test_ddmin_single_culprit_takes_about_log_tests():
    found, tests = run_ddmin(range(64), lambda subset: 37 in subset)
    assert found == {37}
    assert tests <= 2 * 6
