"""A unit with no parameters of its own (torchtitan's root: embedding, layers and head are
sharded on their own first) is an ordinary node: in the graph file, `graph`, masks and the
audit. The job (tests/user_fsdp2_job.py --shard-ends) imports nothing of ours.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from bisect_prefetch.cli import main
from bisect_prefetch.graph import PrefetchGraph

pytest.importorskip("torch")
JOB = Path(__file__).resolve().parent / "user_fsdp2_job.py"


def test_a_graph_file_with_a_null_order_loads_and_sorts_that_unit_last():
    graph = PrefetchGraph.from_dict({
        "nodes": [{"name": "root", "kind": "root", "order": None, "shard_size": None},
                  {"name": "layers.0", "kind": "layer", "order": 0, "shard_size": 2}],
        "edges": [{"id": "bwd:root->layers.0", "phase": "bwd", "src": "root", "dst": "layers.0"}],
    })
    assert graph.nodes() == ["layers.0", "root"]
    assert graph.to_dict()["nodes"][1]["order"] is None
    assert PrefetchGraph.from_dict(graph.to_dict()) == graph


@pytest.mark.slow
def test_a_parameterless_root_is_an_ordinary_node_of_a_real_job(tmp_path, capsys):
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            str(JOB), "--steps", "{steps}", "--shard-ends"]
    experiment = tmp_path / "ends.yaml"
    experiment.write_text(textwrap.dedent(f"""
        name: ends
        command: {json.dumps(argv)}
        metrics: {{format: torchtitan, names: [loss, grad_norm]}}
        graph: {{source: runtime}}
        steps: 3
        timeout_s: 180
    """))
    state = ["--state-dir", str(tmp_path / "state")]
    out = tmp_path / "graph.json"
    assert main(["graph", str(experiment), "--format", "json", "--out", str(out), *state]) == 0
    graph = json.loads(out.read_text())
    nodes = {n["name"]: n for n in graph["nodes"]}
    assert {"embed", "head", "root", "layers.0", "layers.5"} <= set(nodes), nodes
    assert nodes["root"]["order"] is None and nodes["embed"]["order"] is not None
    edges = {e["id"] for e in graph["edges"]}
    assert "bwd:layers.1->layers.0" in edges and "bwd:layers.0->embed" in edges, edges

    capsys.readouterr()
    assert main(["masks", str(experiment), "--preset", "backward-off", *state]) == 0
    assert "layers.0" in capsys.readouterr().out
    code = main(["audit", str(experiment), "--json", str(tmp_path / "audit.json"), *state])
    assert code in (0, 1)  # a finding is fine; the point is that the audit reads the graph
    audit = json.loads((tmp_path / "audit.json").read_text())
    assert {e["id"] for e in audit["edges"]} == edges
