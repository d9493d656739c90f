"""A plan's schedule of masks by training step: the plan file.

The plan may carry ``schedule: [{"first_step", "mask"}, ...]``: the plan's checks and the
orchestrator's writer.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bisect_prefetch.adapters.plan import PlanError, parse_plan, plan_hash
from bisect_prefetch.experiment import Experiment
from bisect_prefetch.runs.plan import build_plan, write_plan

# all-on for steps 1-2, all-off for steps 3-4, one edge from step 5
SCHEDULE = [{"first_step": 1, "mask": ["a", "b"]}, {"first_step": 3, "mask": []},
            {"first_step": 5, "mask": ["b"]}]


def plan_dict(out_dir: Path | None = None, **fields) -> dict:
    plan = {"version": 1, "experiment": "t", "run_id": "r", "mask": ["a", "b"],
            "guard": "none", "schedule": SCHEDULE}
    if out_dir is not None:
        plan["out_dir"] = str(out_dir)
    plan.update(fields)
    return plan


# -- the plan file ------------------------------------------------------------------------
def test_a_schedule_gives_each_step_its_segments_mask():
    plan = parse_plan(plan_dict())
    on, off, one = frozenset({"a", "b"}), frozenset(), frozenset({"b"})
    assert plan.schedule == ((1, on), (3, off), (5, one))
    assert plan.mask == on  # a reader of mask sees step 1
    assert [plan.mask_for_step(step) for step in range(1, 8)] == [on, on, off, off, one, one, one]
    assert [plan.segment_for_step(step) for step in (0, 1, 2, 3, 4, 5, 99)] == [0, 0, 0, 1, 1, 2, 2]
    assert plan.allows("a")  # step 1's mask
    plain = parse_plan(plan_dict(schedule=None))
    assert plain.schedule is None and plain.segment_for_step(3) is None
    assert plain.mask_for_step(3) == on
    unset = plan_dict()
    del unset["schedule"]
    assert parse_plan(unset).schedule is None  # the key is optional
    assert plan.hash != plain.hash  # ranks on different schedules disagree on the plan


def _segment(first_step, mask=()) -> dict:
    return {"first_step": first_step, "mask": list(mask)}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"schedule": "a"}, "plan schedule must be null or a non-empty list"),
        ({"schedule": []}, "plan schedule must be null or a non-empty list"),
        ({"schedule": [[1, ["a"]]]}, r"plan schedule\[0\] must be an object with first_step and mask"),
        ({"schedule": [{**_segment(1), "until": 3}]},
         r"plan schedule\[0\] must be an object with first_step and mask, nothing else"),
        ({"schedule": [{"mask": []}]}, r"plan schedule\[0\] must be an object"),
        ({"schedule": [_segment(0)]}, r"plan schedule\[0\]\.first_step must be an integer >= 1, got 0"),
        ({"schedule": [_segment(True)]}, r"schedule\[0\]\.first_step must be an integer >= 1, got True"),
        ({"schedule": [_segment(1.0)]}, r"schedule\[0\]\.first_step must be an integer >= 1, got 1\.0"),
        ({"schedule": [_segment(2)]}, r"plan schedule\[0\]\.first_step must be 1 .*got 2"),
        ({"schedule": [_segment(1), _segment(3), _segment(3)]},
         r"plan schedule\[2\]\.first_step must be greater than schedule\[1\]\.first_step \(3\), got 3"),
        ({"schedule": [_segment(1), _segment(5), _segment(4)]},
         r"schedule\[2\]\.first_step must be greater than schedule\[1\]\.first_step \(5\), got 4"),
        ({"schedule": [_segment(1), {"first_step": 2, "mask": "a"}]},
         r"plan schedule\[1\]\.mask must be a list of edge ids"),
        ({"schedule": [_segment(1), {"first_step": 2, "mask": [1]}]},
         r"plan schedule\[1\]\.mask must be a list of edge ids"),
        ({"mask": ["a"]}, r"plan mask must equal schedule\[0\]\.mask when a schedule is set"),
        ({"mask": None}, r"plan mask must equal schedule\[0\]\.mask when a schedule is set"),
    ],
)
def test_each_bad_schedule_is_one_plan_error_that_names_it(fields, message):
    # The schedule is checked before the plan's mask is held against its first segment.
    with pytest.raises(PlanError, match=message):
        parse_plan(plan_dict(**fields))


def test_the_orchestrator_writes_the_schedule_with_sorted_masks(tmp_path):
    experiment = Experiment(name="x", command=["true"])
    schedule = [(1, frozenset({"b", "a"})), (3, frozenset()), (5, frozenset({"b"}))]
    plan = build_plan(experiment=experiment, run_id="r", out_dir=tmp_path, mask=None,
                      guard="none", steps=6, schedule=schedule)
    assert plan["mask"] == ["a", "b"]  # the first segment's
    assert plan["schedule"] == SCHEDULE
    read = parse_plan(json.loads(write_plan(tmp_path, plan).read_text()))
    assert read.schedule == tuple(schedule) and read.hash == plan_hash(plan)
    same = build_plan(experiment=experiment, run_id="r", out_dir=tmp_path,
                      mask=frozenset({"a", "b"}), guard="none", steps=6, schedule=schedule)
    assert same == plan
    # Without a schedule the plan has no key for it: earlier plans keep their hashes.
    plain = build_plan(experiment=experiment, run_id="r", out_dir=tmp_path, mask=None,
                       guard="none", steps=6)
    assert "schedule" not in plain
    with pytest.raises(PlanError, match="first segment's mask"):
        build_plan(experiment=experiment, run_id="r", out_dir=tmp_path, mask=frozenset({"a"}),
                   guard="none", steps=6, schedule=schedule)
    with pytest.raises(PlanError, match=r"schedule\[0\]\.first_step must be 1"):
        build_plan(experiment=experiment, run_id="r", out_dir=tmp_path, mask=None,
                   guard="none", steps=6, schedule=[(2, frozenset())])
    with pytest.raises(PlanError, match="at least one segment"):
        build_plan(experiment=experiment, run_id="r", out_dir=tmp_path, mask=None,
                   guard="none", steps=6, schedule=[])
