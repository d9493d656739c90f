"""hyper-parallel's torch backend (the fully_shard lineage) as the adapter meets it: the
torch mode of the double (workloads/hsdp_double_torch.py), 2 ranks over gloo on CPU with
reshard_after_forward off. The graph, shard sizes and digests on every rank; an A/A pair
bitwise identical by digests; the audit of shard size 2 fails nothing (a backward prefetch
into a unit still unsharded from forward is a no-op note, not "late"), and the audit of a
(replicate 2, shard 1) mesh names the size-one edges that make the redundant local copy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bisect_prefetch.judge.audit import audit_run_dir
from bisect_prefetch.metrics.digests import compare_digest_files

pytest.importorskip("torch")
REPO = Path(__file__).resolve().parents[2]
SITE = REPO / "bisect_prefetch" / "adapters" / "site"
FORWARD = {"fwd:embedding->layers.0", "fwd:layers.0->layers.1", "fwd:layers.1->output_layer"}
BACKWARD = {"bwd:layers.0->embedding", "bwd:layers.1->layers.0", "bwd:output_layer->layers.1"}


def run_double(run_dir: Path, *, shard_size: int) -> Path:
    run_dir.mkdir()
    plan = {"version": 1, "out_dir": str(run_dir), "mask": None, "guard": "none", "seed": 1,
            "steps": 3, "record": {"digests": "*", "digest_every": 1}}
    (run_dir / "plan.json").write_text(json.dumps(plan))
    env = {**os.environ, "PYTHONPATH": f"{SITE}{os.pathsep}{REPO}",
           "BISECT_PREFETCH_PLAN": str(run_dir / "plan.json")}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         "-m", "bisect_prefetch.workloads.hsdp_double_torch", "--steps", "3",
         "--shard-size", str(shard_size), "--reshard-after-forward", "off"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hp-torch")
    specs = {"a": 2, "b": 2, "size-one": 1}
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {name: pool.submit(run_double, root / name, shard_size=size)
                   for name, size in specs.items()}
        yield {name: future.result() for name, future in futures.items()}


def test_graph_shard_sizes_and_digests_on_every_rank(runs):
    graph = json.loads((runs["a"] / "graph.rank0.json").read_text())
    assert {e["id"] for e in graph["edges"]} == FORWARD | BACKWARD
    assert {n["name"]: n["shard_size"] for n in graph["nodes"] if n["name"] != "root"} == {
        "embedding": 2, "layers.0": 2, "layers.1": 2, "output_layer": 2}
    for rank in (0, 1):
        probe = json.loads((runs["a"] / f"probe.rank{rank}.json").read_text())
        assert {u["lineage"] for u in probe["hyper_parallel"]["units"].values()} == {"fully_shard"}
        assert (probe["digests"]["parameters"], probe["digests"]["gradients"]) == (8, 8)
        assert probe["digests"]["fewest_tensors"] == 16
    for rank in (0, 1):
        name = f"digests.rank{rank}.jsonl"
        same = compare_digest_files(runs["a"] / name, runs["b"] / name)
        assert same.first_diff_step is None and same.records_compared == 3 * 16


def test_audit_of_shard_size_two_without_reshard_after_forward_fails_nothing(runs):
    result = audit_run_dir(runs["a"])
    assert result["ok"] and result["real_prefetch_lost"] == [] and result["size_one_edges"] == []
    # The backward edges find their target still unsharded from forward: no-op notes.
    assert {(f["kind"], f["edge"]) for f in result["findings"]} == {("no-op", e) for e in BACKWARD}
    assert all("still unsharded from its fwd use" in f["evidence"] for f in result["findings"])


def test_audit_of_a_shard_group_of_one_names_the_size_one_copies(runs):
    result = audit_run_dir(runs["size-one"])
    assert set(result["size_one_edges"]) == FORWARD | BACKWARD
    # Forward prefetches copy locally at once; backward ones find the unit still unsharded.
    assert set(result["size_one_edges_unsharding"]) == FORWARD
    assert (result["guard"], result["ok"]) == ("absent", False)
