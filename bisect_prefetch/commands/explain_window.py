"""What `explain` traces (commands/explain.py, its first part): which units' ops, in which steps,
and the experiment its traced runs run.

A mask that enables few edges (keep-only of a cause) traces only the source and target
units of those edges; any other traces every op. Without --steps the window is where
earlier runs of the experiment first differed (those with the mask's edges on, where some
did), else every step. Traced runs are longer than the window where it starts early: the
untraced steps after it are what the tracing's cost is timed against
(commands/explain_cost.py).
"""

from __future__ import annotations

from typing import Any

from rich.console import Console

from bisect_prefetch.experiment import Experiment, with_overrides
from bisect_prefetch.judge.step_time import WARMUP_STEPS
from bisect_prefetch.runs.state import OpenState
from bisect_prefetch.vocab import Mask, parse_edge_id

PURPOSE = "explain"  # explain's runs in the journal: their variant starts with it
TIMEOUT_FACTOR = 4  # traced runs get the experiment's timeouts times this
TARGETED_EDGES = 4  # a mask enabling at most this many edges traces only their units
# Untraced steps after the window where none comes before it (after the warm-up steps,
# judge/step_time.py): the step after the window pays the trace's last write, the next ones
# are the untraced step time overhead.ratio divides by.
UNTRACED_TAIL = 3


def targeted_units(mask: Mask) -> list[str] | None:
    """The source and target units of the edges a mask enables, where it enables few
    (keep-only of a cause): only their ops are traced. None: every unit's."""
    if not 1 <= len(mask) <= TARGETED_EDGES:
        return None
    units: set[str] = set()
    for edge in mask:
        try:
            _, src, dst = parse_edge_id(edge)
        except ValueError:
            return None
        units |= {src, dst}
    return sorted(units)


def traced_steps(opened: OpenState, experiment: Experiment, window: tuple[int, int] | None,
                 mask: Mask, units: list[str] | None,
                 console: Console) -> tuple[int, int, int]:
    """The window to trace (asked, or where earlier runs differed) and the runs' length,
    said; the runner's experiment becomes the traced one."""
    why = "asked"
    if window is None:
        window, why = default_window(opened.state.records(), experiment.steps, mask)
        if window[1] <= WARMUP_STEPS:  # a traced step after warm-up, to time the tracing by
            window = (window[0], WARMUP_STEPS + 1)
            why += f"; to step {WARMUP_STEPS + 1}, the first after warm-up, for its cost"
    first, last = window
    run_steps = last + (UNTRACED_TAIL if first <= WARMUP_STEPS + 1 else 0)
    what = (f"the ops of {', '.join(units)} (the source and target units of the "
            f"{len(mask)} edge{'s' if len(mask) != 1 else ''} on; --all-units traces every "
            "unit)" if units else "every op")
    tail = (f", then {UNTRACED_TAIL} untraced steps to time against" if run_steps > last else "")
    console.print(f"{what} traced in steps {first}-{last} on every rank ({why}), runs of "
                  f"{run_steps} steps{tail}", markup=False, soft_wrap=True)
    opened.runner.experiment = traced_experiment(experiment, first, last, units=units,
                                                 steps=run_steps)
    return first, last, run_steps


def default_window(records: list[dict[str, Any]], steps: int,
                   mask: Mask | None = None) -> tuple[tuple[int, int], str]:
    """The steps to trace when --steps is not given: around where earlier runs of this
    experiment (aa, bisect, matrix: not explain's own, so a resumed explain keeps its
    window) first differed, those with the mask's edges on where some did, else every
    step."""
    def seen(rows: list[dict[str, Any]]) -> list[int]:
        return sorted({r["first_diff_step"] for r in rows
                       if isinstance(r.get("first_diff_step"), int)
                       and not str(r.get("variant", "")).startswith(PURPOSE + "+")
                       and 1 <= r["first_diff_step"] <= steps})

    if mask:
        with_edges = seen([r for r in records if isinstance(r.get("mask"), list)
                           and set(mask) <= set(r["mask"])])
        if with_edges:
            return ((with_edges[0], with_edges[-1]), "where earlier runs with these edges on "
                    "first differed")
    found = seen(records)
    if found:
        return (found[0], found[-1]), "where earlier runs of this experiment first differed"
    return (1, steps), "every step: no earlier run of this experiment differed"


def traced_experiment(experiment: Experiment, first: int, last: int, *,
                      units: list[str] | None = None, steps: int | None = None) -> Experiment:
    """The experiment whose runs trace steps first-last (only the units' ops, if given) and
    end at ``steps`` (default: last).

    A step after the window cannot explain a step in it. A traced step costs several
    untraced ones (docs/explain.md): the timeouts grow alike."""
    overrides: dict[str, Any] = {"record.trace": f"{first}-{last}",
                                 "record.trace_units": units, "steps": steps or last,
                                 "timeout_s": experiment.timeout_s * TIMEOUT_FACTOR}
    if experiment.no_progress_timeout_s is not None:
        overrides["no_progress_timeout_s"] = experiment.no_progress_timeout_s * TIMEOUT_FACTOR
    return with_overrides(experiment, overrides)
