"""The audit's kinds of suspect edge, planted in real runs of the reference workloads.

The runs are short: 4 layers, the audit's 2 steps. Each planted kind must
be found on the planted edge, and nothing that fails the audit anywhere else; `bisect`
starts from the suspects of its discovery run's audit. The kinds from order records alone:
tests/commands/test_audit_kinds.py. MindSpore's size-one kind (every edge at world size one,
none at two): tests/e2e/test_mindspore_workload_under_msrun.py, on the runs it shares.
"""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from bisect_prefetch.commands.audit import run_audit
from tests.conftest import failing_findings


def kinds_by_edge(result: dict) -> set[tuple[str, str]]:
    return {(f["kind"], f["edge"]) for f in result["findings"]}


def audit_workload(tmp_path, name: str, workload: dict) -> dict:
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps({"name": name, "workload": workload, "steps": 2}))
    console = Console(file=io.StringIO(), width=200)
    return run_audit(path, guard=None, state_dir=tmp_path / "state", console=console)


FSDP2 = {"builtin": "fsdp2", "layers": 4, "world_size": 2}


def test_fsdp2_plain_chain_and_activation_checkpointing_have_no_findings(tmp_path):
    pytest.importorskip("torch")
    assert audit_workload(tmp_path, "plain", FSDP2)["findings"] == []
    # torch 2.13 FSDP2 does not re-append the forward order on recompute: nothing wasted.
    result = audit_workload(tmp_path, "ckpt", {**FSDP2, "checkpoint": True})
    assert result["findings"] == [] and result["ok"]


def test_fsdp2_prefetch_depth_two_shadows_and_duplicates(tmp_path):
    pytest.importorskip("torch")
    result = audit_workload(tmp_path, "depth2", {**FSDP2, "backward_prefetch_depth": 2})
    shadowed = {(f["edge"], f["shadowed_by"]) for f in result["findings"]
                if f["kind"] == "shadowed"}
    assert shadowed == {("bwd:layers.1->layers.0", "bwd:layers.2->layers.0"),
                        ("bwd:layers.2->layers.1", "bwd:layers.3->layers.1")}
    duplicates = {f["edge"] for f in result["findings"] if f["kind"] == "duplicate-target"}
    assert duplicates == {"bwd:layers.1->layers.0", "bwd:layers.2->layers.0",
                          "bwd:layers.2->layers.1", "bwd:layers.3->layers.1"}
    assert failing_findings(result) == set() and result["ok"]


def test_fsdp2_mistargeted_backward_edge_is_never_consumed(tmp_path):
    pytest.importorskip("torch")
    edge = "bwd:layers.1->layers.2"  # layers.2's backward already ran
    result = audit_workload(tmp_path, "mis", {**FSDP2, "extra_edges": [edge]})
    assert failing_findings(result) == {("never-consumed", edge)} and not result["ok"]
    finding = next(f for f in result["findings"] if f["kind"] == "never-consumed")
    assert finding["steps"] == [1, 2] and finding["ranks"] == [0, 1]
    assert {f["kind"] for f in result["findings"]} == {"never-consumed", "duplicate-target"}


def test_fsdp2_prefetch_into_an_unsharded_root_is_late(tmp_path):
    pytest.importorskip("torch")
    edge = "bwd:layers.0->root"  # the root unsharded itself (and was used) in backward first
    result = audit_workload(tmp_path, "late", {**FSDP2, "extra_edges": [edge]})
    assert kinds_by_edge(result) == {("late", edge)} and not result["ok"]


def test_fsdp2_world_size_one_makes_every_edge_size_one(tmp_path):
    pytest.importorskip("torch")
    result = audit_workload(tmp_path, "ws1", {**FSDP2, "world_size": 1})
    edges = {e["id"] for e in result["edges"]}
    assert len(edges) == 7
    assert kinds_by_edge(result) == {("size-one", e) for e in edges}


def test_bisect_takes_the_suspects_from_the_audit_of_its_discovery_run(tmp_path):
    pytest.importorskip("torch")
    from bisect_prefetch.commands.bisect import audit_suspects
    from bisect_prefetch.experiment import load_experiment
    from bisect_prefetch.runs.state import open_state

    edge = "bwd:layers.1->layers.2"
    path = tmp_path / "e.yaml"
    path.write_text(json.dumps({"name": "sus", "steps": 2,
                                "workload": {**FSDP2, "extra_edges": [edge]}}))
    out = io.StringIO()
    console = Console(file=out, width=200)
    with open_state(load_experiment(path), tmp_path / "state", console=console) as opened:
        assert edge in opened.graph().edge_ids()
        assert audit_suspects(opened, console) == [edge]
    assert (f"audit of the discovery run: 1 suspect edge(s) (never-consumed): {edge}; "
            "the search starts with more weight on them") in out.getvalue()
