"""Stress: delays before prefetches are issued (adapters/stress.py), the choice to use them
(search/stress.py), how commands carry and say them. On real FSDP2 runs:
tests/e2e/test_stress_on_real_fsdp2.py."""

from __future__ import annotations

import io
import json
import math
import random
import re
import textwrap
from pathlib import Path

import pytest

from bisect_prefetch.adapters.plan import PlanError, parse_plan
from bisect_prefetch.adapters.stress import HIGH, LOW, Stress
from bisect_prefetch.commands import bisect as bisect_command
from bisect_prefetch.commands.bisect_words import stress_choice_words
from bisect_prefetch.drivers.oracle import Earlier
from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.experiment import load_experiment, with_stress
from bisect_prefetch.judge.signals import describe_stress
from bisect_prefetch.runs.outcome import RunOutcome
from bisect_prefetch.search.oracle import AnswersAtOnce, Finished
from bisect_prefetch.search.stress import Hazard, choose_stress
from tests.conftest import console


# -- the adapter's delays ------------------------------------------------------------------
class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _stress(**kw) -> tuple[Stress, _Clock, list[float]]:
    clock, slept = _Clock(), []
    stress = Stress(measure_steps=2, clock=clock, sleep=slept.append,
                    entropy=random.Random(7), **kw)
    return stress, clock, slept


def _step(stress: Stress, clock: _Clock, step: int, gap: float) -> None:
    """One step: the edge issues, its target is used gap seconds later."""
    stress.before_issue("fwd:layers.0->layers.1")
    stress.issued("fwd:layers.0->layers.1", "layers.1", "fwd")
    clock.now += gap
    stress.used("layers.1", "fwd")
    clock.now += 1.0
    stress.end_step(step)


def test_delays_start_after_the_measured_gap_and_stay_in_its_range():
    stress, clock, slept = _stress()
    for step in (1, 2):
        _step(stress, clock, step, 0.010)
    assert slept == []  # nothing is delayed while the gap is measured
    for step in range(3, 203):
        _step(stress, clock, step, 0.010)
    assert len(slept) == 200
    assert all(0.010 * LOW <= d <= 0.010 * HIGH for d in slept)
    # log-uniform: the median delay sits at the geometric middle of the range
    median = sorted(slept)[100]
    assert abs(math.log(median) - math.log(0.010 * math.sqrt(LOW * HIGH))) < 0.4
    record = stress.record()
    assert record["delays"] == 200
    edge = record["edges"]["fwd:layers.0->layers.1"]
    assert edge["gap_source"] == "measured" and edge["gap_ms"] == pytest.approx(10.0)
    assert record["notes"] == []


def test_an_edge_with_no_measured_gap_gets_the_default_and_a_note():
    stress, clock, slept = _stress(default_gap_ms=4.0)
    for step in (1, 2):
        stress.end_step(step)
    stress.before_issue("bwd:layers.1->layers.0")
    assert 0.004 * LOW <= slept[0] <= 0.004 * HIGH
    record = stress.record()
    assert record["default_gap_edges"] == ["bwd:layers.1->layers.0"]
    assert record["edges"]["bwd:layers.1->layers.0"]["gap_source"] == "default"
    line = describe_stress({**record, "ranks": 1})
    assert "no issue-to-use gap measured for bwd:layers.1->layers.0" in line


def test_a_synchronous_prefetch_is_not_delayed_and_is_said():
    stress, clock, slept = _stress()
    stress.no_window("fwd:layers.0->layers.1")
    for step in range(1, 6):
        _step(stress, clock, step, 0.010)
    assert slept == []
    record = stress.record()
    assert record["no_window_edges"] == ["fwd:layers.0->layers.1"]
    assert describe_stress({**record, "ranks": 2}).startswith("stress: no window to widen")


def test_the_plan_carries_stress():
    base = {"version": 1, "mask": None}
    assert parse_plan(base).stress is None
    plan = parse_plan({**base, "stress": {"measure_steps": 3, "default_gap_ms": 5}})
    assert plan.stress == {"measure_steps": 3, "default_gap_ms": 5.0}
    for bad in ({"measure_steps": 0}, {"default_gap_ms": -1}, {"where": 1}, "on"):
        with pytest.raises(PlanError):
            parse_plan({**base, "stress": bad})


# -- the choice -------------------------------------------------------------------------------
def test_stress_is_used_only_where_it_raises_the_hazard():
    without = Hazard.of([None, 9, None, 14], steps=20)
    raised = Hazard.of([2, 1, 3, 2], steps=20)
    lowered = Hazard.of([None, None, None, None], steps=20)
    assert choose_stress(without, raised).use
    assert choose_stress(without, raised).chance_raised > 0.99
    assert not choose_stress(without, lowered).use
    assert not choose_stress(lowered, lowered).use  # not shown to raise it: not used
    assert raised.per_run_chance() > 0.95
    low, high = without.per_run_interval()
    assert low < without.per_run_chance() < high


def test_stress_choice_words():
    choice = choose_stress(Hazard.of([None, 9, None, 14], steps=20),
                           Hazard.of([2, 1, 3, 2], steps=20))
    words = stress_choice_words(choice)
    assert words.startswith("stress raises the per-run chance from 0.")
    assert words.count("95% interval") == 2 and "; using it" in words


# -- experiments and bad input ------------------------------------------------------------------
def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "exp.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def _simulated_experiment(tmp_path: Path, *, layers: int, last_line: str) -> Path:
    """The experiment a simulated oracle stands in for (its command never runs)."""
    return _write(tmp_path, f"""
        name: sim
        command: [python, -c, "pass", "{{steps}}"]
        metrics: {{format: jsonl, names: [loss]}}
        graph: {{source: static, policy: fsdp2-chain, layers: {layers}}}
        steps: 20
        {last_line}
    """)


@pytest.mark.parametrize("word, mode", [("off", "off"), ("on", "on"), ("auto", "auto")])
def test_stress_mode_in_the_file(tmp_path, word, mode):
    exp = load_experiment(_write(tmp_path, f"""
        name: x
        workload: {{builtin: fsdp2}}
        stress: {{mode: {word}}}
    """))
    assert exp.stress.mode == mode


def test_an_engine_that_cannot_take_stress_is_one_line(tmp_path):
    with pytest.raises(BisectPrefetchError) as info:
        load_experiment(_write(tmp_path, """
            name: x
            workload: {builtin: mindformers}
            stress: {mode: on}
        """))
    assert "graph mode" in str(info.value) and "\n" not in str(info.value)
    exp = load_experiment(_write(tmp_path, """
        name: x
        command: [a]
        graph: {source: static, policy: mindformers, layers: 2}
    """))
    with pytest.raises(BisectPrefetchError, match="--stress auto: stress: a static mindformers"):
        with_stress(exp, "auto")


# -- bisect --stress auto against simulated runs ------------------------------------------------
class _StressOracle(AnswersAtOnce):
    """Simulated runs, journaled as the real oracle does: the culprit's runs diverge at a
    per-step hazard that stress raises; every other run is clean."""

    def __init__(self, opened, *, culprit: str, hazard: float, stress: bool) -> None:
        self.runner, self.stress = opened.runner, stress
        self.culprit, self.hazard = culprit, hazard
        self.random = random.Random(3 + stress)
        self.requests: dict = {}
        self.runs_launched = self.runs_reused = 0
        self.golden_steps = 20

    def reuse_earlier(self):
        return Earlier()  # no aa or matrix runs before these searches

    def run_golden(self, steps=None) -> str:
        return self._run(frozenset(), "search-golden").run_id

    def request(self, mask) -> None:
        out = self._run(mask, "search")
        self._answered().append(Finished(mask, out.result(), outcome=out, stress=self.stress))

    def _run(self, mask, purpose):
        index = self.requests.get((mask, purpose), 0)
        self.requests[(mask, purpose)] = index + 1
        key = self.runner.key(purpose, mask=mask, guard="none", steps=20, index=index,
                              stress=self.stress)
        first = None
        if self.culprit in mask:
            first = next((k for k in range(1, 21) if self.random.random() < self.hazard), None)
        run_id, _ = self.runner.state.new_run_dir("sim")
        out = RunOutcome(run_id=run_id, outcome="stopped-early" if first else "ok", reason="",
                         first_diff_step=first, steps_done=first or 20, wall_s=0.25)
        out.step_time_ms = 30.0 if self.stress else 10.0
        self.runner.state.append(key, out.to_record())
        self.runs_launched += 1
        return out

    def deterministic_masks(self):
        return []


def test_bisect_stress_auto_uses_stress_where_it_raises_the_chance(tmp_path):
    culprit = "fwd:layers.1->layers.2"
    experiment = _simulated_experiment(tmp_path, layers=4, last_line="stress: {mode: auto}")
    made = []

    def oracle_for(opened, *, stress=False):
        made.append(stress)
        return _StressOracle(opened, culprit=culprit, hazard=0.3 if stress else 0.01,
                             stress=stress)

    out = io.StringIO()
    code = bisect_command.bisect(experiment, confidence=None, max_runs=None, resume=False,
                                 state_dir=tmp_path / "state", console=console(out),
                                 json_out=tmp_path / "out.json", oracle_for=oracle_for)
    text = out.getvalue()
    data = json.loads((tmp_path / "out.json").read_text())
    assert code == 1 and data["verdict"] == "culprit-found"
    assert data["minimal_set"] == [culprit]
    assert "checking whether stress makes drift show more often" in text
    # the first pair settles it: a stressed divergence at step 1 beside a clean run
    assert "  -> settled after 1 pair (chance it raises the hazard at least 0.95): " in text
    assert "stress raises the per-run chance from" in text and "; using it" in text
    assert data["stress"]["mode"] == "auto" and data["stress"]["used"] is True
    assert data["stress"]["chance_with"]["per_run_chance"] > data["stress"]["chance_without"][
        "per_run_chance"]
    assert made == [False, True]
    assert "stress: on (--stress auto); every run the verdict counts ran with stress on" in text
    assert "(x3.00)" in text
    # "run N" is counted one way: the calibration's run lines of both settings count too.
    assert_runs_named_by_their_lines(text)


def assert_runs_named_by_their_lines(text: str) -> None:
    """Every "diverged at run N (step S)" and "diverged (run N, step S)" names run line N,
    which says "diverged at step S"."""
    said = dict(re.findall(r"^    run (\d+) \(.*?: diverged at step (\d+)", text, re.M))
    named = (re.findall(r"diverged at run (\d+) \(step (\d+)\)", text)
             + re.findall(r"diverged \(run (\d+), step (\d+)\)", text))
    assert named
    for run, step in named:
        assert said.get(run) == step, (run, step)


def _bisect_without_drift(tmp_path, stress: str) -> tuple[str, dict]:
    """bisect of a simulated job that never drifts, with --stress `stress`: its text and JSON."""
    experiment = _simulated_experiment(tmp_path, layers=2, last_line="search: {max_runs: 12}")
    out = io.StringIO()
    bisect_command.bisect(
        experiment, confidence=None, max_runs=None, resume=False, state_dir=tmp_path / "state",
        console=console(out), json_out=tmp_path / "out.json", stress=stress,
        oracle_for=lambda opened, stress=False: _StressOracle(
            opened, culprit="none", hazard=0.0, stress=stress))
    return out.getvalue(), json.loads((tmp_path / "out.json").read_text())


def test_no_drift_under_stress_is_checked_without_stress(tmp_path):
    text, data = _bisect_without_drift(tmp_path, "on")
    assert data["verdict"] == "no-drift-reproduced"
    assert "searching again without stress" in text
    assert data["stress"]["unstressed_search"]["verdict"] == "no-drift-reproduced"


def test_a_calibration_that_sees_no_drift_stops_at_its_cap_and_says_so(tmp_path):
    text, data = _bisect_without_drift(tmp_path, "auto")
    assert "  -> not settled after 4 pairs, the most it runs; the likelier side taken: stress " \
           "does not raise the per-run chance" in text
    assert data["stress"]["used"] is False
    assert data["stress"]["chance_with"]["runs"] == data["stress"]["chance_without"]["runs"] == 4


def test_no_drift_without_stress_says_how_to_look_harder(tmp_path):
    """A clean build without stress only rules out drift above a chance; a rarer race can hide,
    and the verdict says how to look for one. Under stress it has already looked."""
    experiment = _simulated_experiment(tmp_path, layers=2, last_line="search: {max_runs: 12}")
    said = {}
    for mode in ("off", "on"):
        out = io.StringIO()
        bisect_command.bisect(
            experiment, confidence=None, max_runs=None, resume=False,
            state_dir=tmp_path / f"state-{mode}", console=console(out),
            json_out=tmp_path / f"{mode}.json", stress=mode,
            oracle_for=lambda opened, stress=False: _StressOracle(
                opened, culprit="none", hazard=0.0, stress=stress))
        assert json.loads((tmp_path / f"{mode}.json").read_text())["verdict"] == "no-drift-reproduced"
        said[mode] = out.getvalue()
    hint = "can still hide: for a prefetch race, --stress auto checks"
    assert hint in said["off"] and hint not in said["on"]


# -- simulate ----------------------------------------------------------------------------------
def test_simulate_says_when_stress_pays():
    from bisect_prefetch.simulation.trials import simulate

    kw = dict(hazard=0.02, steps=20, trials=3, seed=1)
    pays = simulate("fsdp2-chain", 3, ["fwd:layers.0->layers.1"], stress_factor=20,
                    stress_cost=1.5, **kw)["stress"]
    assert pays["used"] and pays["pays"]
    assert pays["runs_median_with"] < pays["runs_median_without"]
    too_dear = simulate("fsdp2-chain", 3, ["fwd:layers.0->layers.1"], stress_factor=20,
                        stress_cost=50, **kw)["stress"]
    assert too_dear["used"] and not too_dear["pays"]
    hides = simulate("fsdp2-chain", 3, ["fwd:layers.0->layers.1"], stress_factor=0.5, **kw)
    assert not hides["stress"]["used"] and not hides["stress"]["pays"]


def test_matrix_cells_take_stress_from_overrides_and_the_command_line(tmp_path):
    from bisect_prefetch.commands.matrix import cell_request
    from bisect_prefetch.experiment import load_matrix

    path = tmp_path / "m.yaml"
    path.write_text(textwrap.dedent("""
        experiment: {name: x, workload: {builtin: fsdp2}}
        cells:
          - {name: plain, mask: all-on, runs: 2, expect: consistent}
          - {name: stressed, mask: all-on, runs: 2, expect: consistent,
             overrides: {stress.mode: on}}
    """))
    matrix = load_matrix(path)
    plain, stressed = matrix.cells
    assert cell_request(matrix, plain).experiment.stress.mode == "off"
    assert cell_request(matrix, stressed).experiment.stress.mode == "on"
    assert cell_request(matrix, plain, "auto").experiment.stress.mode == "auto"
