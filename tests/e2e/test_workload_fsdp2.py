"""The FSDP2 reference workload, run for real: torch.distributed.run, 2 gloo ranks on CPU.

Each run is launched the way the launcher will launch it: the adapter's site
directory first on PYTHONPATH and BISECT_PREFETCH_PLAN pointing at a plan file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import rank_lines, read_probe, read_ranks, run_fsdp2, write_plan

pytest.importorskip("torch")


FAULT_EDGE = "bwd:layers.3->layers.2"
STEPS = 10  # it trains within them (its loss falls from about 4.3 to 2.8); no more is needed


def all_edges(run_dir: Path) -> list[str]:
    graph = json.loads((run_dir / "graph.rank0.json").read_text())
    return [edge["id"] for edge in graph["edges"]]


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("baseline")
    plan = write_plan(run_dir, record={"graph": True, "probe": True, "digests": "layers.*"})
    run_fsdp2(run_dir, steps=STEPS, plan=plan)
    return run_dir


def test_a_run_records_every_step_of_every_rank_and_trains(baseline):
    """The baseline's files: metrics and layer digests of every step of both ranks. That a
    second run equals it bitwise: test_fault_edge_masked_off_is_identical_to_baseline below
    (the fault's edge masked off, so a clean run) and, through `aa` with its digests,
    tests/e2e/test_aa_on_real_fsdp2.py."""
    a = read_ranks(baseline, "metrics")
    every_step = {(s, r) for s in range(1, STEPS + 1) for r in (0, 1)}
    assert len(a) == STEPS * 2 and {(r["step"], r["rank"]) for r in a} == every_step
    assert a[0]["loss"] > a[-1]["loss"]  # it trains
    digests = read_ranks(baseline, "digests")
    assert digests and all(r["param"].startswith("layers.") for r in digests)
    assert {(r["step"], r["rank"]) for r in digests} == every_step


def test_adapter_does_not_change_the_numbers(baseline, tmp_path):
    result = run_fsdp2(tmp_path, steps=STEPS, plan=None)
    assert not rank_lines(tmp_path, "metrics")
    printed = [line.split() for line in result.stdout.splitlines() if line.startswith("step ")]
    rank0 = [r for r in read_ranks(baseline, "metrics") if r["rank"] == 0]
    assert [(int(p[1]), float(p[3]), float(p[5])) for p in printed] == [
        (r["step"], r["loss"], r["grad_norm"]) for r in rank0
    ]


def test_fault_on_a_backward_edge_diverges(baseline, tmp_path):
    plan = write_plan(tmp_path)
    run_fsdp2(
        tmp_path, steps=STEPS, plan=plan,
        extra_args=("--fault-edge", FAULT_EDGE, "--fault-hazard", "1.0"),
    )  # fmt: skip
    a, b = read_ranks(baseline, "metrics"), read_ranks(tmp_path, "metrics")
    assert [(r["step"], r["rank"]) for r in a] == [(r["step"], r["rank"]) for r in b]
    assert a != b
    assert read_probe(tmp_path)["edges"][FAULT_EDGE]["issued"] == STEPS


def test_fault_edge_masked_off_is_identical_to_baseline(baseline, tmp_path):
    mask = [edge for edge in all_edges(baseline) if edge != FAULT_EDGE]
    assert len(mask) == len(all_edges(baseline)) - 1
    plan = write_plan(tmp_path, mask=mask, fault={"edge": FAULT_EDGE, "hazard": 1.0},
                      record={"graph": True, "probe": True, "digests": "layers.*"})
    run_fsdp2(tmp_path, steps=STEPS, plan=plan)  # the fault comes from the plan this time
    # A clean run again (its fault's edge never fires): bitwise the baseline, metrics and
    # every layer's digests.
    assert read_ranks(baseline, "metrics") == read_ranks(tmp_path, "metrics")
    assert read_ranks(baseline, "digests") == read_ranks(tmp_path, "digests")
    for rank in (0, 1):
        counts = read_probe(tmp_path, rank)["edges"][FAULT_EDGE]
        assert counts == {"fired": STEPS, "issued": 0, "noop": 0, "masked": STEPS,
                          "guarded": 0}
        assert all(FAULT_EDGE in step["masked"] for step in read_probe(tmp_path, rank)["steps"])


def test_tensor_parallel_mode_has_size_one_units_is_deterministic_and_its_fault_drifts(tmp_path):
    """--tp 2 on 2 ranks: DTensor MLP weights over tp, FSDP2 over a shard group of one (every
    edge's target size one), two A/A runs bitwise equal, a fault on a backward edge drifts."""
    runs = []
    for k, fault in enumerate(((), (), ("--fault-edge", FAULT_EDGE, "--fault-hazard", "1.0"))):
        run_dir = tmp_path / f"run{k}"
        plan = write_plan(run_dir, record={"graph": True, "probe": True, "digests": "*"})
        run_fsdp2(run_dir, steps=4, plan=plan, extra_args=("--tp", "2", *fault))
        runs.append(run_dir)
    graph = json.loads((runs[0] / "graph.rank0.json").read_text())
    assert graph["edges"] and {node["shard_size"] for node in graph["nodes"]} == {1}
    a, b, faulty = (read_ranks(run, "digests") for run in runs)
    assert a and a == b
    assert any(r["param"].endswith("up.weight") for r in a)  # the tp-split weights are there
    assert faulty != a
    assert read_probe(runs[2])["edges"][FAULT_EDGE]["issued"] == 4
