"""The search with runs in flight: proposals, results in any order, replay, hints, budget."""

import heapq

import numpy as np
import pytest

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.graph import from_policy
from bisect_prefetch.search.oracle import RunResult
from bisect_prefetch.search.protocol import Bisection
from bisect_prefetch.search.simulate import SimulatedOracle
from bisect_prefetch.search.stats import hazard_for_chance

EDGES = from_policy("fsdp2-chain", 6).edge_ids()
CULPRIT = "bwd:layers.3->layers.2"
STEPS = 40
SEED = 20261130


def oracle(trial, q=0.5, culprits=(CULPRIT,)):
    print(f"seed {SEED} trial {trial}")
    return SimulatedOracle(list(culprits), hazard=hazard_for_chance(q, STEPS), steps=STEPS,
                           seed=SEED, trial=trial)


def run_slots(search, o, slots, journal):
    """Keep `slots` runs going; finish them in order of their lengths; journal every event."""
    clock, order, running = 0.0, 0, []
    while True:
        while len(running) < slots and not search.done:
            ask = search.propose()
            if ask is None:
                break
            journal.append(("proposed", ask.mask))
            result = o.run(ask.mask)
            heapq.heappush(running, (clock + max(result.steps, 1) / STEPS, order, ask.mask, result))
            order += 1
        if search.done or not running:
            return running
        clock, _, mask, result = heapq.heappop(running)
        journal.append(("completed", mask, result))
        search.record(mask, result)


def replay(journal, **options):
    search = Bisection(EDGES, steps_per_run=STEPS, **options)
    for event in journal:
        if event[0] == "proposed":
            assert search.propose().mask == event[1]
        elif event[0] == "completed":
            search.record(event[1], event[2])
        else:
            search.cancel(event[1])
    return search


@pytest.mark.parametrize("trial", range(3))
def test_four_slots_find_the_culprit_and_replay_gives_the_same_decisions(trial):
    search = Bisection(EDGES, steps_per_run=STEPS)
    journal = []
    run_slots(search, oracle(trial), 4, journal)
    result = search.result()
    assert result.verdict == "culprit-found" and result.minimal_set == [CULPRIT]
    assert sum(e[0] == "proposed" for e in journal) >= result.runs_used
    again = replay(journal)
    assert again.history == search.history
    assert again.result() == result


def test_four_slots_reduce_three_edges_needed_together_and_replay_gives_the_same_decisions():
    culprits = [EDGES[0], EDGES[4], EDGES[8]]
    o = SimulatedOracle(culprits, together=True, hazard=hazard_for_chance(0.5, STEPS), steps=STEPS,
                        seed=SEED)
    search = Bisection(EDGES, steps_per_run=STEPS)
    journal = []
    run_slots(search, o, 4, journal)
    result = search.result()
    assert (result.verdict, sorted(result.minimal_set)) == ("culprit-found", sorted(culprits))
    assert "reduce" in [row["step"] for row in result.evidence]
    assert replay(journal).result() == result


def test_runs_in_flight_are_never_evidence_and_slots_ask_different_questions():
    search = Bisection(EDGES, steps_per_run=STEPS)
    diverged = RunResult("stopped-early", True, 3, 3)
    search.record(frozenset(EDGES), diverged)  # drift reproduces
    search.record(frozenset(), RunResult("ok", False, None, STEPS))  # all-off is clean
    before = search.model.probabilities().single.copy()
    asks = [search.propose() for _ in range(4)]
    assert all(a is not None for a in asks)
    assert len({a.mask for a in asks}) >= 2  # the slots do not all run the same mask
    assert np.array_equal(search.model.probabilities().single, before)
    assert search.runs_used == 2 and len(search.in_flight) == 4
    # Results come back in any order, each folding into its own proposal.
    for ask in reversed(asks):
        search.record(ask.mask, RunResult("ok", False, None, STEPS))
    assert not search.in_flight and search.runs_used == 6


def test_resume_with_another_slot_count_cancels_what_will_not_report():
    search = Bisection(EDGES, steps_per_run=STEPS)
    journal = []
    o = oracle(7)
    for _ in range(3):  # four slots for a while, then the orchestrator dies
        ask = search.propose()
        journal.append(("proposed", ask.mask))
    first = journal[0][1]
    journal.append(("completed", first, o.run(first)))
    resumed = replay(journal)
    lost = [ask.mask for ask in resumed.in_flight]
    assert len(lost) == 2
    for mask in lost:
        resumed.cancel(mask)
    assert not resumed.in_flight
    with pytest.raises(BisectPrefetchError):
        resumed.cancel(frozenset(EDGES[:1]))
    run_slots(resumed, o, 1, journal)
    assert resumed.result().minimal_set == [CULPRIT]


def test_a_hint_is_taken_from_a_diverged_run_and_an_unknown_unit_is_ignored():
    search = Bisection(EDGES, steps_per_run=STEPS)
    search.record(frozenset(EDGES), RunResult("stopped-early", True, 5, 5), hint="layers.2")
    search.record(frozenset(), RunResult("ok", False, None, STEPS), hint="layers.2")
    search.record(frozenset(EDGES), RunResult("stopped-early", True, 5, 5), hint="layers.99")
    events = [n["event"] for n in search.notices]
    assert events == ["hint", "hint-ignored", "hint-ignored"]
    assert [n["reason"] for n in search.notices[1:]] == ["run-not-diverged", "unknown-unit"]
    p = search.model.probabilities().single
    into = [i for i, e in enumerate(EDGES) if e.endswith("->layers.2")]
    assert p[into].min() > 2 * np.delete(p, into).max()


def test_suspects_order_the_search_but_the_runs_decide():
    wrong = "fwd:layers.0->layers.1"
    search = Bisection(EDGES, steps_per_run=STEPS, suspects=[wrong])
    assert search.notices == [{"event": "suspects", "edges": [wrong]}]
    journal = []
    run_slots(search, oracle(2), 1, journal)
    assert search.result().minimal_set == [CULPRIT]


def test_the_default_budget_grows_as_the_estimated_chance_falls():
    strong, weak = Bisection(EDGES), Bisection(EDGES)
    for search, clean in ((strong, 0), (weak, 12)):
        search.record(frozenset(EDGES), RunResult("stopped-early", True, 5, 5))
        for _ in range(clean):
            search.record(frozenset(EDGES), RunResult("ok", False, None, STEPS))
    assert weak.budget > strong.budget > 50
    assert Bisection(EDGES, max_runs=30).budget == 30
