"""All-off runs of earlier commands (aa, a matrix cell) serve bisect --reuse as its golden run
and its first background controls, for the same experiment only, and a resumed bisect reuses
the same ones; without --reuse none is taken."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from bisect_prefetch.cli import main
from bisect_prefetch.drivers.oracle import earlier_all_off
from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.search import verdict as v
from bisect_prefetch.search.oracle import RunResult
from bisect_prefetch.search.protocol import Bisection
from tests.conftest import FAKE_JOB, write_experiment
from tests.search.test_protocol import EDGES, STEPS, run, search_with

# -- the search: reused runs are evidence, not runs of this search --------------------------------
CULPRIT = "bwd:layers.2->layers.1"


def _all_off_runs(search: Bisection) -> int:
    return sum(b.runs for b in search.blocks if not b.enabled)


def _search_reusing(clean_all_off: int) -> tuple[Bisection, v.SearchResult]:
    from bisect_prefetch.search.simulate import SimulatedOracle
    from tests.search.test_protocol import SEED, hazard

    print(f"seed {SEED} trial 1")
    search = Bisection(EDGES, steps_per_run=STEPS)
    for _ in range(clean_all_off):
        search.reuse(frozenset(), RunResult("ok", False, None, STEPS))
    oracle = SimulatedOracle([CULPRIT], hazard=hazard(0.3), steps=STEPS, seed=SEED, trial=1)
    return search, run(search, oracle)


def test_reused_all_off_runs_count_as_background_controls_not_as_runs():
    fresh, plain = search_with([CULPRIT], q=0.3, trial=1)
    some, with_some = _search_reusing(12)
    many, with_many = _search_reusing(30)
    for result in (plain, with_some, with_many):
        assert result.verdict == "culprit-found" and result.minimal_set == [CULPRIT]
        assert result.confidence >= 0.95
    assert (fresh.log.earlier, some.log.earlier, many.log.earlier) == (0, 12, 30)
    # Fewer all-off runs of its own; with enough reused, none: the controls were there.
    assert _all_off_runs(fresh) == 7 and _all_off_runs(some) == 3 and _all_off_runs(many) == 0
    assert plain.runs_used > with_some.runs_used > with_many.runs_used
    background = with_many.facts[-1]
    assert background.kind == v.BackgroundRuledOut.kind and background.runs >= 30
    # Not runs of this search: neither its run count nor its evidence rows hold them.
    assert many.runs_used == sum(b.runs for b in many.blocks)


def test_a_reused_run_that_diverged_counts_against_the_answer():
    search = Bisection(EDGES, steps_per_run=STEPS)
    search.reuse(frozenset(), RunResult("stopped-early", True, 7, 7))
    assert search.log.tally(frozenset()).divergences == 1 and search.runs_used == 0


def test_runs_are_reused_only_before_the_search_runs_and_only_completed():
    search = Bisection(EDGES, steps_per_run=STEPS)
    with pytest.raises(BisectPrefetchError, match="completed"):
        search.reuse(frozenset(), RunResult("error", steps=0))
    search.record(search.next_mask(), RunResult("ok", False, None, STEPS))
    with pytest.raises(BisectPrefetchError, match="before the search"):
        search.reuse(frozenset(), RunResult("ok", False, None, STEPS))


# -- which journal records are reused ---------------------------------------------------------------
FP = "c0de@e4e4"


def _record(run_id, *, variant="aa", fp=FP, mask=(), steps=8, guard="none", reference=None,
            outcome="ok", first_diff_step=None, stress=False):
    record = {"variant": f"{variant}+{fp}", "mask": list(mask), "steps": steps, "guard": guard,
              "index": 0, "attempt": 0, "run_id": run_id, "outcome": outcome,
              "reference": reference, "first_diff_step": first_diff_step,
              "steps_done": first_diff_step or steps, "reason": ""}
    if stress:
        record["stress"] = True
    return record


def _earlier(records, **kw):
    return earlier_all_off(records, own="search", fingerprint=FP,
                           **{"steps": 8, "guard": "none", "stress": False, **kw})


def test_the_golden_run_is_the_first_of_the_group_the_others_were_compared_with():
    records = [
        _record("1-aa-k0"), _record("2-aa-k1", reference="1-aa-k0"),
        _record("3-aa-k2", reference="1-aa-k0", outcome="stopped-early", first_diff_step=5),
        # another group: its first run, and a run compared with it (not with the golden run)
        _record("4-cell-k0", variant="matrix:off"),
        _record("5-cell-k1", variant="matrix:off", reference="4-cell-k0"),
        _record("6-aa-k3", reference="1-aa-k0", outcome="error"),  # failed: never evidence
    ]
    earlier = _earlier(records)
    assert earlier.golden == "1-aa-k0"
    assert [out.run_id for out in earlier.controls] == ["2-aa-k1", "3-aa-k2"]
    assert [out.result().diverged for out in earlier.controls] == [False, True]
    assert earlier.runs == 3
    # A tie goes to the first group.
    assert _earlier(records[3:5] + records[:2]).golden == "4-cell-k0"


@pytest.mark.parametrize("other", [
    {"fp": "edited@e4e4"}, {"fp": "c0de@other"}, {"steps": 6}, {"guard": "size-one"},
    {"stress": True}, {"mask": ["bwd:layers.1->layers.0"]},
])
def test_runs_of_another_experiment_or_setting_are_not_reused(other):
    records = [_record("1-aa-k0", **other), _record("2-aa-k1", reference="1-aa-k0", **other)]
    earlier = _earlier(records)
    assert earlier.golden is None and earlier.controls == [] and earlier.runs == 0


def test_only_records_before_the_searchs_own_first_run_count():
    records = [_record("1-aa-k0"), _record("2-aa-k1", reference="1-aa-k0"),
               _record("3-search", variant="search", mask=["fwd:layers.0->layers.1"],
                       reference="1-aa-k0"),
               _record("4-aa-k0"), _record("5-aa-k1", reference="1-aa-k0")]
    earlier = _earlier(records)
    assert earlier.golden == "1-aa-k0" and [o.run_id for o in earlier.controls] == ["2-aa-k1"]
    # The search's own golden run (it launched one) ends the earlier runs too.
    assert _earlier([_record("1-search-golden", variant="search-golden"),
                     _record("2-aa-k0")]).golden is None


# -- a user's job: aa, then bisect ----------------------------------------------------------------------
def _job(tmp_path: Path) -> Path:
    """The stand-in job, copied: a test may edit its code."""
    job = tmp_path / "job.py"
    shutil.copy(FAKE_JOB, job)
    return job


def _cli(*argv: str) -> int:
    return main([str(a) for a in argv])


def _bisect(exp: Path, state: Path, out: Path, *extra: str) -> dict:
    assert _cli("bisect", exp, "--state-dir", state, "--json", out, *extra) == 1
    return json.loads(out.read_text())


def _launched_all_off(data: dict) -> int:
    return sum(1 for d in data["run_details"] if d["mask"] == [] and not d["reused"])


def test_aa_all_off_runs_serve_a_later_bisect_and_a_resume_reuses_the_same(tmp_path, capsys):
    exp = write_experiment(tmp_path, [sys.executable, str(_job(tmp_path))])
    state = tmp_path / "state"
    assert _cli("aa", exp, "--mask", "all-off", "--runs", "3", "--state-dir", state) == 0
    capsys.readouterr()
    first = _bisect(exp, state, tmp_path / "first.json", "--reuse")
    said = capsys.readouterr().out
    assert ("  -> reused 3 all-off runs of earlier commands as the golden run and background "
            "controls (golden 0001-aa-k0)") in said
    assert first["verdict"] == "culprit-found"
    assert first["minimal_set"] == ["bwd:layers.1->layers.0"]
    assert first["earlier_all_off"] == [{"golden": "0001-aa-k0",
                                         "controls": ["0002-aa-k1", "0003-aa-k2"]}]
    # The same bisect without the aa runs: a golden run and more all-off runs of its own.
    fresh = _bisect(exp, tmp_path / "fresh", tmp_path / "fresh.json")
    assert fresh["earlier_all_off"] == [{"golden": None, "controls": []}]
    assert _launched_all_off(first) < _launched_all_off(fresh) + 1  # + 1: fresh's golden run
    assert first["runs_launched"] < fresh["runs_launched"]
    # Resumed: the same earlier runs, the same decisions, nothing launched.
    again = _bisect(exp, state, tmp_path / "again.json", "--resume", "--reuse")
    assert again["runs_launched"] == 0
    assert again["earlier_all_off"] == first["earlier_all_off"]
    assert again["evidence"] == first["evidence"]
    assert again["confidence"] == first["confidence"]


@pytest.mark.parametrize("change", ["edited code", "other steps", "no --reuse"])
def test_all_off_runs_of_another_experiment_are_not_reused(tmp_path, capsys, change):
    job = _job(tmp_path)
    exp = write_experiment(tmp_path, [sys.executable, str(job), "clean", "--steps={steps}"])
    state = tmp_path / "state"
    steps = ["--steps", "6"] if change == "other steps" else []
    assert _cli("aa", exp, "--mask", "all-off", "--runs", "2", "--state-dir", state, *steps) == 0
    if change == "edited code":
        job.write_text(job.read_text() + "\n# edited\n")
    capsys.readouterr()
    reuse = [] if change == "no --reuse" else ["--reuse"]
    data = _bisect(exp, state, tmp_path / "out.json", "--max-runs", "2", *reuse)  # the golden run is enough
    assert "all-off runs of earlier commands" not in capsys.readouterr().out
    assert data["earlier_all_off"] == [{"golden": None, "controls": []}]


def test_an_all_off_matrix_cell_serves_a_later_bisect(tmp_path, capsys):
    exp = write_experiment(tmp_path, [sys.executable, str(_job(tmp_path))])
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text("experiment: exp.yaml\n"
                      "cells: [{name: quiet, mask: all-off, runs: 2, expect: consistent}]\n")
    state = tmp_path / "state"
    assert _cli("matrix", matrix, "--state-dir", state) == 0
    capsys.readouterr()
    data = _bisect(exp, state, tmp_path / "out.json", "--max-runs", "2", "--reuse")
    assert "reused 2 all-off runs of earlier commands" in capsys.readouterr().out
    [earlier] = data["earlier_all_off"]
    assert earlier["golden"].endswith("matrix_quiet-k0") and len(earlier["controls"]) == 1
    assert not any(d["mask"] == [] for d in data["run_details"])  # no golden run launched


def test_under_stress_auto_the_controls_come_before_the_calibration_runs(tmp_path):
    """The calibration's all-on runs are the search's first: earlier controls are taken
    when each setting's oracle is made, before its first run."""
    import io

    from bisect_prefetch.commands import bisect as bisect_command
    from bisect_prefetch.drivers.oracle import Earlier
    from bisect_prefetch.runs.outcome import RunOutcome
    from tests.commands.test_stress import _simulated_experiment, _StressOracle
    from tests.conftest import console

    class Reusing(_StressOracle):
        def reuse_earlier(self):
            clean = RunOutcome(run_id="0002-aa-k1", outcome="ok", reason="", steps_done=20)
            return Earlier("0001-aa-k0", [clean, clean]) if self.stress else Earlier()

    experiment = _simulated_experiment(tmp_path, layers=4, last_line="stress: {mode: auto}")
    out = io.StringIO()
    bisect_command.bisect(
        experiment, confidence=None, max_runs=None, resume=False, state_dir=tmp_path / "state",
        console=console(out), json_out=tmp_path / "out.json",
        oracle_for=lambda opened, *, stress=False: Reusing(
            opened, culprit="fwd:layers.1->layers.2", hazard=0.3 if stress else 0.01,
            stress=stress))
    data = json.loads((tmp_path / "out.json").read_text())
    assert data["stress"]["used"] is True and data["verdict"] == "culprit-found"
    assert data["earlier_all_off"] == [{"golden": "0001-aa-k0",
                                        "controls": ["0002-aa-k1", "0002-aa-k1"]}]
    assert "reused 3 all-off runs of earlier commands" in out.getvalue()
