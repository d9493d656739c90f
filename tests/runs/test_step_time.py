"""Step time per run and per mask (judge/step_time.py) and the order log's bounds (a real run's step
times: tests/e2e/test_aa_on_real_fsdp2.py)."""

from __future__ import annotations

import json

import pytest

from bisect_prefetch.adapters.order import OrderLog
from bisect_prefetch.judge.step_time import (
    compare_runs,
    describe_cost,
    fix_cost_line,
    fix_costs,
    group_cost,
    mask_costs,
    run_step_time_ms,
)


def write_probe(run_dir, rank: int, seconds: list[float]) -> None:
    steps = [[i + 1, s] for i, s in enumerate(seconds)]
    (run_dir / f"probe.rank{rank}.json").write_text(json.dumps({"rank": rank,
                                                                "step_seconds": steps}))


def test_run_step_time_is_the_slowest_ranks_median_after_warm_up(tmp_path):
    write_probe(tmp_path, 0, [9.0, 5.0, 0.010, 0.012, 0.011, 0.030])
    write_probe(tmp_path, 1, [9.0, 5.0, 0.020, 0.010, 0.011, 0.010])
    # per step max: 0.020, 0.012, 0.011, 0.030 -> median 0.016
    assert run_step_time_ms(tmp_path) == pytest.approx(16.0)


def test_no_step_time_without_steps_past_warm_up(tmp_path):
    assert run_step_time_ms(tmp_path) is None
    write_probe(tmp_path, 0, [1.0, 1.0])
    assert run_step_time_ms(tmp_path) is None


def test_mask_costs_against_all_on_with_spread():
    costs = mask_costs({"all-on": [10.0, 11.0, 12.0], "all-off": [12.0, None, 13.2],
                        "x": [None]})
    assert costs["all-on"]["ratio"] == 1.0
    off = costs["all-off"]
    assert (off["median_ms"], off["runs"]) == (12.6, 2)
    assert off["ratio"] == pytest.approx(1.145, abs=1e-3)
    assert (off["ratio_min"], off["ratio_max"]) == (pytest.approx(12 / 11, abs=1e-4),
                                                    pytest.approx(1.2))
    assert "x" not in costs
    assert group_cost([None], 10.0) is None


def _timed(ms: float, last: int = 10, *, jitter: float = 0.0) -> list[list[float]]:
    """[step, ms] after warm-up, steps 3..last, each step ms (alternately +- jitter)."""
    return [[step, ms + (jitter if step % 2 else -jitter)] for step in range(3, last + 1)]


def test_fix_costs_from_the_journal():
    every = ["fwd:a->b", "bwd:b->a"]
    records = [
        {"variant": "search@f", "mask": every, "guard": "none", "step_times_ms": _timed(10.0)},
        {"variant": "search@f", "mask": None, "guard": "none", "step_times_ms": _timed(10.0)},
        {"variant": "search@f", "mask": ["fwd:a->b"], "guard": "none",
         "step_times_ms": _timed(11.0)},
        {"variant": "aa@f", "mask": every, "guard": "size-one", "step_times_ms": _timed(10.1)},
        {"variant": "search@other", "mask": ["fwd:a->b"], "guard": "none",
         "step_times_ms": _timed(99.0)},
    ]
    costs = fix_costs(records, edge_ids=every, fix=["bwd:b->a"], variant_suffix="@f")
    assert costs["drop"]["ratio"] == pytest.approx(1.1)
    assert costs["guard"]["ratio"] == pytest.approx(1.01)
    line = fix_cost_line(costs, ["bwd:b->a"])
    assert line.startswith("dropping bwd:b->a costs +10.0% step time")
    assert "; the size-one guard costs +1.0% step time" in line
    assert fix_cost_line(fix_costs([], edge_ids=every, fix=[]), []) is None


def test_a_cost_compares_runs_over_the_steps_they_all_ran():
    # make demo: all-on runs diverged and stopped at steps 4-19, their slow first steps
    # against whole clean runs: once "-39.5%". Over steps 3-6, which all ran: the same.
    slow_start = [[s, 100.0 if s < 8 else 60.0] for s in range(3, 31)]
    all_on = [slow_start[:4], slow_start[:17]]  # stopped at steps 6 and 19
    drop = [slow_start, slow_start]
    cost = compare_runs(all_on, drop)
    assert cost["steps"] == [3, 6] and cost["ratio"] == pytest.approx(1.0)
    assert "-39" not in describe_cost(cost)


def test_no_cost_figure_from_too_few_common_steps_or_within_the_spread():
    short = compare_runs([_timed(10.0, last=4)], [_timed(6.0)])
    assert short["ratio"] is None and short["meaningful"] is False
    assert describe_cost(short).startswith("no step time figure: the runs share 2 timed step(s)")
    # all-on runs 8-12 ms apart (a busier machine for some): a 5% difference says nothing.
    noisy = compare_runs([_timed(8.0), _timed(12.0)], [_timed(10.5), _timed(10.5)])
    assert noisy["meaningful"] is False
    assert describe_cost(noisy).startswith("no measurable difference in step time (+5.0% is "
                                           "within the runs' own spread")
    line = fix_cost_line({"drop": noisy, "guard": None}, ["bwd:b->a"])
    assert line.startswith("dropping bwd:b->a: no measurable difference")
    clear = compare_runs([_timed(10.0, jitter=0.1), _timed(10.2)], [_timed(13.0), _timed(13.1)])
    assert clear["meaningful"] is True and describe_cost(clear).startswith("+29.2% step time")


def test_no_cost_figure_from_runs_on_a_differently_busy_machine():
    # The same +29% between journal records, once with loads alike and once with the
    # dropped-edge runs on a machine three times as busy: then it says so, not a cost.
    def records(ms: float, load: float) -> list[dict]:
        return [{"step_times_ms": _timed(ms + k / 10), "load_avg": load} for k in range(2)]

    alike = compare_runs(records(10.0, 2.0), records(13.0, 2.4))
    assert alike["meaningful"] is True
    busier = compare_runs(records(10.0, 2.0), records(13.0, 6.0))
    assert busier["meaningful"] is False
    assert describe_cost(busier) == (
        "step time not comparable (+29.8%, but the machine was busier for these runs (1-minute "
        "load average 6.0) than for the runs they are compared with (2.0); steps 3-10 over 2 run(s))")


def test_order_log_keeps_only_the_first_steps():
    lines = []
    log = OrderLog(rank=3, steps=2, write=lines.append)
    for step in (1, 2, 3):
        event = log.begin_prefetch("fwd:a->b")
        if event is not None:
            event[2] = "issued"
        log.set_running_edge("fwd:a->b")
        log.unshard("b")
        log.set_running_edge(None)
        log.use("b", "fwd")
        log.reshard("b")
        log.end_step(step)
    assert len(lines) == 2 and not log.active
    first = json.loads(lines[0])
    assert first == {"step": 1, "rank": 3, "events": [["prefetch", "fwd:a->b", "issued"],
                                                      ["unshard", "b", "fwd:a->b"],
                                                      ["use", "b", "fwd"], ["reshard", "b"]]}
    assert log._events == []  # nothing kept after the last recorded step


def test_step_times_that_are_no_positive_number_time_nothing():
    assert compare_runs([[[3, 0.0], [4, -1.0], [5, float("nan")]]], [_timed(10.0)]) is None
    assert compare_runs([[["x", 1.0]], "junk", None], [_timed(10.0)]) is None
