"""The audit's kinds of suspect edge: from order records (pure), then planted in real runs.

The real runs are short: 4 layers (2 for MindSpore), the audit's 2 steps.
Each planted kind must be found on the planted edge, and nothing that fails
the audit anywhere else.
"""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from bisect_prefetch.commands.audit import finding_lines, run_audit, verdict_lines
from bisect_prefetch.judge.audit import FAILING_KINDS, audit, audit_run_dir

A, B, C = "layers.0", "layers.1", "layers.2"


def graph(*edges: str, shard_size: int = 2) -> dict:
    nodes = [{"name": n, "kind": "layer", "order": i, "shard_size": shard_size}
             for i, n in enumerate((A, B, C))]
    out = []
    for edge in edges:
        phase, pair = edge.split(":")
        src, dst = pair.split("->")
        out.append({"id": edge, "phase": phase, "src": src, "dst": dst})
    return {"nodes": nodes, "edges": out}


def step(*events, step=1, rank=0) -> dict:
    return {"step": step, "rank": rank, "events": [list(e) for e in events]}


def kinds_by_edge(result: dict) -> set[tuple[str, str]]:
    return {(f["kind"], f["edge"]) for f in result["findings"]}


# -- pure: order records ---------------------------------------------------------------
def test_a_consumed_prefetch_is_no_finding():
    e = f"fwd:{A}->{B}"
    order = [step(("unshard", A, "self"), ("use", A, "fwd"), ("prefetch", e, "issued"),
                  ("unshard", B, e), ("reshard", A), ("use", B, "fwd"), ("reshard", B))]
    result = audit(graph(e), [], order)
    assert result["findings"] == [] and result["ok"] and result["order_recorded"]


def test_shadowed_names_the_edge_that_unsharded_first():
    first, second = f"bwd:{C}->{A}", f"bwd:{B}->{A}"
    order = [step(("prefetch", first, "issued"), ("unshard", A, first), ("use", B, "bwd"),
                  ("prefetch", second, "noop"), ("use", A, "bwd"), step=2, rank=1)]
    result = audit(graph(first, second), [], order)
    shadowed = [f for f in result["findings"] if f["kind"] == "shadowed"]
    assert [(f["edge"], f["shadowed_by"], f["steps"], f["ranks"]) for f in shadowed] == [
        (second, first, [2], [1])]
    assert kinds_by_edge(result) == {("shadowed", second), ("duplicate-target", first),
                                     ("duplicate-target", second)}
    assert result["ok"]  # notes only


def test_late_when_the_target_unsharded_itself_first():
    e = f"fwd:{A}->{B}"
    order = [step(("unshard", B, "self"), ("use", B, "fwd"), ("prefetch", e, "noop"))]
    result = audit(graph(e), [], order)
    assert kinds_by_edge(result) == {("late", e)} and not result["ok"]


def test_a_backward_prefetch_into_a_unit_still_unsharded_from_forward_is_no_waste():
    # reshard_after_forward off: B keeps its forward unshard into backward; the backward
    # prefetch finds it unsharded and does nothing. A no-op note, not "late".
    e = f"bwd:{A}->{B}"
    order = [step(("unshard", B, "self"), ("use", B, "fwd"), ("use", A, "bwd"),
                  ("prefetch", e, "noop"), ("use", B, "bwd"), ("reshard", B))]
    result = audit(graph(e), [], order)
    assert kinds_by_edge(result) == {("no-op", e)} and result["ok"]
    [finding] = result["findings"]
    assert "still unsharded from its fwd use" in finding["evidence"]
    # ... while a target that unsharded itself for the edge's own phase is late.
    late = [step(("unshard", B, "self"), ("use", B, "bwd"), ("prefetch", e, "noop"))]
    assert kinds_by_edge(audit(graph(e), [], late)) == {("late", e)}


def test_never_consumed_when_resharded_or_used_only_in_the_other_phase():
    e = f"bwd:{A}->{B}"
    resharded = step(("prefetch", e, "issued"), ("unshard", B, e), ("reshard", B))
    other_phase = step(("prefetch", e, "issued"), ("unshard", B, e), ("use", B, "fwd"), step=2)
    pending = step(("prefetch", e, "issued"), ("unshard", B, e), step=3)
    result = audit(graph(e), [], [resharded, other_phase, pending])
    [finding] = result["findings"]
    assert (finding["kind"], finding["edge"], finding["steps"]) == ("never-consumed", e, [1, 2, 3])
    assert not result["ok"]


def test_a_plain_no_op_and_the_kinds_option():
    e = f"fwd:{A}->{B}"
    order = [step(("prefetch", e, "noop"))]
    assert kinds_by_edge(audit(graph(e), [], order)) == {("no-op", e)}
    assert audit(graph(e), [], order, kinds=["late"])["findings"] == []


def test_size_one_edges_report_size_one_only():
    e = f"fwd:{A}->{B}"
    probe = {"rank": 0, "edges": {e: {"fired": 1, "issued": 1}},
             "steps": [{"step": 1, "issued": [e]}]}
    order = [step(("prefetch", e, "issued"), ("unshard", B, e), ("reshard", B))]
    result = audit(graph(e, shard_size=1), [probe], order)
    assert [(f["kind"], f["edge"], f["steps"], f["ranks"]) for f in result["findings"]] == [
        ("size-one", e, [1], [0])]


@pytest.mark.parametrize(("engine", "says", "never"), [
    ({"fsdp2": {"torch": "2.13.0+cpu"}},
     "copies nothing when issued (torch 2.13.0+cpu FSDP2 records a placeholder and copies at "
     "wait_for_unshard, on the unit's own use): a prefetch with nothing to overlap", "read on"),
    ({"fsdp2": {"torch": "2.9.1"}}, "read on torch 2.13, not this version", "copied the"),
    # A job that imported FSDP2 but shards this unit with hyper-parallel: hyper-parallel's.
    ({"fsdp2": {"torch": "2.13.0"},
      "hyper_parallel": {"version": "hyper-parallel 0.3.0", "units": {B: {"shard_size": 1}}}},
     "1 prefetches each copied the local shard at once (no collective; hyper-parallel 0.3.0), "
     "and the unit's own unshard copies it again", "placeholder"),
])
def test_size_one_evidence_says_what_the_engine_and_its_version_do(engine, says, never):
    e = f"fwd:{A}->{B}"
    probe = {"rank": 0, "edges": {e: {"fired": 1, "issued": 1}}, **engine,
             "steps": [{"step": 1, "issued": [e]}]}
    result = audit(graph(e, shard_size=1), [probe], None)
    [finding] = [f for f in result["findings"] if f["kind"] == "size-one"]
    assert says in finding["evidence"] and never not in finding["evidence"]
    assert not result["ok"]  # still flagged: a prefetch that cannot overlap anything


def test_a_run_without_order_says_so_and_audits_what_it_has(tmp_path):
    e = f"fwd:{A}->{B}"
    (tmp_path / "graph.json").write_text(json.dumps(graph(e)))
    (tmp_path / "probe.rank0.json").write_text(json.dumps({"rank": 0, "edges": {}}))
    result = audit_run_dir(tmp_path)
    assert result["order_recorded"] is False and result["ok"]
    lines = finding_lines(result)
    assert len(lines) == 1 and "recorded no unit order" in lines[0]
    assert lines[0].startswith("not checked: never-consumed, late, no-op, shadowed: ")
    assert {n["kind"] for n in result["not_checked"]} == {"never-consumed", "late", "no-op",
                                                          "shadowed"}
    closing = verdict_lines(result)[-1]
    assert closing.startswith("-> OK for what was checked") and "not checked: " in closing


# -- real runs: planted kinds ----------------------------------------------------------
def audit_workload(tmp_path, name: str, workload: dict) -> dict:
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps({"name": name, "workload": workload, "steps": 2}))
    console = Console(file=io.StringIO(), width=200)
    return run_audit(path, guard=None, state_dir=tmp_path / "state", console=console)


def failing(result: dict) -> set[tuple[str, str]]:
    return {(f["kind"], f["edge"]) for f in result["findings"] if f["kind"] in FAILING_KINDS}


FSDP2 = {"builtin": "fsdp2", "layers": 4, "world_size": 2}


@pytest.mark.slow
def test_fsdp2_plain_chain_and_activation_checkpointing_have_no_findings(tmp_path):
    pytest.importorskip("torch")
    assert audit_workload(tmp_path, "plain", FSDP2)["findings"] == []
    # torch 2.13 FSDP2 does not re-append the forward order on recompute: nothing wasted.
    result = audit_workload(tmp_path, "ckpt", {**FSDP2, "checkpoint": True})
    assert result["findings"] == [] and result["ok"]


@pytest.mark.slow
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
    assert failing(result) == set() and result["ok"]


@pytest.mark.slow
def test_fsdp2_mistargeted_backward_edge_is_never_consumed(tmp_path):
    pytest.importorskip("torch")
    edge = "bwd:layers.1->layers.2"  # layers.2's backward already ran
    result = audit_workload(tmp_path, "mis", {**FSDP2, "extra_edges": [edge]})
    assert failing(result) == {("never-consumed", edge)} and not result["ok"]
    finding = next(f for f in result["findings"] if f["kind"] == "never-consumed")
    assert finding["steps"] == [1, 2] and finding["ranks"] == [0, 1]
    assert {f["kind"] for f in result["findings"]} == {"never-consumed", "duplicate-target"}


@pytest.mark.slow
def test_fsdp2_prefetch_into_an_unsharded_root_is_late(tmp_path):
    pytest.importorskip("torch")
    edge = "bwd:layers.0->root"  # the root unsharded itself (and was used) in backward first
    result = audit_workload(tmp_path, "late", {**FSDP2, "extra_edges": [edge]})
    assert kinds_by_edge(result) == {("late", edge)} and not result["ok"]


@pytest.mark.slow
def test_fsdp2_world_size_one_makes_every_edge_size_one(tmp_path):
    pytest.importorskip("torch")
    result = audit_workload(tmp_path, "ws1", {**FSDP2, "world_size": 1})
    edges = {e["id"] for e in result["edges"]}
    assert len(edges) == 7
    assert kinds_by_edge(result) == {("size-one", e) for e in edges}


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 2])
def test_mindspore_size_one_at_world_size_one_only(tmp_path, world_size):
    pytest.importorskip("mindspore")
    result = audit_workload(tmp_path, f"ms{world_size}",
                            {"builtin": "mindspore", "layers": 2, "world_size": world_size})
    edges = {e["id"] for e in result["edges"]}
    assert len(edges) == 7 and result["order_recorded"]
    size_one = {f["edge"] for f in result["findings"] if f["kind"] == "size-one"}
    assert size_one == (edges if world_size == 1 else set())
    assert failing(result) == {("size-one", e) for e in size_one}


@pytest.mark.slow
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
