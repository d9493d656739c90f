"""Discovery's check of a static graph against what a run fired (runs/discover.py)."""

from __future__ import annotations

import json
import textwrap


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
