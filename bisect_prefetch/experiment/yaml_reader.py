"""Experiment files from YAML: the loader's limits and one-line errors, dotted-key overrides.

Loading errors are one line each: the file, the key, what is wrong; an
unknown key names the keys allowed where it stands. A file is refused before
it is read in full where it would take too much to read (aliases, expansion).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.experiment.model import Experiment

ModelT = TypeVar("ModelT", bound=BaseModel)

MAX_ALIASES = 1000  # a hand-written file uses a few
MAX_EXPANDED_NODES = 1_000_000  # what the file means once every alias is copied out


class _Loader(yaml.SafeLoader):
    """safe_load, counting aliases and refusing duplicate keys (the last would win silently)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.aliases = 0

    def compose_node(self, parent, index):  # noqa: ANN001, ANN201 (yaml's signature)
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                raise yaml.YAMLError(f"more than {MAX_ALIASES} aliases")
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):  # noqa: ANN001, ANN201
        seen: set = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *base` merges; the keys given beside it win, as YAML says
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: yaml's own error follows
                continue
            if duplicate:
                mark = key_node.start_mark
                raise yaml.YAMLError(f"duplicate key {key!r} (line {mark.line + 1})")
        return super().construct_mapping(node, deep=deep)


def _expanded_nodes(data: Any) -> int:
    """How many values data holds with aliases copied out (as json.dumps would write it),
    counted once per shared object, so a small file of nested aliases costs nothing here."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(value: Any) -> int:
        if not isinstance(value, dict | list):
            return 1
        key = id(value)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise BisectPrefetchError("an alias refers to itself (a recursive structure)")
        active.add(key)
        children = list(value.keys()) + list(value.values()) if isinstance(value, dict) else value
        total = 1 + sum(size(child) for child in children)
        active.discard(key)
        sizes[key] = total
        return total

    return size(data)


def _read_yaml(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise BisectPrefetchError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise BisectPrefetchError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    try:
        data = yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader)
    except RecursionError:
        raise BisectPrefetchError(f"{path}: nested too deeply") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise BisectPrefetchError(f"{path}: malformed YAML{where}: {problem}") from None
    try:
        nodes = _expanded_nodes(data)
    except RecursionError:
        raise BisectPrefetchError(f"{path}: nested too deeply") from None
    if nodes > MAX_EXPANDED_NODES:
        raise BisectPrefetchError(f"{path}: its aliases expand to {nodes:,} values, more than "
                                  f"the {MAX_EXPANDED_NODES:,} an experiment may hold")
    return data


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


def _validate_mapping(data: Any, model: type[ModelT], *, source: str, kind: str) -> ModelT:
    """data validated as model; any problem becomes one BisectPrefetchError line."""
    if not isinstance(data, dict):
        raise BisectPrefetchError(f"{source}: {kind} must be a mapping of keys")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise BisectPrefetchError(f"{source}: {_describe(exc, model)}") from None


def _validate_experiment(data: Any, *, source: str, base_dir: Path) -> Experiment:
    experiment = _validate_mapping(data, Experiment, source=source, kind="an experiment")
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
    # Only the keys the file set: validators that check which keys were given see the same.
    data = apply_overrides(experiment.model_dump(mode="python", exclude_unset=True, exclude_none=True),
                           overrides)
    keys = ", ".join(overrides)
    return _validate_experiment(data, source=f"overrides {keys}", base_dir=experiment.base_dir)
