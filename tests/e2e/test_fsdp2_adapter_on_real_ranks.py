"""The FSDP2 adapter on real ranks (the reference workload or a small FSDP2 job under torchrun,
2 CPU ranks or 1): the discovered graph and an all-off mask, the size-one guard, ranks with
different plans, and a shadowed edge. The adapter's parts without a job:
tests/adapters/test_fsdp2.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bisect_prefetch.adapters.plan import plan_hash
from tests.conftest import rank_lines

REPO = Path(__file__).resolve().parents[2]
SITE = REPO / "bisect_prefetch" / "adapters" / "site"


# -- FSDP2, real runs ------------------------------------------------------------------
def _fsdp2_helpers():
    pytest.importorskip("torch")
    from tests.conftest import LAYERS, read_jsonl, read_probe, run_fsdp2, write_plan

    return LAYERS, read_jsonl, read_probe, run_fsdp2, write_plan


def test_discovered_graph_is_the_chain_plus_implicit_edges_and_all_off_masks_them(tmp_path):
    layers, _, read_probe, run_fsdp2, write_plan = _fsdp2_helpers()
    plan = write_plan(tmp_path, mask=[])  # all off
    run_fsdp2(tmp_path, steps=3, plan=plan)
    graph = json.loads((tmp_path / "graph.rank0.json").read_text())
    assert graph == json.loads((tmp_path / "graph.rank1.json").read_text())
    chain = {f"fwd:layers.{i}->layers.{i + 1}" for i in range(layers - 1)}
    chain |= {f"bwd:layers.{i}->layers.{i - 1}" for i in range(1, layers)}
    explicit = {e["id"] for e in graph["edges"] if not e["implicit"]}
    implicit = {e["id"] for e in graph["edges"] if e["implicit"]}
    assert explicit == chain
    assert implicit == {f"bwd:root->layers.{layers - 1}"}
    assert [(n["name"], n["kind"], n["order"], n["shard_size"]) for n in graph["nodes"]] == [
        *((f"layers.{i}", "layer", i, 2) for i in range(layers)),
        ("root", "root", layers, 2),
    ]
    plan_hash_ = plan_hash(json.loads(plan.read_text()))
    for rank in (0, 1):
        probe = read_probe(tmp_path, rank)
        assert probe["plan_hash"] == plan_hash_
        assert probe["plan_hashes"] == [plan_hash_, plan_hash_]
        assert set(probe["edges"]) == explicit | implicit  # every edge was attempted ...
        for counts in probe["edges"].values():  # ... and none ran, implicit ones included
            assert counts == {"fired": 3, "issued": 0, "noop": 0, "masked": 3, "guarded": 0}
        assert [s["step"] for s in probe["steps"]] == [1, 2, 3]


def test_world_size_one_has_shard_size_one_and_the_guard_blocks_every_prefetch(tmp_path):
    _, read_jsonl, read_probe, run_fsdp2, write_plan = _fsdp2_helpers()
    from tests.conftest import read_ranks  # noqa: I001
    plain, guarded = tmp_path / "plain", tmp_path / "guarded"
    run_fsdp2(plain, steps=3, nproc=1, plan=write_plan(plain))
    run_fsdp2(guarded, steps=3, nproc=1, plan=write_plan(guarded, guard="size-one"))
    graph = json.loads((plain / "graph.rank0.json").read_text())
    assert graph["nodes"] and all(n["shard_size"] == 1 for n in graph["nodes"])
    plain_edges = read_probe(plain)["edges"]
    assert plain_edges and all(c["issued"] == 3 for c in plain_edges.values())
    guarded_edges = read_probe(guarded)["edges"]
    assert set(guarded_edges) == set(plain_edges)
    for counts in guarded_edges.values():
        assert counts == {"fired": 3, "issued": 0, "noop": 0, "masked": 0, "guarded": 3}
    assert read_ranks(plain, "metrics") == read_ranks(guarded, "metrics")


def test_ranks_with_different_plans_stop_before_the_first_all_gather(tmp_path):
    pytest.importorskip("torch")
    from tests.conftest import free_port, write_plan

    port, processes = free_port(), []
    for rank, mask in ((0, None), (1, [])):  # same job, two plans
        run_dir = tmp_path / f"rank{rank}"
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join([str(SITE), str(REPO)]),
            BISECT_PREFETCH_PLAN=str(write_plan(run_dir, mask=mask)),
            RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
        )  # fmt: skip
        command = [sys.executable, "-m", "bisect_prefetch.workloads.fsdp2", "--layers", "2"]
        processes.append(
            subprocess.Popen(
                command, cwd=run_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
        )
    try:
        codes = [p.wait(timeout=120) for p in processes]
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
            p.communicate()
    assert all(code != 0 for code in codes)
    for rank in (0, 1):
        probe = json.loads((tmp_path / f"rank{rank}" / f"probe.rank{rank}.json").read_text())
        assert len(set(probe["plan_hashes"])) == 2
        assert any("different plans" in error for error in probe["errors"])
        assert not rank_lines(tmp_path / f"rank{rank}", "metrics")  # not a single step


DEPTH_TWO_JOB = """
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from bisect_prefetch import adapters
from bisect_prefetch.workloads.fsdp2 import TinyTransformer, synthetic_batches, train_step

torch.set_num_threads(1)
dist.init_process_group("gloo")
torch.manual_seed(0)
model = TinyTransformer(vocab=64, dim=32, heads=2, layers=4)
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
for layer in model.layers:
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
layers = list(model.layers)
for i in (2, 3):  # backward prefetch depth 2: i -> i-1 and i -> i-2
    layers[i].set_modules_to_backward_prefetch([layers[i - 1], layers[i - 2]])
optimizer = torch.optim.AdamW(model.parameters())
tokens = synthetic_batches(seed=0, count=1, batch=4, seq=8, vocab=64)[0][dist.get_rank()::2]
for step in (1, 2):
    adapters.report_step(step, loss=train_step(model, optimizer, tokens)[0])
dist.destroy_process_group()
"""


def test_shadowed_edge_is_a_noop_until_its_shadowing_edge_is_masked(tmp_path):
    pytest.importorskip("torch")
    from tests.conftest import free_port, read_probe, write_plan

    (tmp_path / "job.py").write_text(DEPTH_TWO_JOB)

    def run(run_dir: Path, mask: list[str] | None) -> dict:
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join([str(SITE), str(REPO)]),
            BISECT_PREFETCH_PLAN=str(write_plan(run_dir, mask=mask)),
            OMP_NUM_THREADS="1",
        )
        command = [
            sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
            f"--master_port={free_port()}", str(tmp_path / "job.py"),
        ]  # fmt: skip
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr[-3000:]
        return read_probe(run_dir)["edges"]

    edges = run(tmp_path / "all-on", None)
    # layers.3's backward already prefetched layers.1 (its second target), so
    # layers.2's own prefetch of layers.1 finds it unsharded: shadowed.
    assert edges["bwd:layers.3->layers.1"]["issued"] == 2
    assert edges["bwd:layers.2->layers.1"] == {
        "fired": 2, "issued": 0, "noop": 2, "masked": 0, "guarded": 0,
    }  # fmt: skip
    unshadowed = run(tmp_path / "unshadowed", [e for e in edges if e != "bwd:layers.3->layers.1"])
    assert unshadowed["bwd:layers.3->layers.1"]["masked"] == 2
    assert unshadowed["bwd:layers.2->layers.1"]["issued"] == 2
