"""What tracing cost `explain` (commands/explain.py): ops, bytes and flush time per traced
step from the ranks' probes, and the traced steps' time against the untraced steps' of the
same runs, said in one line."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from rich.console import Console

from bisect_prefetch.drivers.group import AAResult
from bisect_prefetch.judge.step_time import WARMUP_STEPS, run_step_times_ms
from bisect_prefetch.vocab import probe_rank_file


def overhead(group: AAResult, run_dir: Any, window: tuple[int, int]) -> dict[str, Any]:
    """What tracing cost, from the ranks' probes: ops and bytes per traced step, flush time,
    and the traced steps' time against the untraced steps' of the same runs (after the
    warm-up steps, and not the step after the window, which writes its last records):
    ``ratio``, None where the runs had no untraced step to time."""
    ops, written, flush, granularity, units = [], [], [], set(), None
    traced_ms: list[float] = []
    untraced_ms: list[float] = []
    first, last = window
    for run in group.runs:
        directory = Path(run_dir(run.run_id))
        for probe in directory.glob(probe_rank_file("*")):
            try:
                trace = json.loads(probe.read_text()).get("op_trace")
            except (OSError, ValueError, AttributeError):
                continue
            if trace:
                granularity.add(trace.get("granularity", "op"))
                units = trace.get("units", units)
                count = max(trace["steps"][1] - trace["steps"][0] + 1, 1)
                ops.append(trace["ops"] / count)
                written.append(trace["bytes"] / count)
                flush.append(trace["flush_s"] / count * 1000)
        for step, ms in run_step_times_ms(directory):
            if first <= step <= last:
                traced_ms.append(ms)
            elif step != last + 1:
                untraced_ms.append(ms)

    def median(values: list[float]) -> float | None:
        return round(statistics.median(values), 1) if values else None

    traced, untraced = median(traced_ms), median(untraced_ms)
    return {"ops_per_step": median(ops), "bytes_per_step": median(written),
            "flush_ms_per_step": median(flush), "step_time_ms": traced,
            "untraced_step_time_ms": untraced,
            "ratio": round(traced / untraced, 2) if traced and untraced else None,
            "traced_steps_timed": len(traced_ms), "untraced_steps_timed": len(untraced_ms),
            "rank_records": len(ops), "units": units,
            # op: torch's dispatcher ops; cell: MindSpore Cell calls (adapters/cell_trace.py)
            "granularity": "cell" if "cell" in granularity else "op"}


def say_cost(cost: dict[str, Any], console: Console) -> None:
    """The cost line: the traced against the untraced step time, or why it was not timed."""
    if cost["ratio"] is None:
        console.print(f"tracing cost: not timed ({cost['traced_steps_timed']} traced and "
                      f"{cost['untraced_steps_timed']} untraced steps after warm-up, the "
                      f"first {WARMUP_STEPS}, in these runs)", markup=False)
        return
    console.print(f"tracing cost: a traced step {cost['step_time_ms']:.0f} ms against "
                  f"{cost['untraced_step_time_ms']:.0f} ms untraced in the same runs "
                  f"(x{cost['ratio']:.2f}; {cost['ops_per_step']:.0f} ops a step and rank)",
                  markup=False)
