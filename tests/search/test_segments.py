"""Several masks in one run (search/segments.py): planning a run's segments ahead, reading
a run back into one trial per segment, the cost model, and simulated searches with them."""

import copy

import numpy as np
import pytest

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.graph import from_policy
from bisect_prefetch.search.oracle import RunResult
from bisect_prefetch.search.protocol import Bisection
from bisect_prefetch.search.segments import (
    CONTROL_RUNS,
    FULL_LENGTH_STAGES,
    Lengths,
    Schedule,
    lengths_for,
    plan_run,
    record_run,
)
from bisect_prefetch.search.simulate import SimulatedOracle
from bisect_prefetch.search.stats import hazard_for_chance
from bisect_prefetch.simulation.search_run import run_search
from bisect_prefetch.simulation.trials import simulate
from bisect_prefetch.vocab import ERROR, OK, STOPPED_EARLY

EDGES = from_policy("fsdp2-chain", 4).edge_ids()
CULPRIT = "bwd:layers.2->layers.1"
STEPS = 40
LENGTHS = Lengths(STEPS, 8, 4 * STEPS)


def search(**options) -> Bisection:
    return Bisection(EDGES, steps_per_run=STEPS, **options)


def diverged_search() -> Bisection:
    """A search past calibration: all-on diverged once."""
    b = search()
    b.record(frozenset(EDGES), RunResult(STOPPED_EARLY, True, 5, 5))
    return b


def test_a_run_is_planned_as_if_each_segment_before_came_back_clean():
    b = diverged_search()
    expected_first = b.pending
    schedule = plan_run(b, LENGTHS)
    assert schedule.segments[0].ask.mask == expected_first.mask
    # The same search, told each segment was clean, asks for the next one in turn.
    replay = diverged_search()
    for segment in schedule.segments:
        assert replay.pending.mask == segment.ask.mask and replay.pending.stage == segment.ask.stage
        replay.propose(segment.ask)
        replay.record(segment.ask.mask, RunResult(OK, False, None, segment.steps))
    # Back to back from step 1, checks a full run, search masks a segment, within the cap.
    step = 1
    for segment in schedule.segments:
        assert segment.first_step == step
        full = segment.ask.stage in FULL_LENGTH_STAGES
        assert segment.steps == (STEPS if full else LENGTHS.segment_steps) or segment.last_step == LENGTHS.cap_steps
        assert segment.ask.share == pytest.approx(segment.steps / STEPS)
        step += segment.steps
    assert schedule.steps <= LENGTHS.cap_steps
    assert len(b.in_flight) == len(schedule.segments)


def test_a_clean_run_records_every_segment_clean_and_one_startup():
    b = diverged_search()
    schedule = plan_run(b, LENGTHS)
    used, startups = b.log.used, b.startups
    record_run(b, schedule, RunResult(OK, False, None, schedule.steps))
    assert b.runs_used == 1 + len(schedule.segments)
    assert b.startups == startups + 1
    assert b.log.used == pytest.approx(used + sum(s.ask.share for s in schedule.segments))
    assert b.steps_used == 5 + schedule.steps
    assert not b.in_flight
    assert all(not r.diverged for _, r in b.history[1:])


def schedule_of(b: Bisection, masks_steps) -> Schedule:
    """A schedule of given masks (stage search), proposed to the search."""
    from dataclasses import replace

    from bisect_prefetch.search.segments import Segment

    segments, step = [], 1
    for mask, steps in masks_steps:
        ask = replace(b.log.ask(frozenset(mask), "search"), share=steps / STEPS)
        segments.append(Segment(ask, step, steps))
        b.propose(ask)
        step += steps
    return Schedule(tuple(segments))


def test_a_divergence_inside_a_segment_counts_against_its_mask_alone():
    b = diverged_search()
    masks = [{EDGES[0]}, {EDGES[1]}, {EDGES[2]}]
    schedule = schedule_of(b, [(m, 8) for m in masks])
    record_run(b, schedule, RunResult(STOPPED_EARLY, True, 12, 12))  # step 4 of segment 2
    recorded = b.history[1:]
    assert [(set(m), r.diverged) for m, r in recorded] == [(masks[0], False), (masks[1], True)]
    assert recorded[1][1].first_diff_step == 4 and recorded[0][1].steps == 8
    assert not b.in_flight  # the third segment never ran
    assert b.startups == 2


def test_a_divergence_at_a_switch_counts_against_both_masks_and_is_said():
    b = diverged_search()
    masks = [{EDGES[0]}, {EDGES[1]}, {EDGES[2]}]
    schedule = schedule_of(b, [(m, 8) for m in masks])
    record_run(b, schedule, RunResult(STOPPED_EARLY, True, 9, 9))  # the first step of segment 2
    recorded = b.history[1:]
    assert len(recorded) == 1
    mask, result = recorded[0]
    assert set(mask) == masks[0] | masks[1] and result.diverged  # the drift may be step 8's
    assert not b.in_flight
    notice = b.notices[-1]
    assert notice["event"] == "diverged-at-switch" and notice["step"] == 9


def test_a_failed_run_tells_nothing_beyond_its_first_segment():
    b = diverged_search()
    schedule = schedule_of(b, [({EDGES[0]}, 8), ({EDGES[1]}, 8)])
    record_run(b, schedule, RunResult(ERROR, None, None, 10))
    assert [r.outcome for _, r in b.history[1:]] == [ERROR]
    assert not b.in_flight
    assert b.log.tally(frozenset({EDGES[1]})).clean == 0


def test_the_same_runs_give_the_same_schedules():
    """Replay: a schedule is a function of what was recorded, so a resumed search plans
    the runs its journal holds."""
    def drive():
        o = SimulatedOracle([CULPRIT], hazard=hazard_for_chance(0.5, STEPS), steps=STEPS, seed=3)
        b, schedules = search(), []
        while not b.done and len(schedules) < 6:
            schedule = plan_run(b, LENGTHS)
            schedules.append([(s.first_step, s.steps, s.ask.mask, s.ask.stage) for s in schedule.segments])
            record_run(b, schedule, o.run_schedule(schedule))
        return schedules

    assert drive() == drive()


def test_planning_leaves_the_search_as_it_was_but_for_the_runs_in_flight():
    b = diverged_search()
    before = copy.deepcopy(b)
    schedule = plan_run(b, LENGTHS)
    for segment in schedule.segments:
        b.cancel(segment.ask.mask)
    assert b.pending == before.pending
    assert b.runs_used == before.runs_used and b.log.used == before.log.used
    np.testing.assert_array_equal(b.model.single_exposure, before.model.single_exposure)


def test_the_cost_model_caps_runs_by_the_startup_and_keeps_checks_a_full_run():
    assert lengths_for(100, 0).cap_steps == 100  # a start-up that costs nothing: one mask a run
    caps = [lengths_for(100, s).cap_steps for s in (5, 50, 200, 1000, 10_000)]
    assert caps == sorted(caps)
    # The golden run at the cap serves as background controls: a cap up to those costs no steps.
    assert caps[:3] == [CONTROL_RUNS * 100] * 3
    assert caps[-1] == caps[-2] < 2 * CONTROL_RUNS * 100  # past them, a bounded share of the search
    assert lengths_for(100, 50).segment_steps == 100
    # A smaller graph needs a shorter search: a shorter cap where the start-up sets it.
    assert lengths_for(30, 5000, edges=15).cap_steps < lengths_for(30, 5000, edges=67).cap_steps
    with pytest.raises(BisectPrefetchError, match="segment"):
        Lengths(10, 20, 40)
    with pytest.raises(BisectPrefetchError, match="cap"):
        Lengths(10, 5, 8)


def test_the_cost_model_picks_one_mask_a_run_where_drift_shows_in_most_runs():
    """make demo's runs (30 steps, 14 edges, a start-up of 40 steps): the more often drift
    shows, the fewer clean trials ride in a run and the fewer controls the golden run
    stands in for, so the cap shrinks, to one run where segments would cost more."""
    caps = [lengths_for(30, 40, edges=14, chance=q).cap_steps for q in (0.05, 0.3, 0.5, 0.8, 0.95)]
    assert caps == sorted(caps, reverse=True) and caps[0] > caps[-1]
    assert caps[-1] == 30  # one mask a run
    assert lengths_for(30, 1000, edges=14, chance=0.95).cap_steps > 30  # a dear start-up pays
    # Drift without prefetch: a long golden run would drift itself.
    assert lengths_for(30, 1000, edges=14, chance=0.3, background=True).cap_steps == 30
    # No chance measured: the one the cost model assumes (CHANCE, 0.3).
    assert lengths_for(30, 40, edges=14).cap_steps == lengths_for(30, 40, edges=14, chance=0.3).cap_steps


def test_the_golden_run_counts_as_controls_only_through_the_steps_runs_matched():
    b = search()
    b.golden(5 * STEPS)
    b.record(frozenset(EDGES), RunResult(STOPPED_EARLY, True, 7, 7))  # matched steps 1-6
    assert b.log.golden_runs() == 6 / STEPS
    b.record(frozenset(), RunResult(ERROR, None, None, 0))  # a failed run matched nothing
    assert b.log.golden_runs() == 6 / STEPS
    b.record(frozenset(), RunResult(OK, False, None, 3 * STEPS), matched=3 * STEPS)
    assert b.log.golden_runs() == 3
    b.golden(2 * STEPS)  # a new golden run: nothing has matched it yet
    assert b.log.golden_runs() == 0
    b.record(frozenset(), RunResult(OK, False, None, 3 * STEPS), matched=3 * STEPS)
    assert b.log.golden_runs() == 2  # no more than it has steps


def test_a_golden_run_as_long_as_six_runs_stands_in_for_background_controls():
    """Runs of up to six masks, and a golden run as long, which clean runs match through
    its end: the same searches need fewer all-off control runs of their own."""
    hazard = hazard_for_chance(0.3, STEPS)
    controls = {}
    for lengths in (None, Lengths(STEPS, STEPS, 6 * STEPS)):
        controls[lengths] = 0
        for trial in range(6):
            o = SimulatedOracle([CULPRIT], hazard=hazard, steps=STEPS, seed=21, trial=trial)
            out = run_search(EDGES, o, lengths=lengths, steps_per_run=STEPS)
            assert out.minimal_set == [CULPRIT]
            controls[lengths] += out.runs_by_stage["background-control"]
    assert controls[Lengths(STEPS, STEPS, 6 * STEPS)] < controls[None]


def test_segments_find_the_culprit_with_fewer_startups_than_one_mask_a_run():
    hazard = hazard_for_chance(0.3, STEPS)
    kept = []
    for lengths in (None, Lengths(STEPS, 8, 8 * STEPS)):
        outcomes = []
        for trial in range(6):
            o = SimulatedOracle([CULPRIT], hazard=hazard, steps=STEPS, seed=11, trial=trial)
            outcomes.append(run_search(EDGES, o, lengths=lengths, steps_per_run=STEPS))
        # At a claimed confidence of 0.95 one answer in six may be a wrong set; never one
        # that misses the culprit here (every run enabling it is the only drift).
        assert all(x.verdict == "culprit-found" and CULPRIT in x.minimal_set for x in outcomes)
        assert sum(x.minimal_set == [CULPRIT] for x in outcomes) >= 5
        kept.append(np.median([x.startups for x in outcomes]))
    one_mask, segmented = kept
    assert segmented < 0.6 * one_mask


def test_runs_of_several_masks_on_several_slots_end_at_the_verdict():
    """A run planned before other slots' runs came in may outlast the search: its segments
    after the verdict are not recorded."""
    hazard = hazard_for_chance(0.5, STEPS)
    for trial in range(3):
        o = SimulatedOracle([CULPRIT], hazard=hazard, steps=STEPS, seed=13, trial=trial)
        out = run_search(EDGES, o, slots=4, lengths=LENGTHS, steps_per_run=STEPS, startup_cost=20)
        assert out.verdict == "culprit-found" and CULPRIT in out.minimal_set


def test_background_drift_with_segments_is_named_not_prefetch():
    """Asking for an all-off run may settle the search (not-prefetch): planning stops there
    (it recorded a segment into a finished search before)."""
    verdicts = []
    for trial in range(8):
        o = SimulatedOracle([], hazard=0.0, steps=STEPS, background=hazard_for_chance(0.9, STEPS),
                            seed=3, trial=trial)
        verdicts.append(run_search(EDGES, o, lengths=Lengths(STEPS, STEPS, 6 * STEPS),
                                   steps_per_run=STEPS).verdict)
    assert verdicts.count("not-prefetch") >= 7


def test_simulate_reports_startups_steps_and_cost_side_by_side_keys():
    out = simulate("fsdp2-chain", 4, [CULPRIT], hazard=hazard_for_chance(0.5, STEPS), steps=STEPS,
                   trials=3, seed=5, startup_cost=50, segments="auto")
    assert out["segments"] == "auto" and out["cap_steps"] > STEPS
    assert out["startups_median"] >= 2  # the golden reference and at least one run
    for r in out["results"]:
        assert r["cost"] == r["steps"] + r["golden_steps"] + 50 * r["startups"]
        assert r["golden_steps"] == out["cap_steps"]
    with pytest.raises(BisectPrefetchError, match="--segments"):
        simulate("fsdp2-chain", 4, [CULPRIT], hazard=0.01, steps=STEPS, trials=1, segments="on")


# -- what the orchestrator checks and reads of a run of several masks -----------------------
def test_segments_in_an_experiment_file_and_on_the_command_line(tmp_path):
    from bisect_prefetch.experiment import load_experiment, with_segments

    path = tmp_path / "exp.yaml"
    base = "name: x\nworkload: {builtin: fsdp2, layers: 2}\nsteps: 4\nseed: 1\n"
    path.write_text(base + "search: {segments: off}\n")  # YAML 1.1 reads a bare off as false
    assert load_experiment(path).search.segments == "off"
    path.write_text(base + "search: {segments: auto}\n")
    experiment = load_experiment(path)
    assert experiment.search.segments == "auto"
    assert with_segments(experiment, "off").search.segments == "off"
    assert with_segments(experiment, None) is experiment
    with pytest.raises(BisectPrefetchError, match="--segments must be auto or off"):
        with_segments(experiment, "on")
    # MindSpore graph mode cannot switch masks inside a run: said, and one mask a run.
    from bisect_prefetch.experiment import segments_unfit

    assert segments_unfit(experiment) is None
    path.write_text("name: x\ncommand: [train]\nsteps: 4\nsearch: {segments: auto}\n"
                    "graph: {source: static, policy: mindformers, layers: 2}\n")
    assert "graph mode" in segments_unfit(load_experiment(path))


SCHEDULE = [(1, frozenset({"a"})), (5, frozenset()), (9, frozenset({"b"}))]


def probe_of(**ranks):
    return {"ranks": {str(r): p for r, p in ranks.items()}}


def test_a_run_counts_only_where_every_rank_followed_its_schedule():
    from bisect_prefetch.judge.merge import schedule_problems

    followed = {"schedule_followed": [[0, 1], [1, 5], [2, 9]]}
    assert schedule_problems(probe_of(**{"0": followed, "1": followed}), SCHEDULE, 13) == []
    # A rank that switched a step late, or never: the run is no evidence.
    late = {"schedule_followed": [[0, 1], [1, 6]]}
    assert schedule_problems(probe_of(**{"0": followed, "1": late}), SCHEDULE, 13) == [
        "rank 1 began segment 1 at step 6 (planned: 5)"]
    stuck = {"schedule_followed": [[0, 1]]}
    assert schedule_problems(probe_of(**{"0": stuck}), SCHEDULE, 13) == [
        "rank 0 never began segment 1 (planned at step 5)"]
    refused = {"schedule_refused": "MindSpore graph mode compiles the hooks once"}
    assert "cannot switch masks inside a run" in schedule_problems(probe_of(**{"0": refused}), SCHEDULE, 13)[0]
    assert schedule_problems(probe_of(**{"0": {}}), SCHEDULE, 13) == ["rank 0 recorded no schedule it followed"]
    # Stopped at a difference at step 5: only the segments begun before it must be on disk.
    assert schedule_problems(probe_of(**{"0": stuck}), SCHEDULE, 5) == []
    assert schedule_problems(None, SCHEDULE, 5) == []  # killed before its probe: segment 0 only
    assert schedule_problems(None, SCHEDULE, 6) != []


def test_step_times_of_a_run_of_several_masks_count_for_each_segments_mask():
    from bisect_prefetch.judge.step_time import _segments

    record = {"mask": ["a"], "schedule": [[1, ["a"]], [4, ["a", "b"]]],
              "step_times_ms": [[s, 10.0 * s] for s in range(1, 8)]}
    first, second = _segments(record)
    assert first["mask"] == ["a"] and [s for s, _ in first["step_times_ms"]] == [1, 2, 3]
    assert second["mask"] == ["a", "b"] and [s for s, _ in second["step_times_ms"]] == [4, 5, 6, 7]
    plain = {"mask": ["a"], "step_times_ms": [[1, 1.0]]}
    assert _segments(plain) == [plain]
