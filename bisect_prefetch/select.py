r"""Selectors, presets and masks over a graph's edge ids.

A mask is the frozenset of ENABLED edge ids. A selector picks edge ids:
an exact id, a glob over ids (`bwd:*`, `*->embedding`), or one of the words
`all`, `none`, `fwd`, `bwd`. A preset turns selectors into a mask the way
engineers run these experiments: `all-on`, `all-off`, `backward-off`,
`forward-off`, `keep-only:SEL` (everything off but SEL), `drop-only:SEL`
(everything on but SEL). A selector that matches nothing is an error that
names the nearest edge ids: it never silently yields an empty mask.

Quoting (docs/contract.md). Several selectors may share one string, separated by
commas. A backslash makes the next character plain: `\,` is a comma inside an
edge id, `\*`, `\?`, `\[`, `\]` are no glob, `\\` is a backslash. An edge id
written whole, as the graph spells it, is always that edge, whatever it holds
(`bwd:experts[0]->experts[1]`). Spaces inside an id need nothing (a printed
command quotes them for the shell); a selector's ends are stripped.
`quote(edge_ids)` writes ids so that every printed mask reads back as the same
edges.
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Iterable, Sequence

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.vocab import (
    BWD,
    DROP_ONLY,
    FWD,
    KEEP_ONLY,
    PHASES,
    Mask,
    edge_phase,
    quote_edges,
)

quote = quote_edges  # the ids' quoting, spelled once in vocab.py

__all__ = ["Mask", "describe", "is_preset", "preset_mask", "quote", "resolve_mask", "select",
           "select_many"]

PRESETS = ("all-on", "all-off", "backward-off", "forward-off", "keep-only:SEL", "drop-only:SEL")
_GLOB_CHARS = set("*?[")


def _nearest(selector: str, edge_ids: Sequence[str], n: int = 3) -> str:
    near = difflib.get_close_matches(selector, edge_ids, n=n, cutoff=0.0)
    return ", ".join(near) if near else "(the graph has no edges)"


def _unescape(text: str) -> tuple[str, str | None]:
    """(the plain text, an fnmatch pattern where an unescaped glob character is in it)."""
    plain, pattern, glob, i = [], [], False, 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            i += 1
            plain.append(text[i])
            pattern.append(f"[{text[i]}]" if text[i] in "*?[" else text[i])
        else:
            glob = glob or ch in _GLOB_CHARS
            plain.append(ch)
            pattern.append(ch)
        i += 1
    return "".join(plain), ("".join(pattern) if glob else None)


def select(selector: str, edge_ids: Sequence[str]) -> list[str]:
    """Edge ids matched by one selector, in graph order."""
    if selector in edge_ids:  # an id as the graph spells it: that edge, whatever it holds
        return [selector]
    sel = selector.strip()
    if sel == "all":
        return list(edge_ids)
    if sel == "none":
        return []
    if sel in PHASES:
        return [e for e in edge_ids if edge_phase(e) == sel]
    if not sel:
        raise BisectPrefetchError("empty selector (use an edge id, a glob, all, none, fwd or bwd)")
    plain, pattern = _unescape(sel)
    if pattern is not None:
        matched = [e for e in edge_ids if fnmatch.fnmatchcase(e, pattern)]
    else:
        matched = [e for e in edge_ids if e == plain]
    if not matched:
        raise BisectPrefetchError(
            f"selector {selector!r} matches no edge; nearest: {_nearest(sel, edge_ids)}"
        )
    return matched


def select_many(selectors: Iterable[str], edge_ids: Sequence[str]) -> list[str]:
    """Union of several selectors (comma-separated within one string too), in graph order."""
    chosen: set[str] = set()
    for selector in selectors:
        parts = [selector] if selector in edge_ids else _split(selector)
        for part in parts:
            chosen.update(select(part, edge_ids))
    return [e for e in edge_ids if e in chosen]


def _split(selector: str) -> list[str]:
    """The selectors of a string, at its commas but an escaped one (`\\,`)."""
    parts, current, i = [], [], 0
    while i < len(selector):
        ch = selector[i]
        if ch == "\\" and i + 1 < len(selector):
            current.append(selector[i:i + 2])
            i += 2
            continue
        if ch == ",":
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
        i += 1
    parts.append("".join(current))
    return [p for p in (s.strip() for s in parts) if p] or [selector]


def preset_mask(preset: str, edge_ids: Sequence[str]) -> Mask:
    """The enabled edges under a preset name."""
    name, _, arg = preset.partition(":")
    if name == "all-on" and not arg:
        return frozenset(edge_ids)
    if name == "all-off" and not arg:
        return frozenset()
    if name == "backward-off" and not arg:
        return frozenset(e for e in edge_ids if edge_phase(e) != BWD)
    if name == "forward-off" and not arg:
        return frozenset(e for e in edge_ids if edge_phase(e) != FWD)
    if name in (KEEP_ONLY, DROP_ONLY):
        if not arg:
            raise BisectPrefetchError(f"preset {name} needs a selector: {name}:SEL")
        chosen = set(select_many([arg], edge_ids))
        if name == KEEP_ONLY:
            return frozenset(chosen)
        return frozenset(e for e in edge_ids if e not in chosen)
    raise BisectPrefetchError(f"unknown preset {preset!r} (one of {', '.join(PRESETS)})")


def is_preset(text: str) -> bool:
    name = text.partition(":")[0]
    return text in ("all-on", "all-off", "backward-off", "forward-off") or name in (KEEP_ONLY, DROP_ONLY)


def resolve_mask(specs: Sequence[str], edge_ids: Sequence[str]) -> Mask:
    """`--mask` values -> mask. One preset, or selectors of the edges to ENABLE.

    No spec at all means every edge on (the build as it is).
    """
    if not specs:
        return frozenset(edge_ids)
    presets = [s for s in specs if is_preset(s)]
    if presets:
        if len(specs) > 1:
            raise BisectPrefetchError(
                f"a preset ({presets[0]}) cannot be combined with other --mask values"
            )
        return preset_mask(presets[0], edge_ids)
    return frozenset(select_many(specs, edge_ids))


def describe(mask: Mask, edge_ids: Sequence[str]) -> str:
    """Short human name for a mask: a preset name where one fits, else counts."""
    n, on = len(edge_ids), [e for e in edge_ids if e in mask]
    if len(on) == n:
        return "all-on"
    if not on:
        return "all-off"
    if set(on) == {e for e in edge_ids if edge_phase(e) == FWD}:
        return "backward-off"
    if set(on) == {e for e in edge_ids if edge_phase(e) == BWD}:
        return "forward-off"
    if len(on) <= 2:
        return "keep-only:" + quote(on)
    off = [e for e in edge_ids if e not in mask]
    if len(off) <= 2:
        return "drop-only:" + quote(off)
    return f"{len(on)} of {n} on"
