"""The shared words: edge ids spelled and parsed in one place; the adapter's side stays small."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bisect_prefetch import vocab
from bisect_prefetch.graph import Edge, from_policy


def test_edge_id_round_trips_through_parse():
    eid = vocab.edge_id(vocab.BWD, "decoder.layers.1", "decoder.layers.0")
    assert eid == "bwd:decoder.layers.1->decoder.layers.0"
    assert vocab.parse_edge_id(eid) == ("bwd", "decoder.layers.1", "decoder.layers.0")
    assert vocab.edge_phase(eid) == "bwd"
    assert Edge.parse(eid).id == eid


@pytest.mark.parametrize("bad", ["", "bwd", "bwd:a", "up:a->b", "fwd:->b", "fwd:a->"])
def test_parse_edge_id_rejects_what_is_not_one(bad):
    with pytest.raises(ValueError):
        vocab.parse_edge_id(bad)


def test_every_graph_edge_is_spelled_by_the_vocabulary():
    graph = from_policy("mindformers", 3)
    for eid in graph.edge_ids():
        assert vocab.edge_id(*vocab.parse_edge_id(eid)) == eid


def test_usable_outcomes_are_run_outcomes_and_truncated_is_not_usable():
    assert set(vocab.USABLE_OUTCOMES) < set(vocab.RUN_OUTCOMES)
    assert vocab.TRUNCATED in vocab.RUN_OUTCOMES
    assert vocab.TRUNCATED not in vocab.USABLE_OUTCOMES


def test_the_job_side_loads_only_the_vocabulary_and_the_adapter():
    code = """
import json, sys
import bisect_prefetch.adapters
import bisect_prefetch.adapters.hyper_parallel
ours = sorted(m for m in sys.modules if m.split(".")[0] == "bisect_prefetch")
print(json.dumps(ours))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    ours = json.loads(result.stdout)
    outside = [m for m in ours if m not in ("bisect_prefetch", "bisect_prefetch.vocab")
               and not m.startswith("bisect_prefetch.adapters")]
    assert outside == []
    assert "bisect_prefetch.vocab" in ours
