"""The prefetch audit: size-one edges, and every other kind of suspect edge one run shows.

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
tool's guard) without an async unshard, except ``not-needed`` (with ``guard_note``)
where every such prefetch went into a unit whose engine makes it a no-op by
construction (hyper-parallel's older hsdp lineage prefetches only sharded
parameters), else ``absent`` with ``guard_observed: false`` (no size-one edge
fired: nothing to judge by).
``pitfall_units`` names sharded units whose parameters lack ``shard_size``:
there a guard reading it would switch real prefetch off.

Findings (``findings: [{kind, edge, evidence, steps, ranks, count, ...}]``),
from the graph, the probe and the order record (adapters/order.py), walked
step by step per rank:

- ``size-one``: the size-one rule above (an edge found size-one gets no
  order finding: its copy explains what the order shows);
- ``never-consumed``: the edge unsharded its target, which was resharded,
  unsharded again, used only in the other phase, or still held at the step's
  end, without a use in the edge's phase (``evidence`` says which);
- ``late``: the edge fired into a target that had unsharded itself for the edge's
  phase; a target still unsharded from its use in the other phase (no reshard after
  forward: hyper-parallel's and FSDP2's ``reshard_after_forward`` off) makes the edge a
  ``no-op`` instead, since nothing was wasted;
- ``shadowed`` (``shadowed_by``: the edge that unsharded the target first)
  and ``no-op``: fired, issued nothing;
- ``duplicate-target`` (``others``): another edge of the same phase has the
  same target (from the graph).

The first three waste work or can race: they make ``ok`` false
(FAILING_KINDS); the others are notes. A run without an order record
(``order_recorded: false``) is judged on size-one and duplicate-target only.

Pure functions over the JSON the recorder writes; ``audit_run_dir`` reads it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.vocab import (
    GRAPH_FILE,
    NOOP,
    PROBE_FILE,
    PROBE_OUTCOMES,
    graph_rank_file,
    order_rank_file,
    parse_edge_id,
    probe_rank_file,
)

OUTCOMES = PROBE_OUTCOMES
# Kinds that waste work or can race make the audit fail; the others are notes.
FAILING_KINDS = ("size-one", "never-consumed", "late")
NOTE_KINDS = ("no-op", "shadowed", "duplicate-target", "never-fired")
KINDS = FAILING_KINDS + NOTE_KINDS
ORDER_KINDS = ("never-consumed", "late", "no-op", "shadowed")  # need the order record


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


def _target(edge: dict[str, Any]) -> str:
    return parse_edge_id(edge["id"])[2]


def _noop_by_construction(probes: Sequence[dict[str, Any]]) -> set[str]:
    """Units whose engine makes a size-one prefetch a no-op by construction (hyper-parallel's
    older hsdp lineage: only sharded parameters are prefetched)."""
    return {name for probe in probes
            for name, unit in probe.get("hyper_parallel", {}).get("units", {}).items()
            if unit.get("lineage") == "hsdp"}


def _units_without_params(probes: Sequence[dict[str, Any]]) -> list[str]:
    """Every unit, where the adapter found no parameter tensor in any of a rank's units (a
    unit of its own may hold none; all of them, never): their parameter counts and shard
    sizes then say nothing about the build."""
    names = set()
    for probe in probes:
        units = probe.get("hyper_parallel", {}).get("units", {})
        if units and not any(unit.get("params", 0) for unit in units.values()):
            names.update(units)
    return sorted(names)


def audit(graph: dict[str, Any], probes: Sequence[dict[str, Any]],
          order: Sequence[dict[str, Any]] | None = None,
          kinds: Sequence[str] = KINDS) -> dict[str, Any]:
    """The audit JSON (docs/contract.md) for a discovered graph, its ranks' probes and order record.

    ``kinds``: which kinds of finding to report; ``ok`` is false when any of
    them is a failing kind (FAILING_KINDS) or real prefetch was lost.
    """
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
                "fired": sum(c[outcome] for outcome in OUTCOMES),
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
    by_construction = _noop_by_construction(probes)
    attempted = [e for e in size_one if e["attempts"] > 0]
    if lost:
        guard = "disables-real-prefetch"
    elif still_unshards or not observed:
        guard = "absent"
    elif attempted and all(_target(e) in by_construction for e in attempted):
        # The engine's prefetch into a size-one unit does nothing whatever the build:
        # there is no guard to be present (the older hsdp lineage).
        guard = "not-needed"
    else:
        guard = "present"
    result = {
        "edges": edges,
        "guard": guard,
        "guard_observed": observed or bool(lost),
        "size_one_edges": [e["id"] for e in size_one],
        "size_one_edges_unsharding": still_unshards,
        "real_prefetch_lost": lost,
        "pitfall_units": _pitfall_units(probes),
        "units_without_params": _units_without_params(probes),
    }
    if guard == "not-needed":
        result["guard_note"] = ("hyper-parallel's older hsdp lineage: a prefetch into a unit "
                                "of shard size 1 is a no-op by construction (only sharded "
                                "parameters are prefetched); no guard is involved")
    chosen = [f for f in findings(graph, probes, order, result) if f["kind"] in kinds]
    result["findings"] = chosen
    result["kinds"] = list(kinds)
    result["order_recorded"] = order is not None
    # What could not be judged, and why: never reported as fine.
    result["not_checked"] = [
        {"kind": kind, "reason": "the run recorded no unit order (an older run, recording "
                                 "off, or no step boundary found in the job)"}
        for kind in kinds if kind in ORDER_KINDS and order is None
    ]
    result["checked"] = [k for k in kinds if k not in {n["kind"] for n in result["not_checked"]}]
    result["ok"] = not lost and not any(f["kind"] in FAILING_KINDS for f in chosen)
    return result


# -- the kinds of suspect edge --------------------------------------------------------


class _Findings:
    """Findings keyed by (kind, edge): the steps and ranks seen, a count, the first evidence."""

    def __init__(self) -> None:
        self.found: dict[tuple[str, str], dict[str, Any]] = {}

    def add(self, kind: str, edge: str, evidence: str, *, step: int | None = None,
            rank: int | None = None, **detail: Any) -> None:
        entry = self.found.setdefault((kind, edge), {
            "kind": kind, "edge": edge, "evidence": evidence, "count": 0,
            "steps": set(), "ranks": set(), **detail})
        entry["count"] += 1
        if step is not None:
            entry["steps"].add(step)
        if rank is not None:
            entry["ranks"].add(rank)

    def to_json(self, edge_order: dict[str, int]) -> list[dict[str, Any]]:
        out = []
        for entry in self.found.values():
            out.append({**entry, "steps": sorted(entry["steps"]), "ranks": sorted(entry["ranks"])})
        out.sort(key=lambda f: (KINDS.index(f["kind"]), edge_order.get(f["edge"], len(edge_order)),
                                f["edge"]))
        return out


def _edge_target(edge: str) -> tuple[str, str]:
    """(phase, dst) of an edge id."""
    phase, _, dst = parse_edge_id(edge)
    return phase, dst


_EVENT_LENGTH = {"prefetch": 3, "unshard": 3, "use": 3, "reshard": 2}


def _order_findings(order: Sequence[dict[str, Any]], findings: _Findings) -> None:
    """Walk each recorded step of each rank (adapters/order.py) and note what its edges did.

    Per unit, who holds it unsharded right now: None (sharded), ``self`` or the
    edge whose prefetch unsharded it, and whether that prefetch was used in
    its phase yet. Every step starts from nothing held.
    """
    for record in order:
        _walk_step(record, findings)


def _walk_step(record: dict[str, Any], findings: _Findings) -> None:
    """One recorded step of one rank (see _order_findings)."""
    step, rank = record.get("step"), record.get("rank")
    held: dict[str, dict[str, Any]] = {}  # unit -> {"by", "phase", "used"}

    def unused(unit: str, why: str) -> None:
        hold = held.get(unit)
        if hold and hold["by"] != "self" and not hold["used"]:
            findings.add("never-consumed", hold["by"],
                         f"{hold['by']} unsharded {unit}, which {why} without a "
                         f"{hold['phase']} use", step=step, rank=rank)

    for event in record.get("events", []):
        if not isinstance(event, list) or len(event) < 2 or len(event) < _EVENT_LENGTH.get(
                event[0], 2):
            continue  # a line from another version: skip what cannot be read
        what = event[0]
        if what == "prefetch":
            edge, outcome = event[1], event[2]
            target = _edge_target(edge)[1]
            if outcome != NOOP:
                continue
            hold = held.get(target)
            if hold is None:
                findings.add("no-op", edge, f"{edge} fired and issued nothing",
                             step=step, rank=rank)
            elif hold.get("last_use") not in (None, _edge_target(edge)[0]):
                # Still unsharded from its use in the other phase (no reshard after
                # forward): the prefetch had nothing to do, and nothing was wasted.
                findings.add("no-op", edge, f"{target} was still unsharded from its "
                             f"{hold['last_use']} use when {edge} fired (no reshard between)",
                             step=step, rank=rank)
            elif hold["by"] == "self":
                findings.add("late", edge, f"{target} had unsharded itself before {edge} "
                             "fired", step=step, rank=rank)
            elif hold["by"] != edge:
                findings.add("shadowed", edge, f"{hold['by']} had unsharded {target} before "
                             f"{edge} fired", step=step, rank=rank, shadowed_by=hold["by"])
            else:
                findings.add("no-op", edge, f"{edge} fired and issued nothing",
                             step=step, rank=rank)
        elif what == "unshard":
            unit, by = event[1], event[2]
            unused(unit, "unsharded again")
            phase = _edge_target(by)[0] if by != "self" else None
            held[unit] = {"by": by, "phase": phase, "used": False}
        elif what == "use":
            unit, phase = event[1], event[2]
            hold = held.get(unit)
            if hold is None:
                held[unit] = {"by": "self", "phase": phase, "used": True, "last_use": phase}
                continue
            if not hold["used"]:
                if hold["by"] != "self" and hold["phase"] != phase:
                    unused(unit, f"was used in {phase} instead, so it stayed unsharded")
                hold["used"] = True
            hold["last_use"] = phase
        elif what == "reshard":
            unit = event[1]
            unused(unit, "was resharded")
            held.pop(unit, None)
    for unit in list(held):
        unused(unit, "stayed unsharded to the step's end")


def _duplicate_targets(graph: dict[str, Any], findings: _Findings) -> None:
    by_target: dict[tuple[str, str], list[str]] = {}
    for edge in graph.get("edges", []):
        by_target.setdefault((edge["phase"], edge["dst"]), []).append(edge["id"])
    for (phase, dst), edges in by_target.items():
        if len(edges) < 2:
            continue
        for edge in edges:
            others = ", ".join(e for e in edges if e != edge)
            findings.add("duplicate-target", edge,
                         f"{dst} is also a {phase} target of {others}", others=[
                             e for e in edges if e != edge])


def _size_one(result: dict[str, Any], probes: Sequence[dict[str, Any]],
              findings: _Findings) -> None:
    by_id = {e["id"]: e for e in result["edges"]}
    for edge in result["size_one_edges_unsharding"]:
        e = by_id[edge]
        target = _edge_target(edge)[1]
        evidence = (f"target {target} has shard size 1: "
                    + _size_one_copies(_engine_of(target, probes), e["async_unshards"]))
        steps, ranks = set(), set()
        for probe in probes:
            for entry in probe.get("steps", []):
                if edge in entry.get("issued", []):
                    steps.add(entry["step"])
                    ranks.add(probe.get("rank", 0))
        findings.add("size-one", edge, evidence)
        entry = findings.found[("size-one", edge)]
        entry["steps"] |= steps
        entry["ranks"] |= ranks


# torch's FSDP2 whose size-one unshard was read (_fsdp_param_group.py, world_size == 1).
FSDP2_SIZE_ONE_CHECKED = "2.13"


def _engine_of(unit: str, probes: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """{"name", "version"} of the engine that shards this unit, as the probes say (a job
    may import FSDP2 and shard with hyper-parallel); {} when they do not."""
    for probe in probes:
        hyper = probe.get("hyper_parallel")
        if isinstance(hyper, dict) and unit in (hyper.get("units") or {}):
            return {"name": "hyper-parallel", "version": hyper.get("version", "hyper-parallel")}
    for probe in probes:
        if isinstance(probe.get("fsdp2"), dict):
            return {"name": "fsdp2", "version": probe["fsdp2"].get("torch", "")}
    return {}


def _size_one_copies(engine: dict[str, Any], count: int) -> str:
    """What the size-one prefetches did, as the engine (and its version) does it."""
    name, version = engine.get("name"), str(engine.get("version") or "")
    if name == "hyper-parallel":
        return (f"{count} prefetches each copied the local shard at once (no collective; "
                f"{version}), and the unit's own unshard copies it again")
    if name == "fsdp2":
        checked = version.startswith(FSDP2_SIZE_ONE_CHECKED)
        return (f"{count} prefetches issued an unshard that copies nothing when issued (torch "
                f"{version} FSDP2 records a placeholder and copies at wait_for_unshard, on the "
                "unit's own use" + ("" if checked else
                                    f"; read on torch {FSDP2_SIZE_ONE_CHECKED}, not this version")
                + "): a prefetch with nothing to overlap")
    return f"{count} async unshards copied locally"


def _never_fired(result: dict[str, Any], probes: Sequence[dict[str, Any]],
                 findings: _Findings) -> None:
    """Edges in the graph (set by the job, or listed by a static policy) that no rank's
    prefetch ever went through: they do nothing in this build, or the graph is wrong."""
    if not any(probe.get("steps") for probe in probes):
        return  # a run that saw no step cannot tell
    for edge in result["edges"]:
        if edge["fired"] == 0:
            findings.add("never-fired", edge["id"], "set, but no prefetch went through it on "
                         "any rank")


def findings(graph: dict[str, Any], probes: Sequence[dict[str, Any]],
             order: Sequence[dict[str, Any]] | None, result: dict[str, Any]) -> list[dict]:
    """Every kind of suspect edge (KINDS) with its evidence, steps and ranks.

    ``order`` None: no order was recorded, so only size-one and
    duplicate-target can be judged. An edge found size-one is reported as
    that alone (besides duplicate-target): a prefetch into a size-one unit is
    a local copy, and what the order shows of it follows from that.
    """
    found = _Findings()
    _size_one(result, probes, found)
    _duplicate_targets(graph, found)
    _never_fired(result, probes, found)
    if order is not None:
        from_order = _Findings()
        _order_findings(order, from_order)
        size_one = set(result["size_one_edges"])
        for key, entry in from_order.found.items():
            if key[1] not in size_one:
                found.found[key] = entry
    edge_order = {e["id"]: i for i, e in enumerate(graph.get("edges", []))}
    return found.to_json(edge_order)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise BisectPrefetchError(f"cannot read {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise BisectPrefetchError(f"{path}: not JSON ({exc.msg}, line {exc.lineno})") from None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _counts_problem(edges: Any, where: str) -> str | None:
    if not isinstance(edges, dict):
        return f"{where} is not a mapping"
    for edge, counts in edges.items():
        if not isinstance(counts, dict) or not all(_is_int(v) for v in counts.values()):
            return f"{where}[{edge!r}] is not a mapping of counts"
    return None


def probe_problem(probe: Any) -> str | None:
    """What makes a probe record (probe.rank{R}.json) unreadable, or None when every field
    the tool reads has the shape the adapter writes (a job may write anything there)."""
    if not isinstance(probe, dict):
        return "not a JSON object"
    if "rank" in probe and not _is_int(probe["rank"]):
        return "rank is not an integer"
    if "edges" in probe and (problem := _counts_problem(probe["edges"], "edges")):
        return problem
    hyper = probe.get("hyper_parallel", {})
    if not isinstance(hyper, dict):
        return "hyper_parallel is not a mapping"
    if "edges" in hyper and (problem := _counts_problem(hyper["edges"], "hyper_parallel.edges")):
        return problem
    units = hyper.get("units", {})
    if not isinstance(units, dict) or not all(
            isinstance(u, dict) and all(_is_number(u.get(k, 0)) for k in
                                        ("shard_size", "params", "params_with_shard_size"))
            for u in units.values()):
        return "hyper_parallel.units is not a mapping of units"
    steps = probe.get("steps", [])
    if not isinstance(steps, list) or not all(
            isinstance(e, dict) and _is_int(e.get("step")) and isinstance(e.get("issued", []), list)
            for e in steps):
        return "steps is not a list of {step, issued}"
    seconds = probe.get("step_seconds") or []
    if not isinstance(seconds, list) or not all(
            isinstance(pair, list) and len(pair) == 2 and _is_int(pair[0]) and _is_number(pair[1])
            for pair in seconds):
        return "step_seconds is not a list of [step, seconds]"
    digests = probe.get("digests")
    if digests is not None and not (isinstance(digests, dict) and all(
            _is_int(digests.get(k, 0)) for k in ("parameters", "gradients", "steps"))):
        return "digests is not a summary of counts"
    if not isinstance(probe.get("step_notes") or [], list):
        return "step_notes is not a list"
    return None


def read_probe(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """A probe file's record, or None and why it cannot be read (never an exception)."""
    try:
        probe = json.loads(path.read_bytes())
    except OSError as exc:
        return None, f"cannot read it ({exc.strerror or exc})"
    except (ValueError, RecursionError):
        return None, "not JSON"
    problem = probe_problem(probe)
    return (None, problem) if problem else (probe, None)


def read_order(run_dir: Path) -> list[dict[str, Any]] | None:
    """Every rank's recorded steps (order.rank*.jsonl); None when the run recorded none."""
    paths = sorted(run_dir.glob(order_rank_file("*")))
    if not paths:
        return None
    records = []
    for path in paths:
        try:
            lines = path.read_text().splitlines()
        except OSError as exc:
            raise BisectPrefetchError(f"cannot read {path}: {exc.strerror}") from None
        for number, line in enumerate(lines, 1):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                if number < len(lines):  # only a last line cut short by a killed job is skipped
                    raise BisectPrefetchError(f"{path}:{number}: not JSON") from None
    return records


def audit_run_dir(run_dir: str | Path, *, kinds: Sequence[str] = KINDS) -> dict[str, Any]:
    """Audit a finished run: its graph (rank 0's, or graph.json), every rank's probe and order."""
    run_dir = Path(run_dir)
    graph_path = next(
        (p for p in (run_dir / graph_rank_file(0), run_dir / GRAPH_FILE) if p.exists()), None
    )
    probe_paths = sorted(run_dir.glob(probe_rank_file("*"))) or [run_dir / PROBE_FILE]
    if graph_path is None or not probe_paths[0].exists():
        raise BisectPrefetchError(
            f"{run_dir}: no recorded graph and probe (did the adapter run in the job?)"
        )
    probes = []
    for path in probe_paths:
        probe, problem = read_probe(path)
        if probe is None:
            raise BisectPrefetchError(f"{path}: unreadable probe record: {problem}")
        probes.append(probe)
    return audit(_read_json(graph_path), probes, read_order(run_dir), kinds)
