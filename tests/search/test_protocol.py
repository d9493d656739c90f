"""The search protocol against the simulated oracle: every exit path, pairs, replay."""

import pytest

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.graph import from_policy
from bisect_prefetch.search import verdict as v
from bisect_prefetch.search.checks import MIN_DROP_ONLY
from bisect_prefetch.search.oracle import RunResult
from bisect_prefetch.search.protocol import Bisection, mask_name
from bisect_prefetch.search.runlog import BACKGROUND_CONTROL
from bisect_prefetch.search.simulate import SimulatedOracle
from bisect_prefetch.search.stats import hazard_for_chance

EDGES = from_policy("fsdp2-chain", 4).edge_ids()  # 3 forward, 3 backward
STEPS = 40
SEED = 20260601


def hazard(q):
    return hazard_for_chance(q, STEPS)


def run(search, oracle):
    while (mask := search.next_mask()) is not None:
        search.record(mask, oracle.run(mask))
    return search.result()


def search_with(culprits, *, q=0.5, together=False, background=0.0, trial=0, **options):
    print(f"seed {SEED} trial {trial}")
    oracle = SimulatedOracle(
        culprits, together=together, hazard=hazard(q), steps=STEPS,
        background=hazard(background) if background else 0.0, seed=SEED, trial=trial,
    )
    search = Bisection(EDGES, steps_per_run=STEPS, **options)
    return search, run(search, oracle)


@pytest.mark.parametrize("trial", range(3))
def test_culprit_found_names_the_edge_and_both_checks(trial):
    culprit = "bwd:layers.2->layers.1"
    search, result = search_with([culprit], trial=trial)
    assert result.verdict == "culprit-found"
    assert result.minimal_set == [culprit]
    assert result.confidence >= 0.95
    keep, drop, background = result.facts
    assert (keep.kind, keep.edges) == (v.KeepOnlyDiverged.kind, (culprit,))
    assert search.history[keep.run - 1][1].first_diff_step == keep.step
    assert (drop.kind, drop.edges) == (v.DropOnlyClean.kind, (culprit,)) and drop.runs >= 1
    assert result.drop_only_diverges is False
    # The controls: the all-off check and the double check's drop-only runs (at least 3).
    assert background.kind == v.BackgroundRuledOut.kind and background.runs >= 1 + MIN_DROP_ONLY
    assert background.chance == pytest.approx(1 - 0.05 ** (1 / background.runs))
    # One all-on run first; the all-off check right after the first divergence.
    steps = [row["step"] for row in result.evidence]
    first_diverged = next(i for i, row in enumerate(result.evidence) if row["divergences"])
    assert steps[0] == "calibrate" and result.evidence[0]["runs"] == 1 + (first_diverged == 0) * 0
    assert steps[first_diverged + 1] == "check-off"
    assert result.runs_used == len(search.history) == sum(row["runs"] for row in result.evidence)
    assert result.steps_used == sum(r.steps for _, r in search.history)
    assert result.calibration["divergences"] >= 1
    assert search.state == "done" and search.next_mask() is None


def test_no_drift_reproduced_states_the_bound_ruled_out():
    search, result = search_with([], calibration_runs=20)
    assert result.verdict == "no-drift-reproduced"
    # Half of calibration_runs searching, then all-on until every edge had 20 clean runs.
    assert 20 < result.runs_used <= 30
    assert min(sum(e in mask for mask, _ in search.history) for e in EDGES) == 20
    assert result.minimal_set == []
    assert result.confidence == 0.95
    all_on = sum(mask == frozenset(EDGES) for mask, _ in search.history)
    assert (result.facts[0].kind, result.facts[0].runs, result.facts[0].all_on) == (v.NoDrift.kind, 20, all_on)
    assert result.facts[0].chance == pytest.approx(1 - 0.05 ** (1 / 20))


def test_drift_with_every_edge_off_is_not_prefetch():
    search, result = search_with([], background=0.9)
    assert result.verdict == "not-prefetch"
    assert result.facts[0].kind == v.AllOffDiverged.kind and result.facts[0].divergences >= 1
    assert result.confidence >= 0.95 and result.facts[0].chance > 0.5  # the background estimate
    assert result.evidence[-1]["mask"] == "all-off"
    assert result.evidence[-1]["verdict"] == "diverged"


def test_out_of_runs_is_inconclusive_with_the_best_guess():
    search, result = search_with(["fwd:layers.0->layers.1"], q=0.3, max_runs=5)
    assert result.verdict == "inconclusive"
    assert result.runs_used == 5
    stopped = result.facts[0]
    assert (stopped.kind, stopped.reason, stopped.limit) == (v.Stopped.kind, "max-runs", 5)
    assert list(stopped.edges) == result.top_hypotheses[0]["edges"]
    assert result.top_hypotheses and result.minimal_set == []


@pytest.mark.parametrize("trial", range(2))
def test_pair_needed_together_is_found_one_minimal(trial):
    pair = ["fwd:layers.1->layers.2", "bwd:layers.3->layers.2"]
    search, result = search_with(pair, together=True, trial=trial, max_runs=400)
    assert result.verdict == "culprit-found"
    assert sorted(result.minimal_set) == sorted(pair)
    needed = [f for f in result.facts if f.kind == v.EachNeeded.kind]
    assert len(needed) == 1 and sorted(needed[0].edges) == sorted(pair)
    # 1-minimal: no run that enabled only one of the two ever diverged.
    for mask, r in search.history:
        if r.diverged:
            assert set(pair) <= mask or not mask


def test_all_off_runs_sets_the_check_after_the_first_divergence():
    search, result = search_with(["bwd:layers.2->layers.1"], all_off_runs=3)
    first_diverged = next(i for i, row in enumerate(result.evidence) if row["divergences"])
    check = result.evidence[first_diverged + 1]
    assert (check["step"], check["mask"], check["runs"]) == ("check-off", "all-off", 3)


def test_the_first_divergence_may_come_from_a_search_mask():
    # One all-on run, then the search's masks: a search mask's divergence both
    # shows the drift and localizes it; the all-off check follows it.
    search = Bisection(EDGES, steps_per_run=STEPS)
    assert search.next_mask() == frozenset(EDGES) and search.state == "calibrate"
    search.record(frozenset(EDGES), RunResult("ok", False, None, STEPS))
    assert search.state == "search"
    mask = search.next_mask()
    assert 0 < len(mask) < len(EDGES)
    search.record(mask, RunResult("stopped-early", True, 5, 5))
    assert (search.state, search.next_mask()) == ("check-off", frozenset())


def test_several_disjoint_causes_are_reported():
    culprits = ["fwd:layers.0->layers.1", "bwd:layers.3->layers.2"]
    search, result = search_with(culprits, q=0.9)
    assert result.verdict == "culprit-found"
    assert len(result.minimal_set) == 1 and result.minimal_set[0] in culprits
    assert result.drop_only_diverges is True
    assert [f.kind for f in result.facts] == [v.KeepOnlyDiverged.kind, v.DropOnlyDiverges.kind]
    # One keep-only divergence could be background drift: a second one stands for it.
    keep = frozenset(result.minimal_set)
    assert sum(r.diverged for mask, r in search.history if mask == keep) >= 2


def test_replaying_the_runs_rebuilds_the_same_search():
    search, result = search_with(["fwd:layers.1->layers.2"], q=0.4, trial=5)
    history = search.history
    assert len(history) > 6
    for cut in (0, 3, len(history) // 2, len(history) - 1):
        again = Bisection(EDGES, steps_per_run=STEPS)
        for mask, r in history[:cut]:
            assert again.next_mask() == mask
            again.record(mask, r)
        assert again.next_mask() == history[cut][0]
        # The step the first search took its next run for, found by run number.
        asked = next(b for b in search.blocks if b.first_run <= cut + 1 < b.first_run + b.runs)
        assert again.state == asked.stage
    again = Bisection(EDGES, steps_per_run=STEPS)
    for mask, r in history:
        again.record(mask, r)
    assert again.done
    assert again.result() == result


def test_a_replayed_journal_continues_under_a_new_confidence():
    search, first = search_with(["bwd:layers.3->layers.2"], q=0.4, trial=2)
    stricter = Bisection(EDGES, steps_per_run=STEPS, confidence=0.999)
    for mask, r in search.history:
        if stricter.done:
            break
        stricter.record(mask, r)
    oracle = SimulatedOracle(["bwd:layers.3->layers.2"], hazard=hazard(0.4), steps=STEPS, seed=SEED, trial=99)
    result = run(stricter, oracle)
    assert result.runs_used >= first.runs_used  # nothing that finished is run again
    assert result.verdict == "culprit-found" and result.confidence >= 0.999


class FailingOracle:
    """Every run fails, as a job that never starts would."""

    def run(self, mask):
        return RunResult("error", None, None, 0)


def test_failed_runs_never_count_as_clean_and_make_a_mask_unresolved():
    search = Bisection(EDGES, max_errors=3)
    result = run(search, FailingOracle())
    assert result.verdict == "inconclusive"
    assert result.runs_used == 3
    assert (result.facts[0].kind, result.facts[0].reason) == (v.Stopped.kind, "all-on-never-completed")
    assert result.evidence[0]["errors"] == 3 and result.evidence[0]["verdict"] == "unresolved"


def test_a_failure_between_runs_is_retried_not_counted():
    search = Bisection(EDGES)
    all_on = search.next_mask()
    search.record(all_on, RunResult("timeout", None, None, 7))
    search.record(all_on, RunResult("stopped-early", True, 12, 12))
    block = search.blocks[0]
    assert (block.runs, block.errors, block.divergences) == (2, 1, 1)
    assert (block.diverged_at, block.first_diff_steps) == (2, [12])
    assert search.steps_used == 19
    assert search.next_mask() == frozenset()  # on to all-off


def test_a_clean_run_cut_short_counts_as_part_of_a_run():
    search = Bisection(EDGES, steps_per_run=40)
    search.record(frozenset(EDGES), RunResult("stopped-early", False, None, 10))
    assert search.model.exposure == pytest.approx(0.25)


def test_bad_input_is_a_bisect_prefetch_error():
    with pytest.raises(BisectPrefetchError):
        Bisection([])
    with pytest.raises(BisectPrefetchError):
        Bisection(EDGES, confidence=1.0)
    with pytest.raises(BisectPrefetchError):
        Bisection(EDGES, max_runs=0)
    search = Bisection(EDGES)
    with pytest.raises(BisectPrefetchError, match="not in the graph"):
        search.record(frozenset(["fwd:nope->nada"]), RunResult("ok", False, None, 5))
    with pytest.raises(BisectPrefetchError):
        RunResult("ok", None, None, 5)
    with pytest.raises(BisectPrefetchError):
        RunResult("crashed", None, None, 5)


def test_recording_after_the_verdict_is_an_error():
    search, _ = search_with([], calibration_runs=3)
    with pytest.raises(BisectPrefetchError, match="finished"):
        search.record(frozenset(EDGES), RunResult("ok", False, None, STEPS))


def test_mask_names():
    all_on = frozenset(EDGES)
    assert mask_name(all_on, EDGES) == "all-on"
    assert mask_name(frozenset(), EDGES) == "all-off"
    assert mask_name(frozenset(e for e in EDGES if e.startswith("bwd:")), EDGES) == "forward-off"
    assert mask_name(frozenset(EDGES[:1]), EDGES) == f"keep-only:{EDGES[0]}"
    assert mask_name(frozenset(EDGES[1:4]), EDGES) == f"keep-only {EDGES[1]} .. {EDGES[3]} (3 edges)"
    assert mask_name(frozenset(EDGES[:1] + EDGES[4:]), EDGES) == f"drop-only {EDGES[1]} .. {EDGES[3]} (3 edges)"


def test_auto_all_off_runs_rule_out_background_as_strong_as_the_answer():
    # auto is the default; a count of 1 is the cheaper search that trusts background drift to be rare.
    culprit = "bwd:layers.2->layers.1"
    _, plain = search_with([culprit], q=0.3, trial=1, all_off_runs=1)
    search, strict = search_with([culprit], q=0.3, trial=1)
    assert strict.verdict == plain.verdict == "culprit-found"
    background = strict.facts[-1]
    assert background.kind == v.BackgroundRuledOut.kind
    # Enough controls that drift without prefetch as strong as the answer's would have
    # shown with chance 1 - alpha/2; the plain search stops with fewer.
    assert (1 - background.strength) ** background.runs <= 0.025
    assert plain.facts[-1].runs < background.runs
    assert [b.context for b in search.blocks if b.stage == "check-off"][-1] == BACKGROUND_CONTROL


def test_auto_all_off_runs_turn_background_drift_into_not_prefetch():
    # Background drift as strong as a culprit, no culprit: the controls catch it.
    verdicts = [search_with([], q=0.3, background=0.3, trial=t)[1].verdict for t in range(10)]
    assert verdicts.count("not-prefetch") >= 9


def test_all_off_runs_must_be_a_count_or_auto():
    with pytest.raises(BisectPrefetchError, match="all_off_runs"):
        Bisection(EDGES, all_off_runs="sometimes")


@pytest.mark.parametrize("trial", range(3))
def test_three_edges_needed_together_are_reduced_to_a_one_minimal_set(trial):
    # Outside the posterior's model: the reduce stage (noise-aware ddmin) finds them.
    edges = from_policy("mindformers", 8).edge_ids()
    culprits = [edges[1], edges[7], edges[12]]
    print(f"seed {SEED} trial {trial}")
    oracle = SimulatedOracle(culprits, together=True, hazard=hazard(0.5), steps=STEPS, seed=SEED,
                             trial=trial)
    search = Bisection(edges, steps_per_run=STEPS)
    result = run(search, oracle)
    assert (result.verdict, sorted(result.minimal_set)) == ("culprit-found", sorted(culprits))
    assert result.confidence >= 0.95
    assert "reduce" in [row["step"] for row in result.evidence]
    keep, needed = result.facts[:2]
    assert (keep.kind, keep.edges) == (v.KeepOnlyDiverged.kind, tuple(culprits))
    assert (needed.kind, needed.edges) == (v.EachNeeded.kind, tuple(culprits))
    assert needed.chance <= 0.05 and min(needed.clean_without) >= 1
    # 1-minimal, shown by the runs: each member's removal only ever ran clean.
    for i, edge in enumerate(culprits):
        rest = set(culprits) - {edge}
        without = [r for mask, r in search.history if rest <= mask and edge not in mask and r.completed]
        assert len(without) == needed.clean_without[i] and not any(r.diverged for r in without)
    # Replaying the journal passes through the same reduce states.
    again = Bisection(edges, steps_per_run=STEPS)
    for mask, r in search.history:
        assert again.next_mask() == mask
        again.record(mask, r)
    assert again.result() == result


def test_a_budget_that_runs_out_in_the_reduce_stage_names_the_core_or_the_reduced_set():
    edges = from_policy("mindformers", 8).edge_ids()
    culprits = [edges[1], edges[7], edges[12]]

    def search(max_runs=None):
        oracle = SimulatedOracle(culprits, together=True, hazard=hazard(0.5), steps=STEPS, seed=SEED,
                                 trial=4)  # the reduce stage starts from all 19 edges
        # One all-off run: the drop-only check is then the last step.
        return run(Bisection(edges, steps_per_run=STEPS, max_runs=max_runs, all_off_runs=1), oracle)

    full = search()
    reduce_rows = [row for row in full.evidence if row["step"] == "reduce"]
    started = sum(row["runs"] for row in full.evidence[:full.evidence.index(reduce_rows[0])])
    # Cut short while reducing: inconclusive, the best guess is the core (it holds the set).
    cut = search(max_runs=started + 1)
    stopped = cut.facts[0]
    assert (cut.verdict, stopped.kind, stopped.reason) == ("inconclusive", v.Stopped.kind, "max-runs")
    assert set(culprits) < set(stopped.edges)
    # Cut short in the double check after the set was reduced: found, drop-only cut short.
    # (Compared with the full search, not the truth: which set a trial reduces to is the
    # business of the three-together tests.)
    drop_started = full.runs_used - full.facts[2].runs
    late = search(max_runs=drop_started + 1)
    assert (late.verdict, late.minimal_set) == ("culprit-found", full.minimal_set)
    assert late.facts[2].kind == v.DropOnlyClean.kind and late.facts[2].runs == 1


def test_no_drift_fits_a_tight_budget():
    # A quarter of 12 is under 10, so calibration_runs is 10: the search masks give way
    # to all-on as soon as the runs left only just hold the all-on runs still needed.
    search, result = search_with([], max_runs=12)
    assert (result.verdict, result.runs_used) == ("no-drift-reproduced", 12)
    assert result.facts[0].runs == 10
