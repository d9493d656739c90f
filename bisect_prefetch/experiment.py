"""Experiment and matrix files: pydantic models and YAML loading.

An experiment says what to run (a built-in reference workload or a command),
how to read its metrics, where its prefetch graph comes from, and the seed,
step count and timeouts. A matrix names an experiment (or embeds one) and
lists cells, each an A/A group with dotted-key overrides, a mask, a guard,
a run count and an expected verdict.

Loading errors are one line each: the file, the key, what is wrong; an
unknown key names the keys allowed where it stands.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from bisect_prefetch.errors import BisectPrefetchError

BUILTINS = ("fsdp2", "mindspore")
METRIC_FORMATS = ("jsonl", "mindformers", "torchtitan", "megatron", "regex")
GUARDS = ("none", "size-one")
EXPECTATIONS = ("consistent", "diverged", "any")

# A name becomes a directory under the state dir: keep it to one safe path part.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Fault(_Strict):
    """Planted drift for validating the tool (reference workloads only)."""

    edge: str
    hazard: Annotated[float, Field(ge=0.0, le=1.0)]
    # nudge: one ulp when the edge really prefetches; size-one-copy (mindspore
    # only): only when that prefetch is the redundant local copy into a size-one unit.
    mode: Literal["nudge", "size-one-copy"] = "nudge"


class Workload(_Strict):
    builtin: Literal["fsdp2", "mindspore"]
    layers: Annotated[int, Field(ge=1)] = 8
    world_size: Annotated[int, Field(ge=1, le=8)] = 2
    fault: Fault | None = None

    @model_validator(mode="after")
    def _fault_mode_supported(self) -> Workload:
        if self.builtin == "fsdp2" and self.fault is not None and self.fault.mode != "nudge":
            raise ValueError(f"the fsdp2 workload plants faults of mode nudge only, not {self.fault.mode}")
        return self


class Metrics(_Strict):
    format: Literal["jsonl", "mindformers", "torchtitan", "megatron", "regex"] = "jsonl"
    names: list[str] = Field(default_factory=lambda: ["loss", "grad_norm"], min_length=1)
    # A glob under the run dir; default: metrics.jsonl for jsonl, the job's stdout otherwise.
    files: str | None = None
    # For format regex: a pattern with named groups `step` and one per metric name.
    pattern: str | None = None

    @model_validator(mode="after")
    def _regex_needs_pattern(self) -> Metrics:
        if self.format == "regex" and not self.pattern:
            raise ValueError("metrics format regex needs metrics.pattern")
        return self

    def default_files(self) -> str:
        return self.files or ("metrics.jsonl" if self.format == "jsonl" else "stdout.log")


class GraphSource(_Strict):
    source: Literal["runtime", "static"] = "runtime"
    policy: str | None = None
    layers: Annotated[int, Field(ge=1)] | None = None
    inner: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _static_needs_policy(self) -> GraphSource:
        if self.source == "static" and not self.policy:
            raise ValueError("graph source static needs graph.policy")
        return self


class Search(_Strict):
    confidence: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.95
    max_runs: Annotated[int, Field(ge=1)] = 200


class Experiment(_Strict):
    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    workload: Workload | None = None
    command: list[str] | None = None
    config: str | None = None
    overrides: dict[str, Any] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    metrics: Metrics = Field(default_factory=Metrics)
    graph: GraphSource = Field(default_factory=GraphSource)
    steps: Annotated[int, Field(ge=1)] = 30
    seed: int = 1234
    timeout_s: Annotated[float, Field(gt=0)] = 600.0
    no_progress_timeout_s: Annotated[float, Field(gt=0)] | None = None
    guard: Literal["none", "size-one"] = "none"
    search: Search = Field(default_factory=Search)

    # The directory of the file it came from: relative paths (config) resolve there.
    _base_dir: Path = PrivateAttr(default_factory=Path.cwd)

    @field_validator("env", mode="before")
    @classmethod
    def _env_as_strings(cls, value: Any) -> Any:
        # YAML reads `true` and `1` as bool and int; the environment only holds strings.
        if not isinstance(value, dict):
            return value
        out = {}
        for key, item in value.items():
            if isinstance(item, bool):
                out[key] = "true" if item else "false"
            elif isinstance(item, int | float):
                out[key] = str(item)
            else:
                out[key] = item
        return out

    @model_validator(mode="after")
    def _one_way_to_run(self) -> Experiment:
        if (self.workload is None) == (self.command is None):
            raise ValueError("give exactly one of workload (a built-in) or command (an argv list)")
        if self.command is not None and not self.command:
            raise ValueError("command must not be empty")
        if self.workload is not None and (self.config or self.overrides):
            raise ValueError("config and overrides go with a command, not a built-in workload")
        if self.overrides and not self.config:
            raise ValueError("overrides need a config file to apply to")
        return self

    @property
    def base_dir(self) -> Path:
        return self._base_dir

    def config_path(self) -> Path | None:
        if self.config is None:
            return None
        return (self._base_dir / self.config).resolve()

    def world_size(self) -> int:
        return self.workload.world_size if self.workload is not None else 1

    def fingerprint(self) -> str:
        """Short hash of everything that changes a run's numbers.

        Steps and guard are left out: the run store keys them separately. The
        search settings and timeouts are left out too: changing them must not
        throw finished runs away.
        """
        keys = {"workload", "command", "config", "overrides", "env", "metrics", "seed"}
        data = self.model_dump(mode="json", include=keys)
        if self.config_path() is not None and self.config_path().is_file():
            data["config_sha256"] = hashlib.sha256(self.config_path().read_bytes()).hexdigest()
        canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


class Cell(_Strict):
    name: Annotated[str, Field(min_length=1)]
    overrides: dict[str, Any] = Field(default_factory=dict)
    mask: str | list[str]
    guard: Literal["none", "size-one"] | None = None
    runs: Annotated[int, Field(ge=2)]
    expect: Literal["consistent", "diverged", "any"]

    def mask_specs(self) -> list[str]:
        return [self.mask] if isinstance(self.mask, str) else list(self.mask)


class _MatrixFile(_Strict):
    experiment: str | dict[str, Any]
    cells: Annotated[list[Cell], Field(min_length=1)]

    @model_validator(mode="after")
    def _unique_names(self) -> _MatrixFile:
        seen: set[str] = set()
        for cell in self.cells:
            if cell.name in seen:
                raise ValueError(f"cell name {cell.name!r} is used twice")
            seen.add(cell.name)
        return self


class Matrix:
    """A loaded matrix: the base experiment and its cells (overrides already checked)."""

    def __init__(self, experiment: Experiment, cells: list[Cell]) -> None:
        self.experiment = experiment
        self.cells = cells

    def experiment_for(self, cell: Cell) -> Experiment:
        return with_overrides(self.experiment, cell.overrides)


# -- loading --------------------------------------------------------------
def _read_yaml(path: Path) -> Any:
    try:
        text = path.read_text()
    except OSError as exc:
        raise BisectPrefetchError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise BisectPrefetchError(f"{path}: malformed YAML{where}: {problem}") from None


def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The pydantic model class found by walking field names along loc."""
    current: Any = model
    for part in loc:
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        field = current.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            # A list index (cells.0) or a union branch name: keep the current model.
            if isinstance(part, int):
                continue
            return None
        current = _inner_model(field.annotation)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _inner_model(annotation: Any) -> Any:
    """The model class inside `X | None`, `list[X]` or `Annotated[X, ...]`, if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def _key_text(part: str | int) -> str:
    """A key as it reads in a message: quoted when it holds odd characters."""
    if isinstance(part, str) and not part.isprintable():
        return repr(part)
    return str(part)


def _describe(exc: ValidationError, model: type[BaseModel]) -> str:
    """One line for all of pydantic's errors."""
    parts = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        where = ".".join(_key_text(p) for p in loc)
        if err["type"] == "extra_forbidden":
            parent = _model_at(model, loc[:-1])
            allowed = ", ".join(parent.model_fields) if parent else "?"
            parts.append(f"unknown key {where!r} (allowed: {allowed})")
        elif err["type"] == "missing":
            parts.append(f"missing key {where!r}")
        else:
            msg = err["msg"].removeprefix("Value error, ")
            got = err.get("input")
            shown = "" if isinstance(got, dict | list) or got is None else f" (got {got!r})"
            parts.append(f"{where}: {msg}{shown}" if where else f"{msg}")
    # One line, whatever the keys and values hold.
    return "; ".join(parts).replace("\n", "\\n").replace("\r", "\\r")


def _validate_experiment(data: Any, *, source: str, base_dir: Path) -> Experiment:
    if not isinstance(data, dict):
        raise BisectPrefetchError(f"{source}: an experiment must be a mapping of keys")
    try:
        experiment = Experiment.model_validate(data)
    except ValidationError as exc:
        raise BisectPrefetchError(f"{source}: {_describe(exc, Experiment)}") from None
    experiment._base_dir = base_dir
    return experiment


def load_experiment(path: str | Path) -> Experiment:
    """Read and validate an experiment YAML file."""
    path = Path(path)
    return _validate_experiment(_read_yaml(path), source=str(path), base_dir=path.parent.resolve())


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """A copy of data with dotted keys set: {"workload.world_size": 1}.

    Missing intermediate mappings are created (validation then says whether the
    key exists); a path through a non-mapping value is an error.
    """
    out = copy.deepcopy(data)
    for dotted, value in overrides.items():
        parts = str(dotted).split(".")
        if not all(parts):
            raise BisectPrefetchError(f"override key {dotted!r}: empty part")
        node = out
        for depth, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                where = ".".join(parts[: depth + 1])
                raise BisectPrefetchError(
                    f"override key {dotted!r}: {where} is not a mapping"
                )
            node = child
        node[parts[-1]] = copy.deepcopy(value)
    return out


def with_overrides(experiment: Experiment, overrides: dict[str, Any]) -> Experiment:
    """The experiment with dotted-key overrides applied and validated again."""
    if not overrides:
        return experiment
    data = apply_overrides(experiment.model_dump(mode="python", exclude_none=True), overrides)
    keys = ", ".join(overrides)
    return _validate_experiment(data, source=f"overrides {keys}", base_dir=experiment.base_dir)


def load_matrix(path: str | Path) -> Matrix:
    """Read a matrix file; its experiment is a path (relative to the matrix) or embedded."""
    path = Path(path)
    data = _read_yaml(path)
    if not isinstance(data, dict):
        raise BisectPrefetchError(f"{path}: a matrix must be a mapping of keys")
    try:
        parsed = _MatrixFile.model_validate(data)
    except ValidationError as exc:
        raise BisectPrefetchError(f"{path}: {_describe(exc, _MatrixFile)}") from None
    base_dir = path.parent.resolve()
    if isinstance(parsed.experiment, str):
        experiment = load_experiment(base_dir / parsed.experiment)
    else:
        experiment = _validate_experiment(
            parsed.experiment, source=f"{path}: experiment", base_dir=base_dir
        )
    for cell in parsed.cells:
        try:
            with_overrides(experiment, cell.overrides)
        except BisectPrefetchError as exc:
            raise BisectPrefetchError(f"{path}: cell {cell.name!r}: {exc}") from None
    return Matrix(experiment, parsed.cells)
