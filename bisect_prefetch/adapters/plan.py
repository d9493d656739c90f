"""The plan file: what the orchestrator asks of one run, read inside the job.

The launcher writes ``<run_dir>/plan.json`` and passes its path in the
environment variable ``BISECT_PREFETCH_PLAN``. Version 1::

    {"version": 1, "experiment": str, "run_id": str,
     "out_dir": str,                 # absolute run dir: where the recorder writes
     "mask": [edge ids] | null,      # enabled edges; null = change nothing, only record
     "schedule": null | [{"first_step": int, "mask": [edge ids]}, ...],  # masks by step
     "guard": "none" | "size-one",   # size-one: skip prefetches into shard-size-1 units
     "record": {"graph": bool, "probe": bool,
                "digests": null | glob over parameter names, "digest_every": int,
                "order_steps": int,    # steps whose unit order is recorded (0: none; default 3)
                "trace": null | {"first_step": int, "last_step": int,  # adapters/op_trace.py
                                 "units": [unit names]}},  # optional: only their ops
     "fault": null | {"edge": str, "hazard": float, "mode": "nudge"},  # reference workloads only
     "stress": null | {"measure_steps": int, "default_gap_ms": float},  # adapters/stress.py
     "seed": int, "steps": int}

``schedule`` (optional; absent or null: ``mask`` holds for the whole run): the run
switches masks at step boundaries, segment by segment. Segment k holds from its
``first_step`` (a 1-based training step as the job's step clock counts it,
adapters/steps.py) until the step before the next segment's. The first segment starts
at step 1, first steps increase strictly, and ``mask`` must equal the first segment's
mask, so a reader of ``mask`` sees step 1's. A mask changes only which prefetches
are issued early, not what is computed, so one run can try several masks in turn.
Every rank follows the same schedule by step number; what a rank actually followed is
the probe's ``schedule_followed`` (adapters/__init__.py).

API: ``load_plan(path=None) -> Plan | None`` (None when no plan is set),
``parse_plan(dict) -> Plan`` (raises ``PlanError``), ``plan_hash(dict) -> str``
(sha256 hex of the canonical JSON; the orchestrator may use it too),
and ``Plan.segment_for_step(step)`` (the gate, adapters/gate.py, takes each step's mask
by it). Standard library only.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any

from bisect_prefetch.vocab import GUARD_NONE, GUARDS, Mask

PLAN_ENV = "BISECT_PREFETCH_PLAN"
PLAN_VERSION = 1
DEFAULT_ORDER_STEPS = 3  # the first few steps show every edge's order; more costs memory


class PlanError(ValueError):
    """The plan file is missing, unreadable or malformed."""


def plan_hash(plan: dict[str, Any]) -> str:
    """sha256 of the plan's canonical JSON (sorted keys, no spaces)."""
    canonical = json.dumps(plan, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Plan:
    """A validated plan. ``raw`` is the dict as read; other fields are derived from it."""

    raw: dict[str, Any]
    hash: str
    out_dir: str | None
    mask: Mask | None  # read once here; the gate uses it as is (with a schedule: step 1's)
    guard: str
    record_graph: bool
    record_probe: bool
    digest_glob: str | None
    digest_every: int
    fault: dict[str, Any] | None
    order_steps: int = DEFAULT_ORDER_STEPS
    stress: dict[str, Any] | None = None  # Stress's keyword arguments; None: no delays
    # ((first_step, mask), ...), first steps from 1, strictly increasing; None: ``mask`` throughout
    schedule: tuple[tuple[int, Mask], ...] | None = None
    # (first step, last step) whose every op is traced (adapters/op_trace.py); None: none
    trace: tuple[int, int] | None = None
    # Only these units' ops are traced (targeted tracing); None: every unit's
    trace_units: tuple[str, ...] | None = None

    def segment_for_step(self, step: int) -> int | None:
        """The index of the schedule's segment that holds at this 1-based step (steps
        below 1: the first); None without a schedule."""
        if self.schedule is None:
            return None
        firsts = [first for first, _ in self.schedule]
        return max(bisect.bisect_right(firsts, step) - 1, 0)


def parse_plan(data: Any) -> Plan:
    """Validate a plan dict and return a Plan; PlanError names what is wrong."""
    if not isinstance(data, dict):
        raise PlanError(f"plan must be a JSON object, got {type(data).__name__}")
    if data.get("version") != PLAN_VERSION:
        raise PlanError(f"plan version must be {PLAN_VERSION}, got {data.get('version')!r}")
    out_dir = data.get("out_dir")
    if out_dir is not None and not isinstance(out_dir, str):
        raise PlanError("plan out_dir must be a string")
    mask = data.get("mask")
    if mask is not None:
        if not isinstance(mask, list) or not all(isinstance(e, str) for e in mask):
            raise PlanError("plan mask must be a list of edge ids or null")
        mask = Mask(mask)
    guard = data.get("guard", GUARD_NONE)
    if guard not in GUARDS:
        raise PlanError(f"plan guard must be one of {GUARDS}, got {guard!r}")
    record = data.get("record") or {}
    if not isinstance(record, dict):
        raise PlanError("plan record must be an object")
    digest_glob = record.get("digests")
    if digest_glob is not None and not isinstance(digest_glob, str):
        raise PlanError("plan record.digests must be a glob string or null")
    digest_every = record.get("digest_every", 1)
    if not isinstance(digest_every, int) or digest_every < 1:
        raise PlanError("plan record.digest_every must be an integer >= 1")
    order_steps = record.get("order_steps", DEFAULT_ORDER_STEPS)
    if not isinstance(order_steps, int) or order_steps < 0:
        raise PlanError("plan record.order_steps must be an integer >= 0")
    trace, trace_units = _parse_trace(record.get("trace"))
    fault = data.get("fault")
    if fault is not None and not (isinstance(fault, dict) and isinstance(fault.get("edge"), str)):
        raise PlanError("plan fault must be null or an object with an 'edge'")
    stress = data.get("stress")
    if stress is not None:
        if not isinstance(stress, dict) or set(stress) - {"measure_steps", "default_gap_ms"}:
            raise PlanError("plan stress must be null or an object with measure_steps, "
                            "default_gap_ms")
        steps = stress.get("measure_steps", 2)
        gap = stress.get("default_gap_ms", 10.0)
        if not isinstance(steps, int) or steps < 1:
            raise PlanError("plan stress.measure_steps must be an integer >= 1")
        if not isinstance(gap, (int, float)) or not gap > 0:
            raise PlanError("plan stress.default_gap_ms must be a number > 0")
        stress = {"measure_steps": steps, "default_gap_ms": float(gap)}
    schedule = _parse_schedule(data.get("schedule"))
    if schedule is not None and mask != schedule[0][1]:
        raise PlanError("plan mask must equal schedule[0].mask when a schedule is set "
                        "(a reader of mask sees step 1)")
    return Plan(
        raw=data,
        hash=plan_hash(data),
        out_dir=out_dir,
        mask=mask,
        guard=guard,
        record_graph=bool(record.get("graph", True)),
        record_probe=bool(record.get("probe", True)),
        digest_glob=digest_glob,
        digest_every=digest_every,
        fault=fault,
        order_steps=order_steps,
        stress=stress,
        schedule=schedule,
        trace=trace,
        trace_units=trace_units,
    )


def _parse_trace(trace: Any) -> tuple[tuple[int, int] | None, tuple[str, ...] | None]:
    """The plan's ``record.trace`` as ((first step, last step), units or None); PlanError
    names what is wrong."""
    if trace is None:
        return None, None
    if (not isinstance(trace, dict) or not {"first_step", "last_step"} <= set(trace)
            or set(trace) - {"first_step", "last_step", "units"}):
        raise PlanError("plan record.trace must be null or an object with first_step and "
                        "last_step (and units)")
    first, last = trace["first_step"], trace["last_step"]
    if any(isinstance(v, bool) or not isinstance(v, int) for v in (first, last)) or not (
            1 <= first <= last):
        raise PlanError(f"plan record.trace must have 1 <= first_step <= last_step, got "
                        f"{first!r}, {last!r}")
    units = trace.get("units")
    if units is not None and (not isinstance(units, list) or not units
                              or not all(isinstance(u, str) and u for u in units)):
        raise PlanError("plan record.trace.units must be a non-empty list of unit names")
    return (first, last), None if units is None else tuple(units)


def _parse_schedule(schedule: Any) -> tuple[tuple[int, Mask], ...] | None:
    """The plan's ``schedule`` as ((first_step, mask), ...); PlanError names what is wrong."""
    if schedule is None:
        return None
    if not isinstance(schedule, list) or not schedule:
        raise PlanError("plan schedule must be null or a non-empty list of "
                        "{first_step, mask} segments")
    segments: list[tuple[int, Mask]] = []
    for k, segment in enumerate(schedule):
        if not isinstance(segment, dict) or set(segment) != {"first_step", "mask"}:
            raise PlanError(f"plan schedule[{k}] must be an object with first_step and mask, "
                            "nothing else")
        first = segment["first_step"]
        if isinstance(first, bool) or not isinstance(first, int) or first < 1:
            raise PlanError(f"plan schedule[{k}].first_step must be an integer >= 1, "
                            f"got {first!r}")
        if k == 0 and first != 1:
            raise PlanError(f"plan schedule[0].first_step must be 1 (the first segment holds "
                            f"from step 1), got {first}")
        if segments and first <= segments[-1][0]:
            raise PlanError(f"plan schedule[{k}].first_step must be greater than "
                            f"schedule[{k - 1}].first_step ({segments[-1][0]}), got {first}")
        mask = segment["mask"]
        if not isinstance(mask, list) or not all(isinstance(e, str) for e in mask):
            raise PlanError(f"plan schedule[{k}].mask must be a list of edge ids")
        segments.append((first, Mask(mask)))
    return tuple(segments)


def load_plan(path: str | None = None) -> Plan | None:
    """Read the plan at ``path`` (default: $BISECT_PREFETCH_PLAN); None if neither is set."""
    path = path or os.environ.get(PLAN_ENV)
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise PlanError(f"cannot read plan {path}: {e}") from e
    return parse_plan(data)
