"""The size-one prefetch audit: does this build still prefetch into size-one units?

One short recorded run gives the discovered graph (each target's effective
shard size) and the probe (per edge: prefetch outcomes, and for hyper-parallel
the calls of parameter ``unshard(async_op=True)``). From them, per edge:

- ``attempts``: prefetches that reached a sharded target (issued + noop, less
  those that found the target already unsharded); for a probe without
  parameter-level counts (FSDP2), the issued ones;
- ``async_unshards``: parameter ``unshard(async_op=True)`` calls (FSDP2: the
  all-gathers issued).

Rule: a size-one edge that still issues async unshards is the reported bug (a
redundant local copy overlapping the unit's own unshard); a real-FSDP edge
(shard size > 1) with attempts but no async unshard has lost its prefetch,
the refactor pitfall of a guard reading ``getattr(param, "shard_size", 1)`` on
parameters that have no ``shard_size``. ``ok`` is false on either. ``guard``
is ``disables-real-prefetch`` on the second, else ``absent`` on the first,
else ``present`` when size-one prefetches were attempted (or skipped by the
tool's guard) without an async unshard, else ``absent`` with
``guard_observed: false`` (no size-one edge fired: nothing to judge by).
``pitfall_units`` names sharded units whose parameters lack ``shard_size``:
there a guard reading it would switch real prefetch off.

Pure functions over the JSON the recorder writes; ``audit_run_dir`` reads it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bisect_prefetch.errors import BisectPrefetchError

OUTCOMES = ("issued", "noop", "masked", "guarded")


def _empty_counts() -> dict[str, int]:
    return {**dict.fromkeys(OUTCOMES, 0), "async_unshards": 0, "attempts": 0}


def _summed_counts(probes: Sequence[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Per edge: outcome counts, async unshards and attempts, summed over ranks."""
    total: dict[str, dict[str, int]] = {}
    for probe in probes:
        param_counts = probe.get("hyper_parallel", {}).get("edges")
        for edge_id in set(probe.get("edges", {})) | set(param_counts or {}):
            counts = total.setdefault(edge_id, _empty_counts())
            outcomes = probe.get("edges", {}).get(edge_id, {})
            for outcome in OUTCOMES:
                counts[outcome] += int(outcomes.get(outcome, 0))
            if param_counts is not None:
                extra = param_counts.get(edge_id, {})
                counts["async_unshards"] += int(extra.get("async_unshards", 0))
                counts["attempts"] += (
                    int(outcomes.get("issued", 0)) + int(outcomes.get("noop", 0))
                    - int(extra.get("already_unsharded", 0))
                )
            else:  # FSDP2: each issued prefetch is one all-gather; noops found it pending
                counts["async_unshards"] += int(outcomes.get("issued", 0))
                counts["attempts"] += int(outcomes.get("issued", 0))
    return total


def _pitfall_units(probes: Sequence[dict[str, Any]]) -> list[str]:
    names = set()
    for probe in probes:
        for name, unit in probe.get("hyper_parallel", {}).get("units", {}).items():
            if unit.get("shard_size", 1) > 1 and unit.get("params_with_shard_size", 0) < unit.get(
                "params", 0
            ):
                names.add(name)
    return sorted(names)


def audit(graph: dict[str, Any], probes: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The audit JSON (DESIGN.md) for a discovered graph and its ranks' probes."""
    shard_sizes = {node["name"]: node.get("shard_size") for node in graph.get("nodes", [])}
    counts = _summed_counts(probes)
    edges = []
    for edge in graph.get("edges", []):
        c = counts.get(edge["id"], _empty_counts())
        size = shard_sizes.get(edge["dst"])
        edges.append(
            {
                "id": edge["id"],
                "target_shard_size": size,
                "size_one": size == 1,
                "async_unshards": c["async_unshards"],
                "attempts": c["attempts"],
                "guarded": c["guarded"],
                "masked": c["masked"],
            }
        )
    size_one = [e for e in edges if e["size_one"]]
    still_unshards = [e["id"] for e in size_one if e["async_unshards"] > 0]
    lost = [
        e["id"]
        for e in edges
        if not e["size_one"] and e["target_shard_size"] and e["attempts"] > 0
        and e["async_unshards"] == 0
    ]
    observed = any(e["attempts"] > 0 or e["guarded"] > 0 for e in size_one)
    if lost:
        guard = "disables-real-prefetch"
    elif still_unshards or not observed:
        guard = "absent"
    else:
        guard = "present"
    return {
        "edges": edges,
        "guard": guard,
        "guard_observed": observed or bool(lost),
        "ok": not still_unshards and not lost,
        "size_one_edges": [e["id"] for e in size_one],
        "size_one_edges_unsharding": still_unshards,
        "real_prefetch_lost": lost,
        "pitfall_units": _pitfall_units(probes),
    }


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise BisectPrefetchError(f"cannot read {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise BisectPrefetchError(f"{path}: not JSON ({exc.msg}, line {exc.lineno})") from None


def audit_run_dir(run_dir: str | Path) -> dict[str, Any]:
    """Audit a finished run: its graph (rank 0's, or graph.json) and every rank's probe."""
    run_dir = Path(run_dir)
    graph_path = next(
        (p for p in (run_dir / "graph.rank0.json", run_dir / "graph.json") if p.exists()), None
    )
    probe_paths = sorted(run_dir.glob("probe.rank*.json")) or [run_dir / "probe.json"]
    if graph_path is None or not probe_paths[0].exists():
        raise BisectPrefetchError(
            f"{run_dir}: no recorded graph and probe (did the adapter run in the job?)"
        )
    return audit(_read_json(graph_path), [_read_json(p) for p in probe_paths])
