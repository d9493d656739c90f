"""Matrix files: an experiment (named or embedded) and its cells, each an A/A group.

A cell has dotted-key overrides, a mask, a guard, a run count and an expected
verdict; every cell's overrides are checked when the file is loaded. Cells may
also come from a bisection's verdict (`cells_from: bisect.json`,
experiment/verdict_cells.py); they run before the file's own cells.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, PrivateAttr, model_validator

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.experiment.model import (
    ExecutorConfig,
    Expectation,
    Experiment,
    Guard,
    _Strict,
    check_steps_settable,
)
from bisect_prefetch.experiment.verdict_cells import (
    read_culprit_sets,
    verdict_cells,
    verdict_shortfall,
)
from bisect_prefetch.experiment.yaml_reader import (
    _read_yaml,
    _validate_experiment,
    _validate_mapping,
    load_experiment,
    with_overrides,
)
from bisect_prefetch.vocab import CONSISTENT, DIVERGED


class Cell(_Strict):
    name: Annotated[str, Field(min_length=1)]
    overrides: dict[str, Any] = Field(default_factory=dict)
    mask: str | list[str]
    guard: Guard | None = None
    runs: Annotated[int, Field(ge=2)]
    expect: Expectation
    _origin: str = PrivateAttr(default="")  # where a cell not written in the file came from
    # Why the verdict a cells_from cell checks falls short (confidence below the one asked):
    # such a cell never meets its expectation.
    _shortfall: str | None = PrivateAttr(default=None)

    @property
    def origin(self) -> str:
        return self._origin

    @property
    def shortfall(self) -> str | None:
        return self._shortfall

    def mask_specs(self) -> list[str]:
        return [self.mask] if isinstance(self.mask, str) else list(self.mask)


def expectation_met(expect: str, verdict: str) -> bool:
    """Whether a cell's verdict meets its `expect`: `any` takes a verdict, never an error.

    A cell that could not run (verdict error) says nothing about drift, and CI must see it.
    """
    if expect == "any":
        return verdict in (CONSISTENT, DIVERGED)
    return verdict == expect


class _MatrixFile(_Strict):
    experiment: str | dict[str, Any]
    cells: list[Cell] = Field(default_factory=list)
    cells_from: Annotated[str, Field(min_length=1)] | None = None  # a bisect.json (module docstring)
    executor: ExecutorConfig | None = None  # replaces the experiment's, for every cell

    @model_validator(mode="after")
    def _some_cells(self) -> _MatrixFile:
        if not self.cells and self.cells_from is None:
            raise ValueError("a matrix needs cells, or cells_from a bisect.json")
        _check_unique_names(self.cells)
        return self


def _check_unique_names(cells: list[Cell]) -> None:
    seen: set[str] = set()
    for cell in cells:
        if cell.name in seen:
            raise ValueError(f"cell name {cell.name!r} is used twice")
        seen.add(cell.name)


class Matrix:
    """A loaded matrix: the base experiment and its cells (overrides already checked)."""

    def __init__(self, experiment: Experiment, cells: list[Cell]) -> None:
        self.experiment = experiment
        self.cells = cells

    def experiment_for(self, cell: Cell) -> Experiment:
        return with_overrides(self.experiment, cell.overrides)


def load_matrix(path: str | Path) -> Matrix:
    """Read a matrix file; its experiment is a path (relative to the matrix) or embedded."""
    path = Path(path)
    parsed = _validate_mapping(_read_yaml(path), _MatrixFile, source=str(path), kind="a matrix")
    base_dir = path.parent.resolve()
    if isinstance(parsed.experiment, str):
        experiment = load_experiment(base_dir / parsed.experiment)
    else:
        experiment = _validate_experiment(
            parsed.experiment, source=f"{path}: experiment", base_dir=base_dir
        )
    if parsed.executor is not None:
        experiment = experiment.model_copy(update={"executor": parsed.executor})
    cells = parsed.cells
    if parsed.cells_from is not None:
        cells = _cells_from(base_dir / parsed.cells_from, experiment.name) + cells
        try:
            _check_unique_names(cells)
        except ValueError as exc:
            raise BisectPrefetchError(f"{path}: {exc} (cells_from names its cells so)") from None
    for cell in cells:
        try:
            cell_experiment = with_overrides(experiment, cell.overrides)
            check_steps_settable(experiment, cell_experiment.steps, "steps")
        except BisectPrefetchError as exc:
            raise BisectPrefetchError(f"{path}: cell {cell.name!r}: {exc}") from None
    return Matrix(experiment, cells)


def _cells_from(verdict: Path, experiment_name: str) -> list[Cell]:
    """The cells a bisect.json's causes make (experiment/verdict_cells.py)."""
    cells = [Cell(**cell) for cell in verdict_cells(read_culprit_sets(verdict, experiment_name))]
    shortfall = verdict_shortfall(verdict)
    for cell in cells:
        cell._origin = f"cells_from {verdict}"
        cell._shortfall = shortfall
    return cells
