"""What a mask costs: each run's median step time, and each mask's against all-on.

One rule for every run: a step's time is the slowest rank's (seconds between
two ``report_step`` calls, from ``step_seconds`` in probe.rank{R}.json); the
first WARMUP_STEPS steps are warm-up and left out; a run's step time is the
median of the rest. A run without enough steps (or without the adapter) has
none.

A cost (one group of runs against another, e.g. drop-only against all-on) compares runs
over the same steps: the steps after warm-up that every run of both groups timed (a
diverged run stops early, and a run's first steps are its slowest). A window shorter than
MIN_WINDOW steps gives no figure, and a difference within the runs' own spread (one
group's runs against each other, which also shows a machine that was busier for some
runs than for others) is said as no measurable difference, not as a cost.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from bisect_prefetch.judge.audit import read_probe
from bisect_prefetch.vocab import USABLE_OUTCOMES, probe_rank_file

WARMUP_STEPS = 2  # the first step builds and initializes; the second still warms caches
MIN_WINDOW = 3  # steps every compared run must have timed for a cost figure
# Groups whose runs saw 1-minute load averages this far apart (and by a quarter) ran on
# machines too differently busy for their step times to say what a mask costs.
LOAD_APART = 1.0


def run_step_time_ms(run_dir: Path) -> float | None:
    """The run's median step time in ms after warm-up (see the module docstring), or None."""
    kept = [ms for _, ms in run_step_times_ms(run_dir)]
    if not kept:
        return None
    return round(statistics.median(kept), 3)


def run_step_times_ms(run_dir: Path) -> list[list[float]]:
    """[step, ms] for every step after warm-up: the slowest rank's time of that step."""
    per_step: dict[int, float] = {}
    for path in Path(run_dir).glob(probe_rank_file("*")):
        probe, _ = read_probe(path)
        if probe is None:
            continue  # unreadable: the run is an error, said by judge/merge.py
        for step, seconds in probe.get("step_seconds") or []:
            per_step[int(step)] = max(per_step.get(int(step), 0.0), float(seconds))
    return [[step, round(seconds * 1000.0, 3)] for step, seconds in sorted(per_step.items())
            if step > WARMUP_STEPS]


def _per_step(run: Any) -> dict[int, float] | None:
    """A run's [step, ms] list (a journal record, or its step_times_ms) as a mapping, or None."""
    times = run.get("step_times_ms") if isinstance(run, Mapping) else run
    if not isinstance(times, list) or not times:
        return None
    try:
        per_step = {int(step): float(ms) for step, ms in times}
    except (TypeError, ValueError):
        return None
    # A time that is no positive number (a job's own probe may say anything) times nothing.
    return {step: ms for step, ms in per_step.items() if math.isfinite(ms) and ms > 0} or None


def _load(run: Any) -> float | None:
    load = run.get("load_avg") if isinstance(run, Mapping) else None
    return float(load) if isinstance(load, int | float) and math.isfinite(load) else None


def _loads_apart(base_runs: list[Any], runs: list[Any]) -> str | None:
    """Why the groups' step times cannot be compared for the machine's load, or None."""
    base = [x for x in map(_load, base_runs) if x is not None]
    other = [x for x in map(_load, runs) if x is not None]
    if not base or not other:
        return None
    a, b = statistics.median(base), statistics.median(other)
    if abs(a - b) <= max(LOAD_APART, 0.25 * max(a, b)):
        return None
    return (f"the machine was {'busier' if b > a else 'quieter'} for these runs (1-minute load "
            f"average {b:.1f}) than for the runs they are compared with ({a:.1f})")


def compare_runs(base_runs: Iterable[Any], runs: Iterable[Any]) -> dict[str, Any] | None:
    """One group's step time against a baseline group's, over the steps all of them timed.

    Each run is its journal record (``step_times_ms``, ``load_avg``) or its [step, ms] list
    alone (None for a run that timed no step). The cost's fields are group_cost's (median,
    range, ratio against the baseline's median, over the common window), plus ``steps``
    ([first, last] of the window) and ``meaningful`` with ``why`` when it is not: too few
    shared steps, a difference within the runs' own spread, or groups that ran while the
    machine was differently busy. None when either group has no timed run.
    """
    base_runs, runs = list(base_runs), list(runs)
    base = [t for t in (_per_step(r) for r in base_runs) if t]
    other = [t for t in (_per_step(r) for r in runs) if t]
    if not base or not other:
        return None
    window = sorted(set.intersection(*(set(t) for t in base + other)))
    if len(window) < MIN_WINDOW:
        lasts = sorted({max(t) for t in base + other})
        return {"runs": len(other), "median_ms": None, "ratio": None, "ratio_min": None,
                "ratio_max": None, "steps": None, "meaningful": False,
                "why": f"the runs share {len(window)} timed step(s) after warm-up, fewer than "
                       f"{MIN_WINDOW} (they stopped at steps {lasts[0]}-{lasts[-1]}: a diverged "
                       "run stops early, and early steps are slow)"}

    def medians(group: list[dict[int, float]]) -> list[float]:
        return [statistics.median(t[s] for s in window) for t in group]

    base_ms, other_ms = medians(base), medians(other)
    cost = group_cost(other_ms, statistics.median(base_ms))
    assert cost is not None
    cost["steps"] = [window[0], window[-1]]
    # How much runs of one mask differ among themselves (load, noise): a cost below it is
    # no measured cost. With one run a group, its steps' own spread stands for it.
    spread = max(_spread(base_ms, base), _spread(other_ms, other))
    cost["spread"] = round(spread, 4)
    meaningful = abs(cost["ratio"] - 1.0) > spread or spread == 0.0
    cost["meaningful"] = meaningful
    cost["why"] = None if meaningful else (
        f"{(cost['ratio'] - 1.0) * 100.0:+.1f}% is within the runs' own spread "
        f"({spread * 100.0:.1f}%)")
    if meaningful and (busier := _loads_apart(base_runs, runs)):
        cost["meaningful"], cost["load_apart"] = False, True
        cost["why"] = f"{(cost['ratio'] - 1.0) * 100.0:+.1f}%, but {busier}"
    return cost


def _spread(medians: list[float], runs: list[dict[int, float]]) -> float:
    if len(medians) >= 2:
        return (max(medians) - min(medians)) / statistics.median(medians)
    steps = sorted(runs[0].values())
    quarter = max(len(steps) // 4, 0)
    return (steps[-1 - quarter] - steps[quarter]) / statistics.median(steps)


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
    if cost.get("meaningful") is False:
        if cost.get("ratio") is None:
            return f"no step time figure: {cost['why']}"
        if cost.get("load_apart"):
            return (f"step time not comparable ({cost['why']}; steps "
                    f"{cost['steps'][0]}-{cost['steps'][1]} over {cost['runs']} run(s))")
        return (f"no measurable difference in step time ({cost['why']}; steps "
                f"{cost['steps'][0]}-{cost['steps'][1]} over {cost['runs']} run(s))")
    if cost.get("ratio") is None:
        return f"{cost['median_ms']:.1f} ms a step (no all-on runs to compare with)"
    percent = (cost["ratio"] - 1.0) * 100.0
    steps = f", steps {cost['steps'][0]}-{cost['steps'][1]}" if cost.get("steps") else ""
    return (f"{percent:+.1f}% step time ({cost['median_ms']:.1f} ms; over {cost['runs']} run(s) "
            f"{cost['ratio_min']:.2f}-{cost['ratio_max']:.2f}x{steps})")


def fix_costs(records: Iterable[Mapping[str, Any]], *, edge_ids: Iterable[str],
              fix: Iterable[str], variant_suffix: str = "") -> dict[str, Any]:
    """What the smallest fix costs, from journaled runs the search already has.

    ``all_on``: runs with every edge on (or no mask) and no guard; ``drop``:
    runs of drop-only(fix), every edge on but the fix's, against all-on;
    ``guard``: all-on runs under the size-one guard, against all-on. Each is
    a group_cost or None when no such run timed its steps. Runs under stress are
    left out; a run of several masks counts as one run per segment, each with
    the steps it ran under that segment's mask.
    """
    every, dropped = frozenset(edge_ids), frozenset(fix)
    groups: dict[str, list[Any]] = {"all_on": [], "drop": [], "guard": []}
    for record in (piece for r in records for piece in _segments(r)):
        if not str(record.get("variant", "")).endswith(variant_suffix):
            continue
        if record.get("stress"):  # stress's delays are no cost of a fix
            continue
        mask = record.get("mask")
        mask = every if mask is None else frozenset(mask)
        guard = record.get("guard", "none")
        if mask == every:
            groups["all_on" if guard == "none" else "guard"].append(record)
        elif dropped and mask == every - dropped and guard == "none":
            groups["drop"].append(record)
    timed = [_per_step(t) for t in groups["all_on"]]
    base = group_cost([statistics.median(t.values()) for t in timed if t], None)
    return {"all_on": base, "drop": compare_runs(groups["all_on"], groups["drop"]),
            "guard": compare_runs(groups["all_on"], groups["guard"])}


def _segments(record: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """A journal record as one record per mask it ran: a run of several masks (its
    `schedule`, search/segments.py) split by step, each piece with its steps' times."""
    schedule = record.get("schedule")
    if not isinstance(schedule, list) or not schedule:
        return [record]
    times = record.get("step_times_ms") if isinstance(record.get("step_times_ms"), list) else []
    bounds = [first for first, _ in schedule[1:]] + [math.inf]
    return [{**record, "schedule": None, "mask": mask,
             "step_times_ms": [t for t in times if isinstance(t, list) and len(t) == 2
                               and isinstance(t[0], int) and first <= t[0] < end]}
            for (first, mask), end in zip(schedule, bounds, strict=True)]


def fix_cost_line(costs: Mapping[str, Any], fix: Iterable[str]) -> str | None:
    """`dropping bwd:X->Y costs +1.2% step time (...); the size-one guard costs +0.1% ...`."""
    parts = []
    fix = sorted(fix)
    for key, what in (("drop", f"dropping {', '.join(fix)}"), ("guard", "the size-one guard")):
        cost = costs.get(key)
        if key == "drop" and not fix or not cost:
            continue
        if cost.get("meaningful") is False:
            parts.append(f"{what}: {describe_cost(cost)}")
        elif cost.get("ratio") is not None:
            parts.append(f"{what} costs {describe_cost(cost)}")
    return "; ".join(parts) if parts else None


def startup_in_steps(records: Iterable[Mapping[str, Any]]) -> float | None:
    """A run's start-up (launch to its first metric line) in steps' worth of time: the
    median over usable runs that measured both, or None when none did. The first metric
    line comes after the first step, so it counts one step of the start-up's time too."""
    ratios = sorted(r["first_progress_s"] / (r["step_time_ms"] / 1000.0) for r in records
                    if r.get("outcome") in USABLE_OUTCOMES
                    and isinstance(r.get("first_progress_s"), (int, float))
                    and isinstance(r.get("step_time_ms"), (int, float)) and r["step_time_ms"] > 0)
    return float(statistics.median(ratios)) if ratios else None
