"""A golden run that drifted itself: told from the runs, replaced, and every run read again."""

from __future__ import annotations

from bisect_prefetch.graph import from_policy
from bisect_prefetch.search.causes import CauseSearch
from bisect_prefetch.search.golden_drift import drift_step, drifted_golden, rejudged
from bisect_prefetch.search.oracle import RunResult
from bisect_prefetch.search.simulate import SimulatedOracle
from bisect_prefetch.search.stats import hazard_for_chance
from bisect_prefetch.simulation.search_run import run_search
from bisect_prefetch.vocab import OK, STOPPED_EARLY

EDGES = from_policy("fsdp2-chain", 8).edge_ids()
CULPRIT = "bwd:layers.5->layers.4"
ALL_ON, ALL_OFF = frozenset(EDGES), frozenset()


def diverged(step: int) -> RunResult:
    return RunResult(STOPPED_EARLY, True, step, step)


def clean(steps: int = 30) -> RunResult:
    return RunResult(OK, False, None, steps)


def test_runs_that_all_stop_at_one_step_an_all_off_one_among_them_show_the_golden_run_drifted():
    assert drift_step([(ALL_ON, diverged(9)), (ALL_OFF, diverged(9))]) == 9
    assert drift_step([(ALL_ON, diverged(4)), (ALL_ON, diverged(9)), (ALL_OFF, diverged(9))]) == 9


def test_a_run_that_matched_the_golden_run_past_the_step_clears_it():
    assert drift_step([(ALL_ON, clean()), (ALL_ON, diverged(9)), (ALL_OFF, diverged(9))]) is None
    assert drift_step([(ALL_ON, diverged(12)), (ALL_ON, diverged(9)), (ALL_OFF, diverged(9))]) is None


def test_without_an_all_off_run_at_the_step_a_mask_may_change_the_numbers():
    assert drift_step([(ALL_ON, diverged(9)), (ALL_ON, diverged(9))]) is None
    assert drift_step([(ALL_OFF, diverged(9))]) is None  # one run: its own drift, or the golden's
    assert drift_step([(ALL_ON, RunResult("error")), (ALL_OFF, diverged(9))]) is None


def test_a_run_read_again_is_clean_through_the_step_before():
    assert rejudged(diverged(9), 9) == RunResult(STOPPED_EARLY, False, None, 8)
    assert rejudged(diverged(4), 9) == diverged(4)  # its own drift, before the golden run's
    assert rejudged(clean(), 9) == clean()
    assert drifted_golden(9) == diverged(9)


def test_the_search_asks_for_nothing_until_a_new_golden_run():
    search = CauseSearch(EDGES, steps_per_run=30)
    search.golden(30)
    search.record(search.pending.mask, diverged(9))
    assert search.golden_drifted is None
    while search.pending.mask != ALL_OFF:
        search.record(search.pending.mask, diverged(9))
    search.record(ALL_OFF, diverged(9))
    assert search.golden_drifted == 9 and search.pending is None and not search.done
    drift = [n for n in search.notices if n["event"] == "golden-drifted"]
    assert drift == [{"event": "golden-drifted", "step": 9, "runs": search.runs_used}]
    assert search.round.search.log.tally(ALL_OFF).divergences == 1  # the golden run's own
    assert search.round.search.log.tally(ALL_OFF).clean >= 1  # the all-off run read again
    search.golden(30)
    assert search.golden_drifted is None and search.pending is not None


class FirstGoldenDrifts(SimulatedOracle):
    """The first golden run drifts at step 7; later ones do not (no background drift)."""

    def run_golden(self, steps: int) -> None:
        super().run_golden(steps)
        self.golden_diff = 7 if not hasattr(self, "replaced") else None
        self.replaced = True


def test_a_search_whose_golden_run_drifted_names_the_culprit():
    hazard = hazard_for_chance(0.5, 30)
    oracle = FirstGoldenDrifts([CULPRIT], hazard=hazard, steps=30, seed=3, trial=0)
    outcome = run_search(EDGES, oracle, confidence=0.95, steps_per_run=30)
    assert (outcome.verdict, outcome.minimal_set) == ("culprit-found", [CULPRIT])
    assert outcome.startups == outcome.runs + 2 and outcome.golden_steps == 60  # two golden runs
    # The one-cause search does not read its runs again: every run differs at step 7.
    unread = FirstGoldenDrifts([CULPRIT], hazard=hazard, steps=30, seed=3, trial=0)
    outcome = run_search(EDGES, unread, confidence=0.95, steps_per_run=30, one_cause=True)
    assert outcome.verdict == "not-prefetch" and outcome.startups == outcome.runs + 1


class EveryRunDriftsAtOneStep(SimulatedOracle):
    """Every run, every golden one too, drifts at step 5 whatever the mask."""

    def run_golden(self, steps: int) -> None:
        super().run_golden(steps)
        self.golden_diff = 5


def test_drift_at_one_step_in_every_run_is_read_as_a_golden_run_that_drifted_once():
    oracle = EveryRunDriftsAtOneStep([], hazard=0.0, steps=30, seed=3, trial=0)
    outcome = run_search(EDGES, oracle, confidence=0.95, steps_per_run=30, max_runs=60)
    assert outcome.verdict == "not-prefetch"
    assert outcome.startups == outcome.runs + 2  # one new golden run, not one after each
