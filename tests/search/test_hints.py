"""Localization hints and audit suspects as a soft, learned prior."""

import numpy as np
import pytest

from bisect_prefetch.graph import from_policy
from bisect_prefetch.search.hints import HintPrior, edge_ends
from bisect_prefetch.search.posterior import EdgePosterior

EDGES = from_policy("fsdp2-chain", 6).edge_ids()


def prior_of(hints):
    h = HintPrior(EDGES)
    for unit in hints:
        h.add_hint(unit)
    single, _ = h.log_factors()
    p = np.exp(single)
    return p / p.sum()


def test_edge_ends_split_an_edge_id():
    assert edge_ends("bwd:layers.2->layers.1") == ("layers.2", "layers.1")


def test_a_hint_favours_edges_into_its_unit_then_their_neighbours():
    p = prior_of(["layers.3"])
    into = [i for i, e in enumerate(EDGES) if edge_ends(e)[1] == "layers.3"]
    near = [i for i, e in enumerate(EDGES) if edge_ends(e)[1] in ("layers.2", "layers.4")]
    far = [i for i in range(len(EDGES)) if i not in into + near]
    assert min(p[into]) > max(p[near]) > max(p[far])
    assert p[far].min() > 0  # soft: nothing is ruled out by a hint


def test_agreeing_hints_weigh_more_and_disagreeing_ones_cancel():
    into = [i for i, e in enumerate(EDGES) if edge_ends(e)[1] == "layers.3"]
    one, two = prior_of(["layers.3"]), prior_of(["layers.3", "layers.3"])
    assert two[into].sum() > one[into].sum()
    split = prior_of(["layers.3", "layers.1"])
    assert split[into].sum() < one[into].sum()


def test_unknown_units_and_suspects_are_ignored_with_an_event():
    h = HintPrior(EDGES)
    assert h.add_hint("layers.99") == {"event": "hint-ignored", "unit": "layers.99", "reason": "unknown-unit"}
    assert not h.hints
    event = h.add_hint("layers.2")
    assert event["event"] == "hint" and event["unit"] == "layers.2"
    assert all(edge_ends(e)[1] == "layers.2" for e in event["edges"])
    events = h.set_suspects(["fwd:nope->x", EDGES[0]])
    assert events[0] == {"event": "suspect-ignored", "edge": "fwd:nope->x", "reason": "unknown-edge"}
    assert events[1] == {"event": "suspects", "edges": [EDGES[0]]}


def test_a_hint_the_runs_clear_loses_its_weight():
    # The hinted edges keep running clean while another diverges: the posterior leaves them.
    h = HintPrior(EDGES)
    h.add_hint("layers.3")
    post = EdgePosterior(len(EDGES))
    post.set_prior_factor(*h.log_factors())
    hinted = np.array([edge_ends(e)[1] == "layers.3" for e in EDGES])
    before = post.probabilities().single[hinted].sum()
    culprit = np.zeros(len(EDGES), dtype=bool)
    culprit[0] = True
    assert not hinted[0]
    for _ in range(8):
        post.observe(hinted, diverged=False)
    post.observe(culprit, diverged=True)
    after = post.probabilities()
    assert before > 0.3
    assert after.single[hinted].sum() < 0.05 * before
    assert after.single[0] == pytest.approx(after.single.max())


def test_suspects_raise_their_edges_prior():
    h = HintPrior(EDGES)
    h.set_suspects([EDGES[2], EDGES[5]])
    single, pair = h.log_factors()
    assert single[2] == single[5] > 0 > single[0]
    assert pair[2, 5] > pair[0, 1]
