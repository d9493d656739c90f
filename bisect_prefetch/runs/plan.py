"""The plan file one run's in-process adapter reads (path in BISECT_PREFETCH_PLAN).

Format version 1 is documented in bisect_prefetch/adapters/plan.py, which
parses it inside the job. Every rank records the plan's hash; the engine
checks them all against the hash of the plan it wrote.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bisect_prefetch.adapters.plan import PLAN_ENV, PLAN_VERSION, PlanError, parse_plan, plan_hash
from bisect_prefetch.adapters.stress import DEFAULT_GAP_MS as STRESS_DEFAULT_GAP_MS
from bisect_prefetch.adapters.stress import DEFAULT_MEASURE_STEPS as STRESS_MEASURE_STEPS
from bisect_prefetch.experiment import Experiment
from bisect_prefetch.files import write_text_atomic
from bisect_prefetch.vocab import PLAN_FILE, Mask

__all__ = ["PLAN_ENV", "PLAN_FILE", "build_plan", "plan_hash", "write_plan"]


def build_plan(
    *,
    experiment: Experiment,
    run_id: str,
    out_dir: Path,
    mask: Mask | None,
    guard: str,
    steps: int,
    stress: bool = False,
    schedule: list[tuple[int, Mask]] | None = None,
) -> dict[str, Any]:
    """The plan of one run. mask None: change nothing, only record.

    stress: delays before each prefetch is issued (adapters/stress.py, docs/stress.md).

    schedule: ``[(first_step, mask), ...]``, masks by training step (1-based; the first
    segment starts at step 1, first steps increase): the job switches masks at step
    boundaries (adapters/plan.py). The plan's ``mask`` is then the first segment's; a
    ``mask`` given as well must be that one (or None). A schedule the job would refuse
    raises PlanError here, before any job starts.

    What it records comes from the experiment's ``record`` (digests on by default).
    """
    if schedule is not None:
        if not schedule:
            raise PlanError("a schedule needs at least one segment")
        if mask is not None and Mask(mask) != Mask(schedule[0][1]):
            raise PlanError("the plan's mask must be the schedule's first segment's mask")
        mask = schedule[0][1]
    record = experiment.record
    fault = None
    if experiment.workload is not None and experiment.workload.fault is not None:
        fault = experiment.workload.fault.model_dump(mode="json")
    plan = {
        "version": PLAN_VERSION,
        "experiment": experiment.name,
        "run_id": run_id,
        "out_dir": str(Path(out_dir).resolve()),
        "mask": None if mask is None else sorted(mask),  # the JSON edge of a Mask
        "guard": guard,
        "record": {"graph": True, "probe": True,
                   "digests": record.params if record.digests else None,
                   "digest_every": record.every, "order_steps": record.order_steps},
        "fault": fault,
        "stress": {"measure_steps": STRESS_MEASURE_STEPS, "default_gap_ms": STRESS_DEFAULT_GAP_MS}
        if stress else None,
        "seed": experiment.seed,
        "steps": steps,
    }
    if (window := record.trace_window()) is not None:  # adapters/op_trace.py
        plan["record"]["trace"] = {"first_step": window[0], "last_step": min(window[1], steps)}
        if record.trace_units:  # targeted: only these units' ops
            plan["record"]["trace"]["units"] = list(record.trace_units)
    if schedule is not None:
        plan["schedule"] = [{"first_step": first, "mask": sorted(segment_mask)}
                            for first, segment_mask in schedule]
        parse_plan(plan)  # the job's own check, here: a bad schedule never reaches a job
    return plan


def write_plan(run_dir: Path, plan: dict[str, Any]) -> Path:
    """Write plan.json atomically into the run dir; returns its path."""
    path = Path(run_dir) / PLAN_FILE
    write_text_atomic(path, json.dumps(plan, indent=1, sort_keys=True) + "\n")
    return path
