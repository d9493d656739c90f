"""The prefetch edge graph: FSDP units as nodes, forward/backward prefetches as edges.

A node is an FSDP unit by fully qualified module name (`decoder.layers.3`).
An edge `PHASE:SRC->DST` says that SRC's forward (PHASE `fwd`) or backward
(`bwd`) pre-hook starts unsharding DST early. Graphs come from a static policy
(a pure function of a few parameters) or from the JSON the in-process recorder
writes; both render as text, json, dot, mermaid and png.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import networkx as nx

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.vocab import BWD, FWD, MAX_INNER, MAX_LAYERS, PHASES, edge_id, parse_edge_id

NODE_KINDS = ("embedding", "layer", "inner", "tail", "root")


@dataclass(frozen=True, order=True)
class Edge:
    phase: str
    src: str
    dst: str

    @property
    def id(self) -> str:
        return edge_id(self.phase, self.src, self.dst)

    @classmethod
    def parse(cls, text: str) -> Edge:
        try:
            return cls(*parse_edge_id(text))
        except ValueError as exc:
            raise BisectPrefetchError(str(exc)) from None


class PrefetchGraph:
    """FSDP units and their prefetch edges, over a networkx MultiDiGraph.

    Parallel edges are keyed by phase, so `fwd:a->b` and `bwd:a->b` coexist.
    """

    def __init__(self) -> None:
        self.g = nx.MultiDiGraph()

    # -- building ---------------------------------------------------------
    def add_node(
        self, name: str, *, kind: str, order: int | None, shard_size: int | None = None
    ) -> None:
        """order: the unit's place in the forward pass; None for a unit with no parameters of
        its own (torchtitan's root only groups others), which has no all-gather to place."""
        if kind not in NODE_KINDS:
            raise BisectPrefetchError(f"unknown node kind {kind!r} (one of {', '.join(NODE_KINDS)})")
        self.g.add_node(name, kind=kind, order=order, shard_size=shard_size)

    def add_edge(self, phase: str, src: str, dst: str, *, implicit: bool = False) -> Edge:
        edge = Edge(phase, src, dst)
        if phase not in PHASES:
            raise BisectPrefetchError(f"unknown phase {phase!r} (fwd or bwd)")
        for name in (src, dst):
            if name not in self.g:
                raise BisectPrefetchError(f"edge {edge.id} names unknown node {name!r}")
        self.g.add_edge(src, dst, key=phase, implicit=implicit)
        return edge

    # -- reading ----------------------------------------------------------
    def nodes(self) -> list[str]:
        """Node names in forward order."""
        return sorted(self.g.nodes, key=lambda n: (self._place(n), n))

    def _place(self, name: str) -> float:
        # A unit without a forward position (order None) sorts after every other: the root,
        # whose backward runs first.
        order = self.g.nodes[name]["order"]
        return math.inf if order is None else order

    def node(self, name: str) -> dict:
        return dict(self.g.nodes[name])

    def edges(self, phase: str | None = None) -> list[Edge]:
        """Edges grouped by phase (fwd first), each phase in layer order of its source.

        Backward edges run from the last layer down, as they fire in a step.
        """
        order = {n: self._place(n) for n in self.g.nodes}
        out = []
        for ph in PHASES if phase is None else (phase,):
            group = [Edge(ph, s, d) for s, d, k in self.g.edges(keys=True) if k == ph]
            sign = 1 if ph == FWD else -1
            group.sort(key=lambda e: (sign * order[e.src], sign * order[e.dst], e.src, e.dst))
            out.extend(group)
        return out

    def edge_ids(self) -> list[str]:
        return [e.id for e in self.edges()]

    def is_implicit(self, edge: Edge) -> bool:
        return bool(self.g.edges[edge.src, edge.dst, edge.phase].get("implicit", False))

    def __len__(self) -> int:
        return self.g.number_of_edges()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PrefetchGraph) and self.to_dict() == other.to_dict()

    # -- JSON -------------------------------------------------------------
    def to_dict(self) -> dict:
        nodes = [
            {"name": n, **{k: self.g.nodes[n][k] for k in ("kind", "order", "shard_size")}}
            for n in self.nodes()
        ]
        edges = [
            {"id": e.id, "phase": e.phase, "src": e.src, "dst": e.dst, "implicit": self.is_implicit(e)}
            for e in self.edges()
        ]
        return {"nodes": nodes, "edges": edges}

    @classmethod
    def from_dict(cls, data: dict) -> PrefetchGraph:
        try:
            graph = cls()
            for node in data["nodes"]:
                graph.add_node(
                    node["name"], kind=node["kind"], order=_order(node["order"]),
                    shard_size=node.get("shard_size"),
                )
            for edge in data["edges"]:
                graph.add_edge(
                    edge["phase"], edge["src"], edge["dst"], implicit=bool(edge.get("implicit", False))
                )
        except (KeyError, TypeError, ValueError) as exc:
            raise BisectPrefetchError(f"not a prefetch graph: missing or bad field {exc}") from None
        return graph

    @classmethod
    def load(cls, path: str | Path) -> PrefetchGraph:
        try:
            data = json.loads(Path(path).read_text())
        except OSError as exc:
            raise BisectPrefetchError(f"cannot read graph {path}: {exc.strerror}") from None
        except json.JSONDecodeError as exc:
            raise BisectPrefetchError(f"{path}: not JSON ({exc.msg}, line {exc.lineno})") from None
        return cls.from_dict(data)


def _order(value: object) -> int | None:
    # null: a unit with no parameters (it still prefetches, so it is an ordinary node).
    return None if value is None else int(value)


# -- static policies ------------------------------------------------------
def _mindformers(layers: int, inner: Iterable[str] = ()) -> PrefetchGraph:
    """The chain MindFormers' GPT parallelize step builds.

    Forward: embedding -> layer 0, layer i -> i+1, last -> final_layernorm and
    output_layer. Backward: output_layer -> last, i -> i-1, layer 0 -> embedding.
    Inner units (independently wrapped norms, routers, experts) are targeted by
    the same edges that target their layer.
    """
    inner = list(inner)
    g = PrefetchGraph()
    order = itertools.count()
    g.add_node("embedding", kind="embedding", order=next(order))
    layer_names = [f"decoder.layers.{i}" for i in range(layers)]
    for name in layer_names:
        g.add_node(name, kind="layer", order=next(order))
        for part in inner:
            g.add_node(f"{name}.{part}", kind="inner", order=next(order))
    g.add_node("decoder.final_layernorm", kind="tail", order=next(order))
    g.add_node("output_layer", kind="tail", order=next(order))

    def to_layer(phase: str, src: str, layer: str) -> None:
        g.add_edge(phase, src, layer)
        for part in inner:
            g.add_edge(phase, src, f"{layer}.{part}")

    first, last = layer_names[0], layer_names[-1]
    to_layer(FWD, "embedding", first)
    for a, b in zip(layer_names, layer_names[1:], strict=False):
        to_layer(FWD, a, b)
    g.add_edge(FWD, last, "decoder.final_layernorm")
    g.add_edge(FWD, last, "output_layer")
    to_layer(BWD, "output_layer", last)
    for a, b in zip(layer_names[1:], layer_names, strict=False):
        to_layer(BWD, a, b)
    g.add_edge(BWD, first, "embedding")
    return g


def _fsdp2_chain(layers: int) -> PrefetchGraph:
    """`layers.{i}`, i -> i+1 forward and i -> i-1 backward, as in the FSDP2 examples."""
    g = PrefetchGraph()
    names = [f"layers.{i}" for i in range(layers)]
    for i, name in enumerate(names):
        g.add_node(name, kind="layer", order=i)
    for a, b in zip(names, names[1:], strict=False):
        g.add_edge(FWD, a, b)
        g.add_edge(BWD, b, a)
    return g


def _torchtitan(layers: int) -> PrefetchGraph:
    """torchtitan 0.3.0's dense llama3 as FSDP2 runs it (checked against a real discovery).

    torchtitan shards tok_embeddings, each layer and [norm, lm_head] (one unit, named
    `norm+lm_head` by the adapter) on their own, then the root, which holds no parameters.
    It sets explicit prefetch lists only with expert parallelism, so a dense model runs on
    FSDP2's implicit backward chain alone: norm+lm_head -> last layer, layer i -> i-1,
    layer 0 -> tok_embeddings (layers + 1 edges, no forward edges).
    """
    g = PrefetchGraph()
    names = [f"layers.{i}" for i in range(layers)]
    g.add_node("tok_embeddings", kind="embedding", order=0)
    for i, name in enumerate(names):
        g.add_node(name, kind="layer", order=i + 1)
    g.add_node("norm+lm_head", kind="tail", order=layers + 1)
    g.add_node("root", kind="root", order=None)  # only groups the others
    chain = ["tok_embeddings", *names, "norm+lm_head"]
    for a, b in zip(chain[1:], chain, strict=False):
        g.add_edge(BWD, a, b, implicit=True)
    return g


POLICIES: dict[str, Callable[..., PrefetchGraph]] = {
    "mindformers": _mindformers,
    "fsdp2-chain": _fsdp2_chain,
    "torchtitan": _torchtitan,
}


def from_policy(name: str, layers: int, *, inner: Iterable[str] = ()) -> PrefetchGraph:
    if name not in POLICIES:
        raise BisectPrefetchError(f"unknown policy {name!r} (one of {', '.join(POLICIES)})")
    if not 1 <= layers <= MAX_LAYERS:
        raise BisectPrefetchError(f"--layers must be between 1 and {MAX_LAYERS}, got {layers}")
    inner = list(inner)
    if len(inner) > MAX_INNER:
        raise BisectPrefetchError(f"at most {MAX_INNER} inner units a layer, got {len(inner)}")
    if name == "mindformers":
        return _mindformers(layers, inner)
    if inner:
        raise BisectPrefetchError(f"policy {name!r} has no inner units")
    return POLICIES[name](layers)


# -- renderings -----------------------------------------------------------
def render_text(graph: PrefetchGraph) -> str:
    lines = [f"{len(graph.nodes())} units, {len(graph)} prefetch edges"]
    for phase, title in ((FWD, "forward"), (BWD, "backward")):
        edges = graph.edges(phase)
        lines.append(f"{title} ({len(edges)}):")
        for e in edges:
            size = graph.node(e.dst)["shard_size"]
            note = f"  [target shard size {size}]" if size is not None else ""
            implicit = "  (implicit)" if graph.is_implicit(e) else ""
            lines.append(f"  {e.id}{note}{implicit}")
    return "\n".join(lines)


def render_json(graph: PrefetchGraph) -> str:
    return json.dumps(graph.to_dict(), indent=2)


def _quote(name: str) -> str:
    """A DOT quoted string: backslash and quote escaped, line breaks as DOT's \\n, every
    other character as itself (DOT files are UTF-8: `é` stays `é`)."""
    text = name.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + text.replace("\r\n", "\\n").replace("\n", "\\n").replace("\r", "\\n") + '"'


def _mermaid_label(name: str) -> str:
    """Text for a mermaid node's quoted label: `#` and `"` as its entity codes (a quote
    would end the label), line breaks as spaces."""
    text = " ".join(name.splitlines()) if name else name
    return text.replace("#", "#35;").replace('"', "#quot;")


def render_dot(graph: PrefetchGraph) -> str:
    lines = ["digraph prefetch {", "  rankdir=LR;"]
    for n in graph.nodes():
        lines.append(f"  {_quote(n)} [shape=box];")
    colour = {FWD: "blue", BWD: "red"}
    for e in graph.edges():
        lines.append(
            f'  {_quote(e.src)} -> {_quote(e.dst)} [color={colour[e.phase]}, label="{e.phase}"];'
        )
    lines.append("}")
    return "\n".join(lines)


def render_mermaid(graph: PrefetchGraph) -> str:
    ids = {n: f"n{i}" for i, n in enumerate(graph.nodes())}
    lines = ["flowchart LR"]
    for n, i in ids.items():
        lines.append(f'  {i}["{_mermaid_label(n)}"]')
    for e in graph.edges():
        arrow = "-->" if e.phase == FWD else "-.->"
        lines.append(f"  {ids[e.src]} {arrow}|{e.phase}| {ids[e.dst]}")
    return "\n".join(lines)


CAUSE_COLOURS = ("black", "tab:purple", "tab:green", "tab:orange", "tab:brown", "tab:olive")


def render_png(graph: PrefetchGraph, path: str | Path, *, highlight: Iterable[str] = (),
               causes: Sequence[Sequence[str]] = (), height: float = 3.2) -> None:
    """Layers left to right; fwd edges arc above, bwd below; highlighted edges thick.

    causes: every cause's edges, each drawn thick in a colour of its own and named
    (`cause N` beside its edges), so that no cause of several goes unseen.
    """
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["text.parse_math"] = False  # unit names are plain text, never mathtext
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch

    highlight = set(highlight)
    cause_of = {e: i for i, edges in enumerate(causes) for e in edges}
    nodes = graph.nodes()
    x = {n: i for i, n in enumerate(nodes)}
    width = max(6.0, 0.9 * len(nodes))
    fig, ax = plt.subplots(figsize=(width, height))
    for n in nodes:
        ax.text(x[n], 0, n, rotation=90, ha="center", va="center", fontsize=7,
                bbox={"boxstyle": "round", "fc": "white", "ec": "grey"})
    colour = {FWD: "tab:blue", BWD: "tab:red"}
    for e in graph.edges():
        number = cause_of.get(e.id)
        hot = e.id in highlight or number is not None
        rad = -0.4 if e.phase == FWD else 0.4
        y = 0.35 if e.phase == FWD else -0.35
        ink = (CAUSE_COLOURS[number % len(CAUSE_COLOURS)] if number is not None
               else "black" if hot else colour[e.phase])
        ax.add_patch(FancyArrowPatch(
            (x[e.src], y), (x[e.dst], y), connectionstyle=f"arc3,rad={rad}", arrowstyle="-|>",
            mutation_scale=10, color=ink, lw=3 if hot else 1, zorder=3 if hot else 2))
        if number is not None:  # named in the band beyond the arcs, over its edge's middle
            ax.text((x[e.src] + x[e.dst]) / 2, 1.3 if e.phase == FWD else -1.3,
                    f"cause {number + 1}", ha="center", va="center", fontsize=8,
                    fontweight="bold", color=ink)
    ax.set_xlim(-1, len(nodes))
    ax.set_ylim(-1.5, 1.5)
    ax.axis("off")
    named = ", ".join(f"cause {i + 1} in {CAUSE_COLOURS[i % len(CAUSE_COLOURS)].removeprefix('tab:')}"
                      for i in range(len(causes)))
    ax.set_title("prefetch edges: forward (blue, above), backward (red, below)"
                 + (f"\n{named}" if named else ", culprit in black" if highlight else ""),
                 fontsize=9)
    fig.tight_layout()
    from bisect_prefetch.files import save_figure_atomic

    save_figure_atomic(fig, path, dpi=100)
    plt.close(fig)


RENDERERS: dict[str, Callable[[PrefetchGraph], str]] = {
    "text": render_text,
    "json": render_json,
    "dot": render_dot,
    "mermaid": render_mermaid,
}
