"""Names and kinds of FSDP units and the graph made of them, shared by the framework adapters.

Standard library only.
"""

from __future__ import annotations

from typing import Any

ROOT_NAME = "root"  # the root unit's module name is empty; the graph needs a readable one
UNKNOWN_NAME = "?"  # a prefetch whose source unit could not be named


def is_layer(name: str) -> bool:
    """`layers.3`, `decoder.layers.3`: a unit whose name ends in an index."""
    return name.rsplit(".", 1)[-1].isdigit()


def node_kind(name: str, order: int | None, unit_names: list[str], first_layer: int | None) -> str:
    """root, inner (inside another unit), layer, embedding (before the first layer) or tail."""
    if name == ROOT_NAME:
        return "root"
    if any(name.startswith(other + ".") for other in unit_names if other != ROOT_NAME):
        return "inner"
    if is_layer(name):
        return "layer"
    if order is not None and first_layer is not None and order < first_layer:
        return "embedding"
    return "tail"


def record_graph(session: Any, *, nodes: list[dict[str, Any]], edges: dict[Any, Any]) -> None:
    """Hand the prefetch graph (units as nodes, observed prefetches as edges) to the recorder,
    when the plan asks for one."""
    recorder = session.recorder
    if recorder is not None and session.plan.record_graph:
        recorder.graph({"nodes": nodes, "edges": list(edges.values())})
