"""The audit's kinds of suspect edge, from order records (pure). Planted in real runs:
tests/e2e/test_audit_planted_kinds.py.
"""

from __future__ import annotations

import json

import pytest

from bisect_prefetch.commands.audit import finding_lines, verdict_lines
from bisect_prefetch.judge.audit import audit, audit_run_dir

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
