"""A plan's schedule of masks by training step: the plan file, and the switch at step boundaries.

The plan may carry ``schedule: [{"first_step", "mask"}, ...]``; the adapter's gate holds
step 1's mask and takes step s+1's when the step clock ends step s. Fast tests: the
plan's checks, the orchestrator's writer, and the session driven as the framework
adapters drive it (the gate, the clock's boundaries, ``report_step``). A user's FSDP2
script on 2 CPU ranks under a schedule: tests/e2e/test_schedule_on_a_users_job.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bisect_prefetch.adapters import Session
from bisect_prefetch.adapters.gate import Gate
from bisect_prefetch.adapters.plan import PlanError, parse_plan, plan_hash
from bisect_prefetch.experiment import Experiment
from bisect_prefetch.runs.plan import build_plan, write_plan
from tests.conftest import read_probe, step_outcomes

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
    assert [Gate(plan).mask_at(step) for step in range(1, 8)] == [on, on, off, off, one, one, one]
    assert [plan.segment_for_step(step) for step in (0, 1, 2, 3, 4, 5, 99)] == [0, 0, 0, 1, 1, 2, 2]
    assert Gate(plan).decide("a", 2) is None  # step 1's mask
    plain = parse_plan(plan_dict(schedule=None))
    assert plain.schedule is None and plain.segment_for_step(3) is None
    assert Gate(plain).mask_at(3) == on
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


# -- the session: the gate switches where the clock ends a step ----------------------------
def _prefetch_all(session: Session, edges=("a", "b")) -> None:
    for edge in edges:
        session.prefetch(edge, target_shard_size=2, target_module=None, run=lambda: True)


def test_the_gate_switches_masks_at_report_step_boundaries(tmp_path):
    session = Session(parse_plan(plan_dict(tmp_path)), 0)
    for step in range(1, 7):
        _prefetch_all(session)
        session.report_step(step, {"loss": 1.0})
    session.close()
    probe = read_probe(tmp_path)
    assert probe["step_source"] == "report" and probe["schedule_followed"] == [[0, 1], [1, 3], [2, 5]]
    expected = {1: {"a", "b"}, 2: {"a", "b"}, 3: set(), 4: set(), 5: {"b"}, 6: {"b"}}
    for step, outcomes in step_outcomes(probe).items():
        assert outcomes["issued"] == expected[step], step
        assert outcomes["masked"] == {"a", "b"} - expected[step], step
    # report_step calls are the boundaries here: the record says where the switches land.
    assert any("switches at the job's report_step calls" in note for note in probe["step_notes"])
    assert "schedule_refused" not in probe


def test_optimizer_boundaries_switch_before_the_next_forward_and_never_at_exit(tmp_path):
    """Driven as the FSDP2 adapter drives the clock: the root's forward begins, its backward
    ends, the optimizer steps (gradient accumulation: two forward/backward a step)."""
    schedule = [_segment(1, ["a", "b"]), _segment(2, []), _segment(3, ["a"]), _segment(4)]
    session = Session(parse_plan(plan_dict(tmp_path, schedule=schedule)), 0)
    clock = session.clock
    clock.optimizer_built = True  # an optimizer was constructed (adapters/optimizers.py)
    for _ in range(3):  # three steps; the job exits after the third update
        for _ in range(2):
            clock.forward_begins()  # the root's forward pre-hook: the step before ends here
            _prefetch_all(session)
            clock.backward_ends()
        clock.optimizer_begins(1)
        clock.optimizer_ends()
    session.close()  # the third step ends at exit: nothing switches, segment 3 never began
    probe = read_probe(tmp_path)
    assert probe["step_source"] == "optimizer" and probe["steps_counted"] == 3
    assert probe["schedule_followed"] == [[0, 1], [1, 2], [2, 3]]
    outcomes = step_outcomes(probe)
    assert [outcomes[s]["issued"] for s in (1, 2, 3)] == [{"a", "b"}, set(), {"a"}]
    assert [outcomes[s]["masked"] for s in (1, 2, 3)] == [set(), {"a", "b"}, {"b"}]


def test_a_segment_whose_first_step_never_began_is_absent(tmp_path):
    """Backward boundaries: the last step ends with the root's backward, the job exits."""
    schedule = [_segment(1, ["a", "b"]), _segment(3)]
    session = Session(parse_plan(plan_dict(tmp_path, schedule=schedule)), 0)
    for _ in range(2):
        session.clock.forward_begins()
        _prefetch_all(session)
        session.clock.backward_ends()  # no optimizer: the step ends here
    session.close()
    probe = read_probe(tmp_path)
    assert probe["step_source"] == "backward" and probe["steps_counted"] == 2
    assert probe["schedule_followed"] == [[0, 1]]  # step 3 never began


def test_a_job_without_step_boundaries_keeps_the_first_mask_and_says_so(tmp_path, capsys):
    schedule = [_segment(1, ["a"]), _segment(2, ["a", "b"])]
    session = Session(parse_plan(plan_dict(tmp_path, mask=["a"], schedule=schedule)), 0)
    for _ in range(3):
        session.forwards += 1  # a root forward, as the adapters count them
        _prefetch_all(session)
    session.close()
    probe = read_probe(tmp_path)
    assert probe["step_source"] is None and probe["schedule_followed"] == [[0, 1]]
    assert probe["edges"]["b"]["masked"] == 3 and probe["edges"]["a"]["issued"] == 3
    notes = [n for n in probe["step_notes"] if "schedule of masks was not followed" in n]
    assert len(notes) == 1 and "segment 0's mask held for the whole run" in notes[0]
    assert "schedule of masks was not followed" in capsys.readouterr().err


def test_an_engine_that_cannot_switch_keeps_the_first_mask_and_says_why(tmp_path):
    session = Session(parse_plan(plan_dict(tmp_path)), 0)
    session.refuse_schedule("compiled once")
    for step in range(1, 7):
        _prefetch_all(session)
        session.report_step(step, {"loss": 1.0})
    session.close()
    probe = read_probe(tmp_path)
    assert probe["schedule_refused"] == "compiled once"
    assert probe["schedule_followed"] == [[0, 1]]
    assert all(outcomes["issued"] == {"a", "b"} for outcomes in step_outcomes(probe).values())


def test_a_plan_without_a_schedule_adds_nothing_to_the_probe(tmp_path):
    session = Session(parse_plan(plan_dict(tmp_path, schedule=None)), 0)
    _prefetch_all(session)
    session.report_step(1, {"loss": 1.0})
    session.close()
    probe = read_probe(tmp_path)
    assert "schedule_followed" not in probe and "schedule_refused" not in probe


def test_a_switch_late_in_a_long_run_is_in_the_probe_file_when_its_first_step_ends(tmp_path):
    """After step 100 the probe is rewritten at most every 2 s; a new segment is written at
    once, so a job killed later still shows it."""
    schedule = [_segment(1, ["a", "b"]), _segment(150, ["a"])]
    session = Session(parse_plan(plan_dict(tmp_path, schedule=schedule)), 0)
    for step in range(1, 151):
        _prefetch_all(session)
        session.report_step(step, {"loss": 1.0})
    probe = read_probe(tmp_path)  # before exit
    assert probe["schedule_followed"] == [[0, 1], [1, 150]]
    assert step_outcomes(probe)[150]["masked"] == {"b"}
    session.close()
