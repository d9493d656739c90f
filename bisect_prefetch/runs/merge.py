"""Merge what each rank recorded into one graph.json and one probe.json per run.

Ranks must agree: on the graph they discovered, and on the plan they ran
(each records the plan's hash). Ranks running different masks make
collectives diverge or hang, so a mismatch makes the run unusable; the
problems are returned as sentences for the run's status, not raised.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from bisect_prefetch.audit import read_probe
from bisect_prefetch.files import write_text_atomic

GRAPH_FILE = "graph.json"
PROBE_FILE = "probe.json"
_RANK_FILE = re.compile(r"^(graph|probe)\.rank(\d+)\.json$")


def _rank_files(run_dir: Path, kind: str) -> dict[int, Path]:
    found = {}
    for path in Path(run_dir).iterdir():
        match = _RANK_FILE.match(path.name)
        if match and match.group(1) == kind:
            found[int(match.group(2))] = path
    return dict(sorted(found.items()))


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def merge_graphs(run_dir: Path) -> tuple[dict | None, list[str]]:
    """graph.rank*.json -> graph.json when every rank saw the same graph."""
    files = _rank_files(run_dir, "graph")
    if not files:
        return None, []
    graphs = {rank: _read(path) for rank, path in files.items()}
    unreadable = [r for r, g in graphs.items() if not isinstance(g, dict)]
    if unreadable:
        return None, [f"graph of rank(s) {_ranks(unreadable)} unreadable"]
    first_rank, first = next(iter(graphs.items()))
    differing = [r for r, g in graphs.items() if g != first]
    if differing:
        return None, [
            f"ranks disagree on the prefetch graph: rank(s) {_ranks(differing)} "
            f"differ from rank {first_rank}"
        ]
    write_text_atomic(Path(run_dir) / GRAPH_FILE, json.dumps(first, indent=1) + "\n")
    return first, []


def merge_probes(run_dir: Path, expected_plan_hash: str) -> tuple[dict | None, list[str]]:
    """probe.rank*.json -> probe.json {"ranks": {R: probe}, "edges": totals over ranks}.

    Every rank's plan_hash must be the plan's: a rank that ran another plan
    makes the run unusable.
    """
    files = _rank_files(run_dir, "probe")
    if not files:
        return None, []
    read = {rank: read_probe(path) for rank, path in files.items()}
    probes = {rank: probe for rank, (probe, _) in read.items()}
    problems = []
    unreadable = [r for r, p in probes.items() if p is None]
    if unreadable:
        why = read[unreadable[0]][1]
        problems.append(f"probe of rank(s) {_ranks(unreadable)} unreadable ({why})")
    wrong_plan = [r for r, p in probes.items()
                  if isinstance(p, dict) and p.get("plan_hash") != expected_plan_hash]
    if wrong_plan:
        problems.append(f"rank(s) {_ranks(wrong_plan)} ran a different plan (plan hash mismatch)")
    totals: dict[str, dict[str, int]] = {}
    for probe in probes.values():
        if not isinstance(probe, dict):
            continue
        for edge, counts in (probe.get("edges") or {}).items():
            into = totals.setdefault(edge, {})
            for name, count in counts.items():
                if isinstance(count, int):
                    into[name] = into.get(name, 0) + count
    merged = {"plan_hash": expected_plan_hash, "edges": totals,
              "ranks": {str(r): p for r, p in probes.items()}}
    write_text_atomic(Path(run_dir) / PROBE_FILE, json.dumps(merged, indent=1) + "\n")
    return merged, problems


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks)
