"""The size-one audit over recorded graphs and probes (pure; no jobs)."""

from __future__ import annotations

import json

import pytest

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.judge.audit import audit, audit_run_dir

BWD = "bwd:decoder.layers.1->decoder.layers.0"
FWD = "fwd:decoder.layers.0->decoder.layers.1"


def graph(shard_size: int) -> dict:
    return {
        "nodes": [
            {"name": "decoder.layers.0", "kind": "layer", "order": 0, "shard_size": shard_size},
            {"name": "decoder.layers.1", "kind": "layer", "order": 1, "shard_size": shard_size},
        ],
        "edges": [
            {"id": FWD, "phase": "fwd", "src": "decoder.layers.0", "dst": "decoder.layers.1"},
            {"id": BWD, "phase": "bwd", "src": "decoder.layers.1", "dst": "decoder.layers.0"},
        ],
    }


def hp_probe(outcomes: dict, param_counts: dict, units: dict | None = None) -> dict:
    """A hyper-parallel probe: outcome counts and parameter-level counts per edge."""
    edges = {
        edge: {"fired": sum(o.values()), **{k: o.get(k, 0) for k in
                                             ("issued", "noop", "masked", "guarded")}}
        for edge, o in outcomes.items()
    }
    extra = {
        edge: {"async_unshards": c.get("async", 0), "already_unsharded": c.get("already", 0)}
        for edge, c in param_counts.items()
    }
    return {"rank": 0, "edges": edges, "hyper_parallel": {"edges": extra, "units": units or {}}}


def test_size_one_edges_that_still_unshard_fail_the_audit():
    probe = hp_probe({FWD: {"issued": 3}, BWD: {"issued": 3}},
                     {FWD: {"async": 36}, BWD: {"async": 36}})
    result = audit(graph(1), [probe])
    assert result["ok"] is False
    assert result["guard"] == "absent"
    assert result["size_one_edges_unsharding"] == [FWD, BWD]
    assert [e["async_unshards"] for e in result["edges"]] == [36, 36]
    assert all(e["size_one"] and e["target_shard_size"] == 1 for e in result["edges"])


def test_a_build_that_skips_size_one_prefetch_has_the_guard():
    # Prefetch called into sharded-state targets, no parameter unshard followed.
    probe = hp_probe({FWD: {"noop": 3}, BWD: {"noop": 3}}, {FWD: {}, BWD: {}})
    result = audit(graph(1), [probe])
    assert (result["guard"], result["ok"], result["guard_observed"]) == ("present", True, True)


def test_the_tools_guard_counts_as_present():
    probe = hp_probe({FWD: {"guarded": 3}, BWD: {"guarded": 3}}, {FWD: {}, BWD: {}})
    result = audit(graph(1), [probe])
    assert (result["guard"], result["ok"]) == ("present", True)
    assert result["edges"][0]["guarded"] == 3


def test_noops_into_already_unsharded_targets_are_not_evidence_of_a_guard():
    probe = hp_probe({BWD: {"noop": 2}}, {BWD: {"already": 2}})
    result = audit(graph(1), [probe])
    assert (result["guard"], result["guard_observed"], result["ok"]) == ("absent", False, True)


def test_real_fsdp_prefetch_that_issues_all_gathers_is_fine():
    probe = hp_probe({FWD: {"issued": 3}, BWD: {"issued": 3}},
                     {FWD: {"async": 36}, BWD: {"async": 36}})
    result = audit(graph(2), [probe])
    assert result["ok"] is True
    assert result["real_prefetch_lost"] == []
    assert result["size_one_edges"] == []
    assert result["guard_observed"] is False


def test_real_fsdp_prefetch_lost_is_the_refactor_pitfall():
    units = {"decoder.layers.0": {"shard_size": 2, "size_one": False, "params": 12,
                                  "params_with_shard_size": 0}}
    probe = hp_probe({FWD: {"noop": 3}, BWD: {"issued": 3}},
                     {FWD: {}, BWD: {"async": 36}}, units)
    result = audit(graph(2), [probe])
    assert result["ok"] is False
    assert result["guard"] == "disables-real-prefetch"
    assert result["real_prefetch_lost"] == [FWD]
    assert result["pitfall_units"] == ["decoder.layers.0"]


def test_pitfall_units_need_missing_shard_size_on_a_sharded_unit():
    units = {
        "a": {"shard_size": 2, "params": 3, "params_with_shard_size": 3},
        "b": {"shard_size": 1, "params": 3, "params_with_shard_size": 0},
        "c": {"shard_size": 4, "params": 3, "params_with_shard_size": 2},
    }
    result = audit(graph(2), [hp_probe({}, {}, units)])
    assert result["pitfall_units"] == ["c"]


def test_masked_edges_are_not_attempts():
    probe = hp_probe({FWD: {"masked": 3}, BWD: {"masked": 3}}, {FWD: {}, BWD: {}})
    result = audit(graph(2), [probe])
    assert result["ok"] is True
    assert [e["masked"] for e in result["edges"]] == [3, 3]
    assert [e["attempts"] for e in result["edges"]] == [0, 0]


def test_counts_are_summed_over_ranks():
    rank0 = hp_probe({BWD: {"issued": 1}}, {BWD: {"async": 5}})
    rank1 = hp_probe({BWD: {"noop": 1}}, {BWD: {}})
    result = audit(graph(1), [rank0, rank1])
    bwd = next(e for e in result["edges"] if e["id"] == BWD)
    assert (bwd["async_unshards"], bwd["attempts"]) == (5, 2)
    assert result["size_one_edges_unsharding"] == [BWD]


def test_fsdp2_probe_counts_issued_all_gathers():
    # No parameter-level counts: an issued prefetch is an all-gather, a noop found one pending.
    probe = {"rank": 0, "edges": {
        FWD: {"fired": 4, "issued": 4, "noop": 0, "masked": 0, "guarded": 0},
        BWD: {"fired": 4, "issued": 0, "noop": 4, "masked": 0, "guarded": 0},
    }}
    at_world_size_1 = audit(graph(1), [probe])
    assert at_world_size_1["size_one_edges_unsharding"] == [FWD]
    assert at_world_size_1["ok"] is False
    at_world_size_2 = audit(graph(2), [probe])
    assert at_world_size_2["ok"] is True  # a shadowed edge is not a lost prefetch


def test_edges_absent_from_the_probe_count_zero():
    result = audit(graph(1), [{"rank": 0, "edges": {}}])
    assert [e["async_unshards"] for e in result["edges"]] == [0, 0]
    assert result["ok"] is True


def test_audit_run_dir_reads_rank_files(tmp_path):
    (tmp_path / "graph.rank0.json").write_text(json.dumps(graph(1)))
    for rank in (0, 1):
        probe = hp_probe({BWD: {"issued": 1}}, {BWD: {"async": 2}})
        (tmp_path / f"probe.rank{rank}.json").write_text(json.dumps(probe))
    result = audit_run_dir(tmp_path)
    assert next(e for e in result["edges"] if e["id"] == BWD)["async_unshards"] == 4


def test_audit_run_dir_without_records_is_an_input_error(tmp_path):
    with pytest.raises(BisectPrefetchError, match="no recorded graph"):
        audit_run_dir(tmp_path)
    (tmp_path / "graph.rank0.json").write_text("{not json")
    (tmp_path / "probe.rank0.json").write_text("{}")
    with pytest.raises(BisectPrefetchError, match="not JSON"):
        audit_run_dir(tmp_path)
