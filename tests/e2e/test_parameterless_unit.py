"""A unit with no parameters of its own (torchtitan's root: embedding, layers and head are
sharded on their own first) is an ordinary node: in the graph file, `graph`, masks and the
audit. The job (examples/fsdp2_train.py --shard-ends) imports nothing of ours.
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
JOB = Path(__file__).resolve().parents[2] / "examples" / "fsdp2_train.py"


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


def test_a_static_graph_that_misses_or_invents_edges_is_said_after_a_run(tmp_path):
    from bisect_prefetch.experiment import load_experiment
    from bisect_prefetch.runs.discover import static_mismatch

    experiment = tmp_path / "static.yaml"
    experiment.write_text(textwrap.dedent("""
        name: static
        command: [python, train.py]
        metrics: {format: jsonl, names: [loss]}
        graph: {source: static, policy: torchtitan, layers: 2}
        steps: 3
    """))
    exp = load_experiment(experiment)
    listed = ["bwd:norm+lm_head->layers.1", "bwd:layers.1->layers.0", "bwd:layers.0->tok_embeddings"]
    probe = {"edges": {edge: {"fired": 3} for edge in listed}}
    (tmp_path / "probe.json").write_text(json.dumps(probe))
    assert static_mismatch(exp, tmp_path) is None  # the job fired what the policy lists

    # Another job: one listed edge never fires, and it fires one the policy does not list.
    probe["edges"].pop("bwd:layers.0->tok_embeddings")
    probe["edges"]["bwd:output->norm"] = {"fired": 3, "masked": 3}
    (tmp_path / "probe.json").write_text(json.dumps(probe))
    line = static_mismatch(exp, tmp_path)
    assert line is not None and line.startswith("warning: the static torchtitan graph does not match")
    assert "fired 1 edge(s) the graph does not list, masked in every run, all-on included " \
           "(bwd:output->norm)" in line
    assert f"1 of its {len(listed)} edges never fired (bwd:layers.0->tok_embeddings)" in line
