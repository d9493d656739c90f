"""Merge what each rank recorded into one graph.json and one probe.json per run.

Ranks must agree: on the graph they discovered, and on the plan they ran
(each records the plan's hash). Ranks running different masks make
collectives diverge or hang, so a mismatch makes the run unusable; the
problems are returned as sentences for the run's status, not raised.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bisect_prefetch.files import write_text_atomic
from bisect_prefetch.judge.audit import read_probe
from bisect_prefetch.vocab import GRAPH_FILE, PROBE_FILE

REFUSED = "cannot switch masks inside a run"  # a run's error where its engine refused a schedule
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


def schedule_problems(merged: dict | None, schedule: Sequence[tuple[int, Any]],
                      before_step: int) -> list[str]:
    """What shows that the ranks of a run did not follow its schedule of masks (search/
    segments.py): an engine that refused to switch, a segment begun at another step than
    planned or out of order, or a segment begun before `before_step` that a rank never
    recorded. A rank's record of a segment reaches its probe once the segment's first
    step ended, so a run stopped at a difference at step t must show the segments begun
    before t (before_step = t), a run that ran to its end every one it reached."""
    needed = sum(1 for first, _ in schedule if first < before_step)
    if not merged:
        return [] if needed <= 1 else ["no probe: nothing shows the ranks followed the schedule of masks"]
    problems = []
    for rank, probe in sorted(merged.get("ranks", {}).items()):
        if not isinstance(probe, dict):
            continue
        if refused := probe.get("schedule_refused"):
            problems.append(f"rank {rank} {REFUSED}: {refused}")
            continue
        followed = probe.get("schedule_followed")
        if not isinstance(followed, list) or not all(
                isinstance(e, list) and len(e) == 2 and all(type(x) is int for x in e) for e in followed):
            problems.append(f"rank {rank} recorded no schedule it followed")
            continue
        for place, (index, first) in enumerate(followed):
            if index != place or index >= len(schedule) or schedule[index][0] != first:
                planned = schedule[index][0] if 0 <= index < len(schedule) else "no step"
                problems.append(f"rank {rank} began segment {index} at step {first} "
                                f"(planned: {planned})")
                break
        else:
            if len(followed) < needed:
                problems.append(f"rank {rank} never began segment {len(followed)} (planned "
                                f"at step {schedule[len(followed)][0]})")
    return problems


def mask_not_applied(merged: dict | None, run_dir: Path) -> str | None:
    """Why nothing shows that a run's mask was applied, or None when something does.

    Asked of a run whose mask switches an edge of the graph off. Its mask was applied when
    a prefetch went through the adapter's gate on some rank (the probe's edges), or the
    engine's adapter hooked the job (only its hooks write a rank's graph, and the gate is in
    the same hooks: a run stopped at its first difference may end before its probe). A job
    the adapter never entered (an engine it does not hook, a launcher that dropped the
    environment) shows neither: its numbers are those of all-on, whatever the mask."""
    if merged is not None and any(merged.get("edges") or {}):
        return None
    if _rank_files(run_dir, "graph"):
        return None
    if merged is None:
        return ("its mask was not applied: no rank acknowledged the plan (no probe; did the "
                "job run under the adapter?)")
    return ("its mask was not applied: no prefetch went through the adapter's gate on any "
            "rank (is the job's FSDP engine one the adapter hooks?)")


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks)
