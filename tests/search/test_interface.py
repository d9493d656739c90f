"""The Search protocol (search/interface.py): both searches the bisect loop drives are one,
and it names what the loop uses of them, no more."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from bisect_prefetch.commands import bisect_loop
from bisect_prefetch.search import segments
from bisect_prefetch.search.causes import CauseSearch
from bisect_prefetch.search.interface import Search
from bisect_prefetch.search.protocol import Bisection

EDGES = ["fwd:a->b", "fwd:b->c", "bwd:c->b"]


def _names() -> set[str]:
    return {name for name in Search.__dict__ if not name.startswith("_")} | set(Search.__annotations__)


def test_both_searches_are_a_search():
    assert isinstance(Bisection(EDGES), Search)
    assert isinstance(CauseSearch(EDGES), Search)
    assert not isinstance(object(), Search)


def _used_of_search(source: str) -> set[str]:
    """The attributes read of `search` or `self.search` in a module's source."""
    used = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id == "search":
                used.add(node.attr)
            elif isinstance(owner, ast.Attribute) and owner.attr == "search":
                used.add(node.attr)
    return used


def test_the_protocol_names_what_the_loop_uses():
    loop = _used_of_search(Path(inspect.getfile(bisect_loop)).read_text())
    on_its_behalf = _used_of_search(Path(inspect.getfile(segments)).read_text())
    assert loop <= _names()
    assert _names() - {"startups"} == loop | on_its_behalf  # startups: bisect.json's segments record
