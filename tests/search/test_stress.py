"""The stress calibration's stopping rule (search/stress.py): a pair at a time, until the
evidence settles whether stress raises the per-step hazard, at most 4 pairs; and the
calibration as a search (`Calibration`)."""

from __future__ import annotations

import random
import statistics

from bisect_prefetch.search.oracle import RunResult
from bisect_prefetch.search.stress import (
    FIXED_PAIRS,
    SEQUENTIAL,
    STOP_BOTH,
    STOP_CAP,
    STOP_NOT_RAISED,
    STOP_RAISED,
    Calibration,
    Hazard,
)

STEPS = 20
SEED = 11


def _settle(rule, without: list[int | None], with_stress: list[int | None]):
    """The rule asked after each pair of the given first differing steps (None: clean)."""
    for pairs in range(1, len(without) + 1):
        choice = rule.decide(Hazard.of(without[:pairs], steps=STEPS),
                             Hazard.of(with_stress[:pairs], steps=STEPS), pairs=pairs)
        if choice is not None:
            return choice
    return None


def test_a_stressed_divergence_beside_a_clean_run_settles_after_one_pair():
    choice = _settle(SEQUENTIAL, [None] * 4, [3, 2, 4, 3])
    assert (choice.use, choice.pairs, choice.stop) == (True, 1, STOP_RAISED)
    assert choice.chance_raised >= 0.95


def test_a_stress_that_hides_the_race_settles_against_it():
    choice = _settle(SEQUENTIAL, [3, 2, 4, 3], [None] * 4)
    assert (choice.use, choice.pairs, choice.stop) == (False, 1, STOP_NOT_RAISED)


def test_a_late_divergence_is_not_enough_alone():
    # a stressed run that first differs at step 10 beside a clean one: P about 0.91
    assert SEQUENTIAL.decide(Hazard.of([None], steps=STEPS), Hazard.of([10], steps=STEPS),
                             pairs=1) is None
    choice = _settle(SEQUENTIAL, [None, None, None, None], [10, 6, None, None])
    assert choice.use and choice.pairs == 2 and choice.stop == STOP_RAISED


def test_drift_in_most_runs_either_way_settles_after_a_pair():
    # the race under heavy load: it shows without stress too, at steps 2 and 5
    choice = _settle(SEQUENTIAL, [2, 5, 3, 2], [2, 2, 1, 3])
    assert choice.pairs == 1 and choice.stop == STOP_BOTH
    assert choice.use == (choice.chance_raised > 0.5)
    # a late divergence without stress is no such evidence: the pairs go on
    assert SEQUENTIAL.decide(Hazard.of([12], steps=STEPS), Hazard.of([3], steps=STEPS),
                             pairs=1) is None


def test_nothing_shown_runs_to_the_cap_and_stress_is_not_used():
    choice = _settle(SEQUENTIAL, [None] * 6, [None] * 6)
    assert (choice.use, choice.pairs, choice.stop) == (False, 4, STOP_CAP)
    # equal, moderate hazards never settle: the cap, then the likelier side
    choice = _settle(SEQUENTIAL, [None, 9, None, 12], [None, 8, None, 11])
    assert choice.pairs == 4 and choice.stop == STOP_CAP


def test_the_fixed_rule_runs_four_pairs_whatever_they_show():
    assert _settle(FIXED_PAIRS, [None] * 3, [2, 2, 2]) is None
    choice = _settle(FIXED_PAIRS, [None] * 4, [2, 2, 2, 2])
    assert choice.use and choice.pairs == 4


def _draw(random_: random.Random, hazard: float) -> int | None:
    return next((k for k in range(1, STEPS + 1) if random_.random() < hazard), None)


def _calibrate(rule, hazard_without: float, hazard_with: float, random_: random.Random):
    without, with_stress = [], []
    while True:
        without.append(_draw(random_, hazard_without))
        with_stress.append(_draw(random_, hazard_with))
        choice = rule.decide(Hazard.of(without, steps=STEPS), Hazard.of(with_stress, steps=STEPS),
                             pairs=len(without))
        if choice is not None:
            return choice


def test_on_the_reference_race_it_takes_one_pair_and_chooses_as_the_fixed_rule():
    """The race workload's measured hazards (bench_race: 0.004 a step without stress, 0.28
    with): the sequential rule stops after a pair in most calibrations, and chooses stress
    as often as four fixed pairs do."""
    print(f"seed {SEED}")
    random_ = random.Random(SEED)
    sequential = [_calibrate(SEQUENTIAL, 0.004, 0.28, random_) for _ in range(300)]
    fixed = [_calibrate(FIXED_PAIRS, 0.004, 0.28, random_) for _ in range(300)]
    assert statistics.median(c.pairs for c in sequential) == 1
    assert statistics.mean(c.pairs for c in sequential) < 1.5
    assert sum(c.use for c in sequential) >= 0.97 * 300
    assert sum(c.use for c in fixed) >= 0.97 * 300


def test_a_stress_that_hides_a_race_is_rarely_used():
    print(f"seed {SEED}")
    random_ = random.Random(SEED)
    choices = [_calibrate(SEQUENTIAL, 0.1, 0.01, random_) for _ in range(300)]
    assert sum(c.use for c in choices) <= 0.05 * 300
    assert statistics.mean(c.pairs for c in choices) < 2.5


def test_the_calibration_asks_a_pair_at_a_time_and_stops_where_the_rule_does():
    """Calibration, the search the bisect command's loop drives: without stress first in
    each pair, each result recorded for the setting asked, the rule's choice its result."""
    all_on = frozenset({"a", "b"})
    calibration = Calibration(all_on, steps=STEPS, rule=SEQUENTIAL)
    answers = {False: [None, None, None, None], True: [12, None, None, None]}  # first diff steps
    asked = []
    while (ask := calibration.pending) is not None:
        assert ask.mask == all_on
        asked.append(ask.stress)
        step = answers[ask.stress][len(calibration.runs[ask.stress])]
        calibration.record(all_on, RunResult("ok", False, None, STEPS) if step is None
                           else RunResult("stopped-early", True, step, step))
    assert asked == calibration.settings == [False, True] * calibration.result().pairs
    assert calibration.done and calibration.runs_used == len(asked)
    assert calibration.result() == _settle(SEQUENTIAL, answers[False], answers[True])
