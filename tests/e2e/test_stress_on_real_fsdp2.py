"""Stress on real FSDP2 runs (2 CPU ranks): delays change no number on a job without a race
(asynchronous prefetches with every wait in place; compute_ms only adds time), a synchronous
job has no window to widen, and the race workload diverges under stress. How commands carry
and say stress, and `bisect --stress auto` choosing it where it raises the chance (against
simulated runs): tests/commands/test_stress.py."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from bisect_prefetch.cli import main
from tests.conftest import read_ranks


def _fsdp2_experiment(tmp_path: Path, name: str, workload: str, *, steps: int) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(textwrap.dedent(f"""
        name: {name}
        workload: {{builtin: fsdp2, world_size: 2, {workload}}}
        metrics: {{format: jsonl, names: [loss, grad_norm]}}
        steps: {steps}
        timeout_s: 300
        no_progress_timeout_s: 120
    """))
    return path


def _aa(tmp_path: Path, experiment: Path, *args: str) -> dict:
    out = tmp_path / "aa.json"
    out.unlink(missing_ok=True)
    main(["aa", str(experiment), "--state-dir", str(tmp_path / "state"), "--json", str(out),
          *args])
    return json.loads(out.read_text())


def _digests(tmp_path: Path, name: str, run_id: str) -> dict:
    rows = read_ranks(tmp_path / "state" / name / "runs" / run_id, "digests")
    return {(r["step"], r["rank"], r["param"]): r["digest"] for r in rows}


# The asynchronous job without a race: one plain all-on A/A group, the reference of the two
# tests below (which only read it).
ASYNC, ASYNC_STEPS = "layers: 3, async_unshard: true", 6


@pytest.fixture(scope="module")
def async_reference(tmp_path_factory) -> dict:
    """The plain group's digests (its first run's), every step of every rank."""
    folder = tmp_path_factory.mktemp("async-plain")
    experiment = _fsdp2_experiment(folder, "async", ASYNC, steps=ASYNC_STEPS)
    plain = _aa(folder, experiment, "--runs", "2", "--mask", "all-on")
    assert plain["verdict"] == "consistent" and plain["stress"] == "off"
    reference = _digests(folder, "async", plain["run_details"][0]["run_id"])
    assert reference
    return reference


def test_stress_on_a_job_without_a_race_changes_no_number(tmp_path, async_reference):
    """Asynchronous prefetches with every wait in place: stress delays them and every
    digest of all-on and all-off stays what it is without stress."""
    name = "async"
    experiment = _fsdp2_experiment(tmp_path, name, ASYNC, steps=ASYNC_STEPS)
    for mask in ("all-on", "all-off"):
        stressed = _aa(tmp_path, experiment, "--runs", "2", "--mask", mask, "--stress", "on")
        assert stressed["verdict"] == "consistent" and stressed["stress"] == "on"
        for run in stressed["run_details"]:
            assert _digests(tmp_path, name, run["run_id"]) == async_reference
        if mask == "all-on":
            record = stressed["signals"]["stress"]
            assert record["delays"] > 0 and not record["no_window_edges"]


def test_compute_ms_changes_timing_and_no_number(tmp_path, async_reference):
    """workload.compute_ms: an all-on A/A without the fault stays bitwise identical, and
    equal to the same job without it; only the step time grows (each layer's forward
    sleeps: 3 layers x 100 ms a step at least)."""
    timed = _fsdp2_experiment(tmp_path, "timed", ASYNC + ", compute_ms: 100", steps=ASYNC_STEPS)
    result = _aa(tmp_path, timed, "--runs", "2", "--mask", "all-on")
    assert result["verdict"] == "consistent"
    for run in result["run_details"]:
        assert _digests(tmp_path, "timed", run["run_id"]) == async_reference
    slow = [run["step_time_ms"] for run in result["run_details"]]
    assert all(t is not None and t >= 300 for t in slow), slow


def test_stress_on_a_synchronous_job_says_it_has_no_window(tmp_path, capsys):
    experiment = _fsdp2_experiment(tmp_path, "sync", "layers: 2", steps=4)
    result = _aa(tmp_path, experiment, "--runs", "2", "--stress", "on")
    assert result["verdict"] == "consistent"
    assert result["signals"]["stress"]["delays"] == 0
    assert "stress: no window to widen" in capsys.readouterr().out


def test_the_race_workload_diverges_under_stress(tmp_path):
    experiment = _fsdp2_experiment(
        tmp_path, "race", 'layers: 4, dim: 64, batch: 384, '
        'fault: {edge: "fwd:layers.1->layers.2", mode: race}', steps=12)
    result = _aa(tmp_path, experiment, "--runs", "4", "--stress", "on")
    assert result["verdict"] == "diverged" and result["stress"] == "on"


