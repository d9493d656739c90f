"""`bisect-prefetch matrix`: A/A groups over cells (topology x mask x guard), each with an expectation.

Cells run in the matrix file's order, each as one A/A group through a group
runner. The real runner goes through the run store, so a matrix that stops
half-way resumes where it stopped with --resume: the runs its session finished are
taken again (after the checks of runs/reuse.py), never run again. Tests inject a fake
runner (any function from a CellRequest to the aa JSON dict). What an expectation means is experiment.expectation_met.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from bisect_prefetch.commands.common import (
    Given,
    check_outputs,
    resume_hint_on_interrupt,
    reuse_options,
    write_json,
)
from bisect_prefetch.drivers.group import stressed_groups
from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.experiment import (
    Cell,
    Experiment,
    Matrix,
    expectation_met,
    load_matrix,
    with_stress,
)
from bisect_prefetch.files import write_text_atomic
from bisect_prefetch.judge.step_time import compare_runs, describe_cost, group_cost
from bisect_prefetch.report.html import MATRIX_FILE, build_report
from bisect_prefetch.report.junit import write_junit
from bisect_prefetch.report.localization import in_unit
from bisect_prefetch.report.markdown import publish_markdown
from bisect_prefetch.report.progress import RunProgress
from bisect_prefetch.report.table import print_matrix
from bisect_prefetch.runs.sessions import Scope
from bisect_prefetch.runs.state import open_state
from bisect_prefetch.runs.store import JOURNAL
from bisect_prefetch.select import resolve_mask
from bisect_prefetch.vocab import CONSISTENT, DIVERGED, USABLE_OUTCOMES


@dataclass(frozen=True)
class CellRequest:
    """What a group runner is asked to run for one cell."""

    name: str
    experiment: Experiment  # with the cell's overrides applied
    mask: list[str]  # preset or selectors, as in the matrix file
    guard: str
    runs: int
    purpose: str  # run-store key part: runs of different cells never mix
    origin: str = ""  # where the cell came from, when not from the matrix file's own cells


GroupRunner = Callable[[CellRequest], dict[str, Any]]


def count_divergences(group: dict[str, Any]) -> int:
    """Runs of the group that differ from its reference run (the first usable one).

    Without per-run details, a diverged group counts one (at least one run differs).
    """
    details = group.get("run_details")
    if isinstance(details, list):
        return sum(1 for run in details
                   if run.get("outcome") in USABLE_OUTCOMES and run.get("first_diff_step") is not None)
    return 1 if group.get("verdict") == DIVERGED else 0


@dataclass
class CellResult:
    name: str
    expect: str
    mask_spec: list[str]
    guard: str
    overrides: dict[str, Any]
    group: dict[str, Any]  # the aa JSON of the cell's group
    seconds: float = 0.0
    shortfall: str | None = None  # a cells_from verdict below the confidence asked (Cell)

    @property
    def verdict(self) -> str:
        return self.group.get("verdict", "error")

    @property
    def expectation_met(self) -> bool:
        return self.shortfall is None and expectation_met(self.expect, self.verdict)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "expect": self.expect,
            "verdict": self.verdict,
            "reason": self.group.get("reason"),  # why there is no verdict, for an error
            "expectation_met": self.expectation_met,
            "shortfall": self.shortfall,
            "first_diff_step": self.group.get("first_diff_step"),
            "localization": self.group.get("localization"),
            "metrics": self.group.get("metrics") or {},
            "runs": self.group.get("runs", 0),
            "divergences": count_divergences(self.group),
            "mask_spec": self.mask_spec,
            "mask": self.group.get("mask") or [],
            "guard": self.guard,
            "overrides": self.overrides,
            "seconds": round(self.seconds, 3),
            "group": self.group,
        }


@dataclass
class MatrixResult:
    name: str
    experiment: str
    cells: list[CellResult] = field(default_factory=list)

    @property
    def failed(self) -> list[str]:
        return [c.name for c in self.cells if not c.expectation_met]

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def exit_code(self) -> int:
        """0 when every expectation is met, 1 otherwise (a finding, for CI to gate on)."""
        return 0 if self.ok else 1

    def to_json(self) -> dict[str, Any]:
        return {
            "matrix": self.name,
            "experiment": self.experiment,
            "ok": self.ok,
            "failed": self.failed,
            "cells": [c.to_json() for c in self.cells],
            "step_time": self.step_costs(),
        }

    def step_costs(self) -> dict[str, dict[str, Any]]:
        """Per cell: its step time against the all-on cell of the same overrides (if any)."""
        costs = {}
        for cell in self.cells:
            base = next((c for c in self.cells if c.mask_spec == ["all-on"]
                         and c.overrides == cell.overrides), None)
            details = cell.group.get("run_details") or []
            if base is None or base is cell:
                own = group_cost([r.get("step_time_ms") for r in details], None)
                cost = group_cost([r.get("step_time_ms") for r in details],
                                  own["median_ms"] if own and base is cell else None)
            else:  # over the steps both cells' runs timed (judge/step_time.py)
                cost = compare_runs(base.group.get("run_details") or [], details)
            if cost is not None:
                costs[cell.name] = cost
        return costs


def cell_request(matrix: Matrix, cell: Cell, stress: str | None = None) -> CellRequest:
    """stress: --stress, over the cell's own stress.mode."""
    experiment = with_stress(matrix.experiment_for(cell), stress)
    return CellRequest(
        name=cell.name,
        experiment=experiment,
        mask=cell.mask_specs(),
        guard=cell.guard or experiment.guard,
        runs=cell.runs,
        purpose=f"matrix:{cell.name}",
        origin=cell.origin,
    )


def cell_verdict_line(cell: CellResult) -> str:
    """`-> diverged at step 4 (2 of 3 runs); expected diverged: ok`."""
    data = cell.to_json()
    if cell.verdict == DIVERGED:
        what = f"diverged at step {data['first_diff_step']}{in_unit(data['localization'])}"
    elif cell.verdict == CONSISTENT:
        what = CONSISTENT
    else:
        what = f"error: {cell.group.get('reason', '')}".rstrip(": ")
    met = "ok" if cell.expectation_met else "FAILED"
    if cell.shortfall is not None:
        met += f" ({cell.shortfall})"
    return (f"-> {what} ({data['divergences']} of {data['runs']} runs diverged); "
            f"expected {cell.expect}: {met}")


def run_matrix(
    matrix: Matrix,
    run_group: GroupRunner,
    *,
    name: str = "matrix",
    console: Console | None = None,
    clock: Callable[[], float] = time.monotonic,
    stress: str | None = None,
) -> MatrixResult:
    """Run every cell in file order and collect verdicts and expectations.

    With a console, each cell is narrated: what it runs, then its verdict line.
    """
    result = MatrixResult(name=name, experiment=matrix.experiment.name)
    for number, cell in enumerate(matrix.cells, start=1):
        request = cell_request(matrix, cell, stress)
        if console is not None:
            overrides = ", ".join(f"{k}={v}" for k, v in cell.overrides.items())
            mode = request.experiment.stress.mode
            console.print(
                f"cell {number}/{len(matrix.cells)} {cell.name}: mask {' '.join(request.mask)}, "
                f"guard {request.guard}" + (f", stress {mode}" if mode != "off" else "")
                + (f", {overrides}" if overrides else "")
                + f", up to {cell.runs} runs, expect {cell.expect}", markup=False, soft_wrap=True)
        started = clock()
        group = run_group(request)
        cell_result = CellResult(
            name=cell.name, expect=cell.expect, mask_spec=request.mask, guard=request.guard,
            overrides=dict(cell.overrides), group=group, seconds=clock() - started,
            shortfall=cell.shortfall,
        )
        result.cells.append(cell_result)
        if console is not None:
            console.print(cell_verdict_line(cell_result), markup=False, soft_wrap=True)
    return result


def engine_group_runner(
    *, state_dir: str | Path, console: Console | None = None,
    progress: RunProgress | None = None, executor: str | None = None, slots: int | None = None,
    scope: Scope | None = None,
) -> GroupRunner:
    """The real group runner: the run store under state_dir, graph discovery, the A/A group.

    The state dir's lock is held per cell, so cells that override the
    experiment's name run in their own state dirs; one scope (runs/sessions.py) for every
    cell: its session is the one the first cell's state dir decides.
    """
    scope = scope or Scope("matrix", per_experiment=False)
    edge_ids_of: dict[tuple[str, ...], list[str]] = {}  # cells of one experiment share a graph

    def run(request: CellRequest) -> dict[str, Any]:
        experiment = request.experiment
        with open_state(experiment, state_dir, console=console, executor=executor,
                        slots=slots, scope=scope) as opened:
            known = (experiment.name, experiment.fingerprint(), experiment.graph.model_dump_json())
            if known not in edge_ids_of:
                edge_ids_of[known] = opened.graph().edge_ids()
            edge_ids = edge_ids_of[known]
            try:
                mask = resolve_mask(request.mask, edge_ids)
            except BisectPrefetchError as exc:
                origin = f" (a cell of {request.origin}: its edges are not in the graph)" if (
                    request.origin) else ""
                raise BisectPrefetchError(f"cell {request.name!r}{origin}: {exc}") from None
            group = stressed_groups(opened.runner, mode=experiment.stress.mode, mask=mask,
                                    runs=request.runs, steps=experiment.steps,
                                    guard=request.guard, purpose=request.purpose,
                                    name=request.name, progress=progress)
        return group.to_json() | {"stress_groups": [
            {"stress": "on" if g.stress else "off", "verdict": g.verdict, "runs": len(g.runs)}
            for g in group.stress_groups]}

    return run


def matrix_name(path: str | Path) -> str:
    """A matrix's name is its file's stem."""
    return Path(path).stem


def matrix(
    path: Path,
    *,
    state_dir: Path,
    console: Console,
    junit: Path | None = None,
    markdown: Path | None = None,
    json_out: Path | None = None,
    run_group: GroupRunner | None = None,
    env: Mapping[str, str] = os.environ,
    executor: str | None = None,
    slots: int | None = None,
    stress: str | None = None,
    reuse: bool | None = None,
    resume: bool = False,
) -> int:
    """`bisect-prefetch matrix`: run the cells, print the table, write every output asked for.

    Returns the exit code (0 every expectation met, 1 otherwise). Also leaves
    matrix.json (with the command that reruns it) and the HTML report next to
    the journal of the matrix's experiment.
    """
    given = Given("matrix", path, {
        "state_dir": state_dir, "executor": executor, "slots": slots, "stress": stress,
        "junit": junit, "markdown": markdown, "json": json_out, "resume": resume,
        **reuse_options(reuse)})
    with resume_hint_on_interrupt(console, given.follow_up(resume=True)):
        result = run_matrix_file(path, state_dir=state_dir, console=console, run_group=run_group,
                                 executor=executor, slots=slots, stress=stress,
                                 outputs=(junit, markdown, json_out),
                                 scope=Scope(f"matrix:{matrix_name(path)}", resume=resume,
                                             earlier=bool(reuse), per_experiment=False))
    data = result.to_json()
    print_matrix(data, console)
    for cell_name, cost in data["step_time"].items():  # only cells whose runs timed their steps
        console.print(f"step time of {cell_name} against all-on: {describe_cost(cost)}",
                      markup=False, soft_wrap=True)
    for written in publish_markdown(data, markdown, env=env):
        console.print(f"wrote {written}", markup=False)
    if junit is not None:
        write_junit(data, junit)
        console.print(f"wrote {junit}", markup=False)
    if json_out is not None:
        write_json(json_out, data, console)
    experiment_dir = Path(state_dir) / result.experiment
    saved = {**data, "command": given.follow_up()}
    write_text_atomic(experiment_dir / MATRIX_FILE, json.dumps(saved, indent=2) + "\n")
    if (experiment_dir / JOURNAL).is_file():
        console.print(f"wrote {build_report(experiment_dir)}", markup=False)
    return result.exit_code


def run_matrix_file(path: Path, *, state_dir: Path, console: Console,
                    run_group: GroupRunner | None = None, executor: str | None = None,
                    slots: int | None = None, stress: str | None = None,
                    outputs: tuple[Path | None, ...] = (),
                    scope: Scope | None = None) -> MatrixResult:
    """Load the matrix and run its cells with live progress (the real runner unless given one)."""
    loaded = load_matrix(path)
    check_outputs(*outputs, state_dir=state_dir, name=loaded.experiment.name)
    total = sum(cell.runs for cell in loaded.cells)
    console.print(f"matrix {matrix_name(path)}: {len(loaded.cells)} cells, up to {total} runs, "
                  f"experiment {loaded.experiment.name}", markup=False)
    with RunProgress(console, total_runs=total) as progress:
        runner = run_group or engine_group_runner(state_dir=state_dir, console=console,
                                                  progress=progress, executor=executor,
                                                  slots=slots, scope=scope)
        return run_matrix(loaded, runner, name=matrix_name(path), console=console, stress=stress)
