"""A unit with no parameters of its own (torchtitan's root: embedding, layers and head are
sharded on their own first) is an ordinary node: in the graph file, `graph`, masks and the
audit. The job (examples/fsdp2_train.py --shard-ends) imports nothing of ours. A graph file
with such a unit: tests/test_graph.py; a static graph against what a run fired:
tests/runs/test_discover.py.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from bisect_prefetch.cli import main

pytest.importorskip("torch")
JOB = Path(__file__).resolve().parents[2] / "examples" / "fsdp2_train.py"


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


