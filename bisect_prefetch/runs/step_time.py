"""What a mask costs: each run's median step time, and each mask's against all-on.

One rule for every run: a step's time is the slowest rank's (seconds between
two ``report_step`` calls, from ``step_seconds`` in probe.rank{R}.json); the
first WARMUP_STEPS steps are warm-up and left out; a run's step time is the
median of the rest. A run without enough steps (or without the adapter) has
none.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from bisect_prefetch.audit import read_probe

WARMUP_STEPS = 2  # the first step builds and initializes; the second still warms caches


def run_step_time_ms(run_dir: Path) -> float | None:
    """The run's median step time in ms after warm-up (see the module docstring), or None."""
    per_step: dict[int, float] = {}
    for path in Path(run_dir).glob("probe.rank*.json"):
        probe, _ = read_probe(path)
        if probe is None:
            continue  # unreadable: the run is an error, said by runs/merge.py
        for step, seconds in probe.get("step_seconds") or []:
            per_step[int(step)] = max(per_step.get(int(step), 0.0), float(seconds))
    kept = [s for step, s in per_step.items() if step > WARMUP_STEPS]
    if not kept:
        return None
    return round(statistics.median(kept) * 1000.0, 3)


def group_cost(times_ms: Iterable[float | None], baseline_ms: float | None) -> dict[str, Any] | None:
    """A group's step time: median and range over its runs, and its ratio to the baseline's median.

    None when no run of the group has a step time.
    """
    times = sorted(t for t in times_ms if t is not None)
    if not times:
        return None
    median = statistics.median(times)
    cost: dict[str, Any] = {"median_ms": round(median, 3), "min_ms": times[0], "max_ms": times[-1],
                            "runs": len(times), "ratio": None, "ratio_min": None,
                            "ratio_max": None}
    if baseline_ms:
        cost["ratio"] = round(median / baseline_ms, 4)
        cost["ratio_min"] = round(times[0] / baseline_ms, 4)
        cost["ratio_max"] = round(times[-1] / baseline_ms, 4)
    return cost


def mask_costs(times_by_mask: Mapping[str, Iterable[float | None]],
               baseline: str = "all-on") -> dict[str, dict[str, Any]]:
    """Per mask label: group_cost against the baseline label's median (all-on)."""
    base = group_cost(times_by_mask.get(baseline, []), None)
    base_ms = base["median_ms"] if base else None
    out = {}
    for label, times in times_by_mask.items():
        cost = group_cost(times, base_ms)
        if cost is not None:
            out[label] = cost
    return out


def describe_cost(cost: Mapping[str, Any] | None) -> str:
    """`+1.2% step time (12.3 ms, runs 0.98-1.03x)`, or `step time unknown`."""
    if not cost:
        return "step time unknown"
    if cost.get("ratio") is None:
        return f"{cost['median_ms']:.1f} ms a step (no all-on runs to compare with)"
    percent = (cost["ratio"] - 1.0) * 100.0
    return (f"{percent:+.1f}% step time ({cost['median_ms']:.1f} ms; over {cost['runs']} run(s) "
            f"{cost['ratio_min']:.2f}-{cost['ratio_max']:.2f}x)")


def fix_costs(records: Iterable[Mapping[str, Any]], *, edge_ids: Iterable[str],
              fix: Iterable[str], variant_suffix: str = "") -> dict[str, Any]:
    """What the smallest fix costs, from journaled runs the search already has.

    ``all_on``: runs with every edge on (or no mask) and no guard; ``drop``:
    runs of drop-only(fix), every edge on but the fix's, against all-on;
    ``guard``: all-on runs under the size-one guard, against all-on. Each is
    a group_cost or None when no such run timed its steps.
    """
    every, dropped = frozenset(edge_ids), frozenset(fix)
    groups: dict[str, list[float | None]] = {"all_on": [], "drop": [], "guard": []}
    for record in records:
        if not str(record.get("variant", "")).endswith(variant_suffix):
            continue
        mask = record.get("mask")
        mask = every if mask is None else frozenset(mask)
        guard = record.get("guard", "none")
        if mask == every:
            groups["all_on" if guard == "none" else "guard"].append(record.get("step_time_ms"))
        elif dropped and mask == every - dropped and guard == "none":
            groups["drop"].append(record.get("step_time_ms"))
    base = group_cost(groups["all_on"], None)
    base_ms = base["median_ms"] if base else None
    return {"all_on": base, "drop": group_cost(groups["drop"], base_ms),
            "guard": group_cost(groups["guard"], base_ms)}


def fix_cost_line(costs: Mapping[str, Any], fix: Iterable[str]) -> str | None:
    """`dropping bwd:X->Y costs +1.2% step time (...); the size-one guard costs +0.1% ...`."""
    parts = []
    fix = sorted(fix)
    if fix and costs.get("drop") and costs["drop"].get("ratio") is not None:
        parts.append(f"dropping {', '.join(fix)} costs {describe_cost(costs['drop'])}")
    if costs.get("guard") and costs["guard"].get("ratio") is not None:
        parts.append(f"the size-one guard costs {describe_cost(costs['guard'])}")
    return "; ".join(parts) if parts else None
