"""Outputs that carry job text stay plain: Markdown cells show links, images and
right-to-left overrides as text, mermaid labels keep their quotes, DOT keeps non-ASCII names
as written, a JUnit <error> says why there is no verdict; metric names that are a line's
step or rank are refused when the experiment is loaded."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.experiment import load_experiment
from bisect_prefetch.graph import PrefetchGraph, render_dot, render_mermaid
from bisect_prefetch.report.junit import matrix_junit
from bisect_prefetch.report.markdown import _escape


def test_markdown_cells_show_links_images_and_bidi_as_text():
    cell = _escape("see [here](https://x.example) ![i](https://x.example/a.png) abc\u202edef")
    assert "](" not in cell.replace("\\](", "").replace("\\(", "")
    assert "\\[here\\]\\(https://x.example\\)" in cell and "\\!\\[i\\]" in cell
    assert "\u202e" not in cell and "\\u202e" in cell


def _graph() -> PrefetchGraph:
    graph = PrefetchGraph()
    graph.add_node('décodeur "0"', kind="layer", order=0, shard_size=2)
    graph.add_node("layer#1", kind="layer", order=1, shard_size=2)
    graph.add_edge("bwd", "layer#1", 'décodeur "0"')
    return graph


def test_mermaid_labels_keep_their_quotes_and_dot_its_non_ascii():
    mermaid = render_mermaid(_graph())
    assert 'n0["décodeur #quot;0#quot;"]' in mermaid and 'n1["layer#35;1"]' in mermaid
    dot = render_dot(_graph())
    assert '"décodeur \\"0\\""' in dot and "\\u00e9" not in dot


def test_a_junit_error_says_why_there_is_no_verdict():
    cell = {"name": "quiet", "expect": "consistent", "verdict": "error", "expectation_met": False,
            "reason": "2 run(s) failed: exit code 3", "runs": 2, "divergences": 0,
            "first_diff_step": None, "metrics": {}, "mask": [], "seconds": 1.0}
    xml = ET.fromstring(matrix_junit({"matrix": "m", "experiment": "e", "cells": [cell]}))
    error = xml.find(".//error")
    assert error is not None and "no verdict: 2 run(s) failed: exit code 3" in error.get("message")


@pytest.mark.parametrize("name", ["step", "rank"])
def test_a_metric_named_step_or_rank_is_refused_at_load(tmp_path, name):
    path = tmp_path / "exp.yaml"
    path.write_text(f"name: x\ncommand: [python, t.py]\nmetrics: {{format: jsonl, names: [loss, {name}]}}\n"
                    "graph: {source: static, policy: fsdp2-chain, layers: 2}\nsteps: 3\n")
    with pytest.raises(BisectPrefetchError, match=f"metrics.names may not hold {name}"):
        load_experiment(path)
