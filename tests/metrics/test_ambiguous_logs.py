"""Logs that could be read two ways are never read one way silently: a step printed twice
with different values is an error naming it, a jsonl line without a rank where the others
name theirs is no line of rank 0, and runs that printed a metric at different precisions
are compared at the coarser one."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.metrics.compare import compare_trajectories, earliest
from bisect_prefetch.metrics.loading import load_files, parse_file
from bisect_prefetch.metrics.precision import at_decimals, coarser_decimals, printed_precision


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_step_printed_twice_with_different_values_is_an_error_naming_it(tmp_path):
    log = _jsonl(tmp_path / "metrics.jsonl", [
        {"step": 1, "loss": 1.0}, {"step": 2, "loss": 2.0}, {"step": 2, "loss": 2.5},
        {"step": 3, "loss": 3.0}])
    with pytest.raises(BisectPrefetchError, match=r"step 2 of loss \(rank 0\) is printed 2 times "
                                                  r"with different values \(2.0, 2.5\)"):
        load_files([log], "jsonl", names=["loss"])


def test_a_step_printed_twice_alike_and_interleaved_ranks_are_no_error(tmp_path):
    again = _jsonl(tmp_path / "again.jsonl", [{"step": 1, "loss": 1.0}, {"step": 1, "loss": 1.0},
                                              {"step": 2, "loss": 2.0}])
    assert parse_file(again, "jsonl").steps_repeated == 1
    # every step printed by two ranks that do not say theirs: the last value, said elsewhere
    both = _jsonl(tmp_path / "both.jsonl", [{"step": s, "loss": s + r / 10}
                                            for s in (1, 2) for r in (0, 1)])
    assert parse_file(both, "jsonl").steps_repeated == 2


def test_a_line_without_its_rank_is_said_not_taken_as_rank_0s(tmp_path):
    log = _jsonl(tmp_path / "metrics.jsonl", [
        {"step": 1, "rank": 0, "loss": 1.0}, {"step": 1, "rank": 1, "loss": 1.0},
        {"step": 2, "rank": 0, "loss": 2.0}, {"step": 2, "loss": 9.0}])
    result = parse_file(log, "jsonl")
    assert dict(result.series[0]["loss"]) == {1: 1.0, 2: 2.0}
    assert dict(result.series[1]["loss"]) == {1: 1.0}  # rank 1's step 2 is missing, not moved
    assert result.lines_unread == 1
    assert "no rank field where other lines name theirs" in result.unread_samples[0][1]
    # A log where no line names its rank is rank 0's, as before.
    plain = _jsonl(tmp_path / "plain.jsonl", [{"step": 1, "loss": 1.0}])
    assert dict(parse_file(plain, "jsonl").series[0]["loss"]) == {1: 1.0}


def test_runs_printed_at_different_precisions_are_compared_at_the_coarser(tmp_path):
    values = [1.23456789012345, 2.34567890123456, 3.45678901234567]
    coarse = tmp_path / "a.jsonl"
    coarse.write_text("".join(f'{{"step": {s}, "loss": {v:.4f}}}\n' for s, v in enumerate(values, 1)))
    fine = _jsonl(tmp_path / "b.jsonl", [{"step": s, "loss": v} for s, v in enumerate(values, 1)])
    a, b = (load_files([p], "jsonl", names=["loss"]) for p in (coarse, fine))
    assert earliest(compare_trajectories(a, b, ["loss"])) is not None  # raw: differs at step 1
    decimals = coarser_decimals(printed_precision([coarse], "jsonl", ["loss"]),
                                printed_precision([fine], "jsonl", ["loss"]))
    assert decimals == {"loss": 4}
    assert earliest(compare_trajectories(at_decimals(a, decimals), at_decimals(b, decimals),
                                         ["loss"])) is None
    assert np.array_equal(at_decimals(b, decimals)["loss"].values, a["loss"].values)
