"""Selectors, presets and the Mask type (select.py): globs, words, errors that name the nearest edge."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.graph import from_policy
from bisect_prefetch.select import (
    describe,
    preset_mask,
    quote,
    resolve_mask,
    select,
    select_many,
)

IDS = from_policy("mindformers", 4).edge_ids()
FWD = {e for e in IDS if e.startswith("fwd:")}
BWD = {e for e in IDS if e.startswith("bwd:")}


def test_words():
    assert select("all", IDS) == IDS
    assert select("none", IDS) == []
    assert set(select("fwd", IDS)) == FWD
    assert set(select("bwd", IDS)) == BWD


def test_exact_id():
    assert select("bwd:decoder.layers.1->decoder.layers.0", IDS) == ["bwd:decoder.layers.1->decoder.layers.0"]


@pytest.mark.parametrize(
    ("glob", "expected"),
    [
        ("bwd:*", BWD),
        ("*->embedding", {"bwd:decoder.layers.0->embedding"}),
        ("fwd:decoder.layers.*->*", {e for e in FWD if e.startswith("fwd:decoder.layers.")}),
        ("bwd:decoder.layers.1->*", {"bwd:decoder.layers.1->decoder.layers.0"}),
        ("*:output_layer->*", {"bwd:output_layer->decoder.layers.3"}),
        ("fwd:decoder.layers.[23]->*", {
            "fwd:decoder.layers.2->decoder.layers.3",
            "fwd:decoder.layers.3->decoder.final_layernorm", "fwd:decoder.layers.3->output_layer"}),
    ],
)
def test_globs(glob, expected):
    assert set(select(glob, IDS)) == expected


@pytest.mark.parametrize("bad", ["bwd:decoder.layer.1->decoder.layers.0", "fwd:nothing*", "sideways"])
def test_selector_matching_nothing_names_nearest(bad):
    with pytest.raises(BisectPrefetchError, match="matches no edge; nearest: .*decoder"):
        select(bad, IDS)


def test_empty_selector_is_an_error():
    with pytest.raises(BisectPrefetchError, match="empty selector"):
        select("  ", IDS)


def test_presets():
    assert preset_mask("all-on", IDS) == frozenset(IDS)
    assert preset_mask("all-off", IDS) == frozenset()
    assert preset_mask("backward-off", IDS) == frozenset(FWD)
    assert preset_mask("forward-off", IDS) == frozenset(BWD)
    assert preset_mask("keep-only:bwd:decoder.layers.1->*", IDS) == {"bwd:decoder.layers.1->decoder.layers.0"}
    assert preset_mask("drop-only:bwd:decoder.layers.1->decoder.layers.0", IDS) == frozenset(IDS) - {
        "bwd:decoder.layers.1->decoder.layers.0"}
    assert preset_mask("keep-only:bwd:output_layer->*,fwd:embedding->*", IDS) == {
        "bwd:output_layer->decoder.layers.3", "fwd:embedding->decoder.layers.0"}


@pytest.mark.parametrize("bad", ["all-onn", "keep-only", "keep-only:", "drop-only:bwd:zzz", "half-on"])
def test_bad_presets(bad):
    with pytest.raises(BisectPrefetchError):
        preset_mask(bad, IDS)


def test_resolve_mask():
    assert resolve_mask([], IDS) == frozenset(IDS)
    assert resolve_mask(["backward-off"], IDS) == frozenset(FWD)
    assert resolve_mask(["bwd:*", "fwd:embedding->*"], IDS) == frozenset(BWD | {"fwd:embedding->decoder.layers.0"})
    with pytest.raises(BisectPrefetchError, match="cannot be combined"):
        resolve_mask(["all-off", "bwd:*"], IDS)


def test_describe_names_presets():
    assert describe(frozenset(IDS), IDS) == "all-on"
    assert describe(frozenset(), IDS) == "all-off"
    assert describe(frozenset(FWD), IDS) == "backward-off"
    assert describe(frozenset(BWD), IDS) == "forward-off"
    assert describe(frozenset({"bwd:decoder.layers.1->decoder.layers.0"}), IDS).startswith("keep-only:")


@given(st.sets(st.sampled_from(IDS)))
def test_keep_only_and_drop_only_are_complements(chosen):
    if not chosen:
        return
    sel = ",".join(sorted(chosen))
    keep = preset_mask(f"keep-only:{sel}", IDS)
    drop = preset_mask(f"drop-only:{sel}", IDS)
    assert keep == frozenset(chosen)
    assert keep | drop == frozenset(IDS) and not keep & drop
    assert set(select_many([sel], IDS)) == chosen


# Legal module names (ModuleDict keys) that a plain comma list or a glob would misread.
HOSTILE_IDS = ["bwd:experts[0]->experts[1]", "fwd:a,b->c", "bwd:x*y->z?", "fwd:my layer->o\\k",
               "bwd:experts[1]->experts[0]", "fwd:c->a,b"]


@pytest.mark.parametrize("chosen", [HOSTILE_IDS[:1], HOSTILE_IDS[1:2], HOSTILE_IDS[2:4],
                                    HOSTILE_IDS])
def test_every_printed_mask_reads_back_as_its_edges(chosen):
    """quote() is how the tool prints edges in a mask (reproduce, explain, cells_from,
    describe): keep-only of it, drop-only of it and a plain selector select exactly them."""
    text = quote(chosen)
    assert set(resolve_mask([f"keep-only:{text}"], HOSTILE_IDS)) == set(chosen)
    assert set(resolve_mask([f"drop-only:{text}"], HOSTILE_IDS)) == set(HOSTILE_IDS) - set(chosen)
    assert set(resolve_mask([text], HOSTILE_IDS)) == set(chosen)
    assert set(resolve_mask([f"keep-only:{describe_ids(chosen)}"], HOSTILE_IDS)) == set(chosen)


def describe_ids(chosen: list[str]) -> str:
    name = describe(frozenset(chosen), HOSTILE_IDS)
    return name.partition(":")[2] if ":" in name and len(chosen) <= 2 else quote(chosen)


def test_an_id_written_as_the_graph_spells_it_is_that_edge():
    assert select_many(["bwd:experts[0]->experts[1]"], HOSTILE_IDS) == ["bwd:experts[0]->experts[1]"]
    assert select_many(["fwd:a,b->c"], HOSTILE_IDS) == ["fwd:a,b->c"]
    # Unescaped, a glob is still a glob, and a comma still separates selectors.
    assert select_many(["bwd:experts*"], HOSTILE_IDS) == [HOSTILE_IDS[0], HOSTILE_IDS[4]]
    assert select_many([r"bwd:x\*y->z\?,fwd:c->a\,b"], HOSTILE_IDS) == [HOSTILE_IDS[2], HOSTILE_IDS[5]]
