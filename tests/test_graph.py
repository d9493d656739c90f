"""The prefetch graph (graph.py): static policies' edges, their order, edge ids parsed."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.graph import (
    Edge,
    PrefetchGraph,
    from_policy,
    render_dot,
    render_mermaid,
    render_png,
    render_text,
)


def edge_set(graph):
    return set(graph.edge_ids())


@pytest.mark.parametrize("layers", [1, 2, 4, 32])
def test_mindformers_chain(layers):
    g = from_policy("mindformers", layers)
    L = [f"decoder.layers.{i}" for i in range(layers)]
    fwd = {f"fwd:embedding->{L[0]}", f"fwd:{L[-1]}->decoder.final_layernorm", f"fwd:{L[-1]}->output_layer"}
    fwd |= {f"fwd:{a}->{b}" for a, b in zip(L, L[1:], strict=False)}
    bwd = {f"bwd:output_layer->{L[-1]}", f"bwd:{L[0]}->embedding"}
    bwd |= {f"bwd:{b}->{a}" for a, b in zip(L, L[1:], strict=False)}
    assert edge_set(g) == fwd | bwd
    assert len(g.edges("fwd")) == layers + 2
    assert len(g.edges("bwd")) == layers + 1
    assert g.nodes() == ["embedding", *L, "decoder.final_layernorm", "output_layer"]


def test_mindformers_four_layers_has_6_forward_5_backward():
    g = from_policy("mindformers", 4)
    assert len(g.edges("fwd")) == 6 and len(g.edges("bwd")) == 5
    assert len(from_policy("mindformers", 32)) == 67


def test_mindformers_inner_units_are_targeted_by_layer_edges():
    g = from_policy("mindformers", 2, inner=["input_layernorm"])
    ids = edge_set(g)
    assert "fwd:embedding->decoder.layers.0.input_layernorm" in ids
    assert "fwd:decoder.layers.0->decoder.layers.1.input_layernorm" in ids
    assert "bwd:decoder.layers.1->decoder.layers.0.input_layernorm" in ids
    assert "bwd:output_layer->decoder.layers.1.input_layernorm" in ids
    assert g.node("decoder.layers.0.input_layernorm")["kind"] == "inner"


@pytest.mark.parametrize("layers", [1, 3, 8])
def test_fsdp2_chain(layers):
    g = from_policy("fsdp2-chain", layers)
    expected = {f"fwd:layers.{i}->layers.{i + 1}" for i in range(layers - 1)}
    expected |= {f"bwd:layers.{i + 1}->layers.{i}" for i in range(layers - 1)}
    assert edge_set(g) == expected
    assert g.nodes() == [f"layers.{i}" for i in range(layers)]


@pytest.mark.parametrize("layers", [1, 6])
def test_torchtitan_policy_is_030s_implicit_backward_chain(layers):
    g = from_policy("torchtitan", layers)
    chain = ["tok_embeddings", *[f"layers.{i}" for i in range(layers)], "norm+lm_head"]
    assert edge_set(g) == {f"bwd:{b}->{a}" for a, b in zip(chain, chain[1:], strict=False)}
    assert g.nodes() == [*chain, "root"] and g.node("root")["order"] is None
    assert all(g.is_implicit(e) for e in g.edges())
    assert len(g) == layers + 1  # 7 for torchtitan's 6-layer debugmodel


def test_edges_are_grouped_by_phase_in_layer_order():
    ids = from_policy("fsdp2-chain", 4).edge_ids()
    assert ids == [
        "fwd:layers.0->layers.1", "fwd:layers.1->layers.2", "fwd:layers.2->layers.3",
        "bwd:layers.3->layers.2", "bwd:layers.2->layers.1", "bwd:layers.1->layers.0",
    ]


def test_unknown_policy_and_bad_layers():
    with pytest.raises(BisectPrefetchError, match="unknown policy"):
        from_policy("megatron", 4)
    with pytest.raises(BisectPrefetchError, match="between 1 and"):
        from_policy("fsdp2-chain", 0)


def test_edge_parse():
    assert Edge.parse("bwd:decoder.layers.1->decoder.layers.0") == Edge("bwd", "decoder.layers.1", "decoder.layers.0")
    for bad in ["", "x:a->b", "fwd:a-b", "fwd:->b", "bwd:a->"]:
        with pytest.raises(BisectPrefetchError):
            Edge.parse(bad)


names = st.text(alphabet="abcdefghij.0123456789_", min_size=1, max_size=12)


@st.composite
def graphs(draw):
    node_names = draw(st.lists(names, min_size=1, max_size=8, unique=True))
    g = PrefetchGraph()
    for i, n in enumerate(node_names):
        g.add_node(
            n, kind=draw(st.sampled_from(["embedding", "layer", "inner", "tail", "root"])),
            order=i, shard_size=draw(st.one_of(st.none(), st.integers(1, 8))),
        )
    pairs = draw(st.lists(st.tuples(st.sampled_from(["fwd", "bwd"]), st.sampled_from(node_names),
                                    st.sampled_from(node_names), st.booleans()), max_size=12))
    for phase, src, dst, implicit in pairs:
        g.add_edge(phase, src, dst, implicit=implicit)
    return g


@given(graphs())
def test_json_round_trip_is_lossless(g):
    text = json.dumps(g.to_dict())
    back = PrefetchGraph.from_dict(json.loads(text))
    assert back.to_dict() == g.to_dict()
    assert json.dumps(back.to_dict()) == text


@pytest.mark.parametrize("policy", ["mindformers", "fsdp2-chain", "torchtitan"])
def test_policy_json_round_trip(policy, tmp_path):
    g = from_policy(policy, 5)
    path = tmp_path / "graph.json"
    path.write_text(json.dumps(g.to_dict()))
    assert PrefetchGraph.load(path) == g


def test_load_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(BisectPrefetchError, match="not JSON"):
        PrefetchGraph.load(bad)
    bad.write_text(json.dumps({"nodes": [{"name": "a"}], "edges": []}))
    with pytest.raises(BisectPrefetchError, match="not a prefetch graph"):
        PrefetchGraph.load(bad)
    bad.write_text(json.dumps({"nodes": [], "edges": [{"phase": "fwd", "src": "a", "dst": "b"}]}))
    with pytest.raises(BisectPrefetchError, match="unknown node"):
        PrefetchGraph.load(bad)
    with pytest.raises(BisectPrefetchError, match="cannot read"):
        PrefetchGraph.load(tmp_path / "missing.json")


def test_renderings_mention_every_edge(tmp_path):
    g = from_policy("mindformers", 3)
    text = render_text(g)
    assert "forward (5):" in text and "backward (4):" in text
    for e in g.edges():
        assert e.id in text
        assert f'"{e.src}" -> "{e.dst}"' in render_dot(g)
    mermaid = render_mermaid(g)
    assert mermaid.startswith("flowchart LR")
    assert mermaid.count("-->|fwd|") == 5 and mermaid.count("-.->|bwd|") == 4
    png = tmp_path / "g.png"
    render_png(g, png, highlight=["bwd:decoder.layers.1->decoder.layers.0"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_graph_file_with_a_null_order_loads_and_sorts_that_unit_last():
    graph = PrefetchGraph.from_dict({
        "nodes": [{"name": "root", "kind": "root", "order": None, "shard_size": None},
                  {"name": "layers.0", "kind": "layer", "order": 0, "shard_size": 2}],
        "edges": [{"id": "bwd:root->layers.0", "phase": "bwd", "src": "root", "dst": "layers.0"}],
    })
    assert graph.nodes() == ["layers.0", "root"]
    assert graph.to_dict()["nodes"][1]["order"] is None
    assert PrefetchGraph.from_dict(graph.to_dict()) == graph
