"""Names from jobs and files reach plots as plain text: a metric, a run label or a unit
named with `$...$` (matplotlib's mathtext) is drawn as written, never a crash after runs."""

from __future__ import annotations

from bisect_prefetch.graph import PrefetchGraph, render_png
from bisect_prefetch.report.plots import plot_group

NAMES = ["$\\frac{loss$", "grad_$norm^{", "$x$"]


def test_metric_names_and_titles_with_dollars_are_plain_text(tmp_path):
    series = {name: {1: 1.0, 2: 2.0, 3: 3.0} for name in NAMES}
    other = {name: {1: 1.0, 2: 2.5, 3: 3.0} for name in NAMES}
    path = plot_group(series, other, tmp_path / "curves.png", title="cell $a_{b",
                      labels=("run $1", "run ^{2}$"))
    assert path.read_bytes().startswith(b"\x89PNG")


def test_unit_names_with_dollars_are_plain_text(tmp_path):
    graph = PrefetchGraph()
    for order, name in enumerate(["$\\frac{emb$", "$layer^{$"]):
        graph.add_node(name, kind="layer", order=order, shard_size=2)
    graph.add_edge("bwd", "$layer^{$", "$\\frac{emb$")
    render_png(graph, tmp_path / "graph.png")
    assert (tmp_path / "graph.png").read_bytes().startswith(b"\x89PNG")
