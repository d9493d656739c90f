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
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

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
from bisect_prefetch.vocab import (
    CONSISTENT,
    DIVERGED,
    EXPECTATIONS,
    GUARDS,
    MAX_INNER,
    MAX_LAYERS,
    METRIC_FORMATS,
    RECORD_FORMAT,
    STRESS_MODES,
    STRESS_OFF,
)
from bisect_prefetch.workloads import mindformers as mindformers_workload

# The words come from vocab; pydantic checks a value against them through these types.
MetricFormat = Literal[METRIC_FORMATS]  # type: ignore[valid-type]
Guard = Literal[GUARDS]  # type: ignore[valid-type]
StressMode = Literal[STRESS_MODES]  # type: ignore[valid-type]
Expectation = Literal[EXPECTATIONS]  # type: ignore[valid-type]
ModelT = TypeVar("ModelT", bound=BaseModel)

# A name becomes a directory under the state dir: keep it to one safe path part.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# exec's limits (Linux): one argument or environment entry at most 32 pages, all of them
# together at most ARG_MAX. Room is left for the placeholders' values (run dir paths).
MAX_ARG_BYTES = 32 * 4096 - 4096
_PLACEHOLDER_ROOM = 64 * 1024


def arg_max() -> int:
    """What exec takes for argv and environment together, less room for placeholders."""
    try:
        limit = os.sysconf("SC_ARG_MAX")
    except (ValueError, OSError):
        limit = 2 * 1024 * 1024
    return max(limit, 256 * 1024) - _PLACEHOLDER_ROOM


def exec_bytes(argv: list[str], env: dict[str, str]) -> int:
    """The bytes exec copies for argv and env (strings, their NULs and pointers)."""
    words = [*argv, *(f"{k}={v}" for k, v in env.items())]
    return sum(len(word.encode(errors="surrogateescape")) + 1 + 8 for word in words)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Fault(_Strict):
    """Planted drift for validating the tool (reference workloads only)."""

    edge: str
    hazard: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    # nudge: one ulp when the edge really prefetches; size-one-copy (mindspore
    # only): only when that prefetch is the redundant local copy into a size-one unit;
    # race (fsdp2 only): a real data race, async unshards and the edge's consumer skips
    # its wait (no hazard: timing decides; workloads/fsdp2.py).
    mode: Literal["nudge", "size-one-copy", "race"] = "nudge"

    @model_validator(mode="after")
    def _hazard_fits_mode(self) -> Fault:
        if self.mode == "race":
            if self.hazard is not None:
                raise ValueError("fault mode race takes no hazard: timing decides when it fires")
            if not self.edge.startswith("fwd:"):
                raise ValueError(
                    f"fault mode race plants forward edges only, not {self.edge}: on a backward "
                    "edge gloo's synchronous reduce-scatter closes the window (never drifts)")
        elif self.hazard is None:
            raise ValueError(f"fault mode {self.mode} needs a hazard (per-step chance)")
        return self


class Workload(_Strict):
    builtin: Literal["fsdp2", "mindspore", "mindformers"]
    layers: Annotated[int, Field(ge=1, le=MAX_LAYERS)] = 8
    world_size: Annotated[int, Field(ge=1, le=8)] = 2
    fault: Fault | None = None
    # fsdp2 only, to plant suspect edges for the audit: activation checkpointing,
    # layers each layer prefetches in backward (2 shadows edges), extra explicit edges.
    checkpoint: bool = False
    backward_prefetch_depth: Annotated[int, Field(ge=1)] = 1
    extra_edges: list[str] = Field(default_factory=list)
    # fsdp2 only: model width and global batch (the race needs compute to race against).
    dim: Annotated[int, Field(ge=2)] = 32
    # fsdp2 only: asynchronous unshards with every wait in place (no race; race mode implies it).
    async_unshard: bool = False
    batch: Annotated[int, Field(ge=1)] = 8
    # fsdp2 only: each layer's forward sleeps this many ms (modelled device compute the
    # host waits on; timing only, no number changes).
    compute_ms: Annotated[float, Field(ge=0.0, allow_inf_nan=False)] = 0.0
    # mindformers only, a positive control: run k of a group trains with seed + k * seed_step,
    # so a group with seed_step > 0 must be called diverged at step 1.
    seed_step: Annotated[int, Field(ge=0)] = 0

    @model_validator(mode="after")
    def _fault_mode_supported(self) -> Workload:
        if (self.builtin == "fsdp2" and self.fault is not None
                and self.fault.mode not in ("nudge", "race")):
            raise ValueError(f"the fsdp2 workload plants faults of mode nudge or race, not {self.fault.mode}")
        if self.builtin != "fsdp2" and self.fault is not None and self.fault.mode == "race":
            raise ValueError("fault mode race: the fsdp2 workload only")
        if self.builtin != "mindformers" and self.seed_step:
            raise ValueError("seed_step: an option of the mindformers workload only")
        planted = ({"checkpoint", "backward_prefetch_depth", "extra_edges", "dim", "batch",
                    "async_unshard", "compute_ms"}
                   & self.model_fields_set)
        if self.builtin != "fsdp2" and planted:
            raise ValueError(f"{', '.join(sorted(planted))}: options of the fsdp2 workload only")
        return self


class Metrics(_Strict):
    format: MetricFormat = "jsonl"
    names: list[str] = Field(default_factory=lambda: ["loss", "grad_norm"], min_length=1)
    # A glob under the run dir; default: metrics.jsonl for jsonl, the job's stdout otherwise.
    files: str | None = None
    # For format regex: a pattern with named groups `step` and one per metric name.
    pattern: str | None = None

    @model_validator(mode="after")
    def _regex_needs_pattern(self) -> Metrics:
        if self.format == "regex" and not self.pattern:
            raise ValueError("metrics format regex needs metrics.pattern")
        if self.pattern is not None:
            # Compiled now, so a bad pattern stops here and not after a job was launched.
            try:
                groups = set(re.compile(self.pattern).groupindex)
            except re.error as exc:
                raise ValueError(f"metrics.pattern does not compile: {exc}") from None
            if "step" not in groups:
                raise ValueError("metrics.pattern needs a named group (?P<step>...)")
            missing = [name for name in self.names if name not in groups]
            if missing:
                raise ValueError(f"metrics.pattern has no group for {', '.join(missing)} "
                                 "(each metric name is a named group: (?P<loss>...))")
        return self

    @field_validator("files")
    @classmethod
    def _files_inside_the_run_dir(cls, value: str | None) -> str | None:
        # A run is judged on its own files only: no absolute glob, no way out of its dir.
        if value is not None and (value.startswith(("/", "\\")) or ".." in Path(value).parts
                                  or not value.strip()):
            raise ValueError(f"metrics.files {value!r} must be a glob inside the run dir "
                             "(relative, without ..)")
        return value


class GraphSource(_Strict):
    source: Literal["runtime", "static"] = "runtime"
    policy: str | None = None
    layers: Annotated[int, Field(ge=1, le=MAX_LAYERS)] | None = None
    inner: list[str] = Field(default_factory=list, max_length=MAX_INNER)

    @model_validator(mode="after")
    def _static_needs_policy(self) -> GraphSource:
        if self.source == "static" and not self.policy:
            raise ValueError("graph source static needs graph.policy")
        return self


class Search(_Strict):
    confidence: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.95
    # None: a budget that scales with the graph and the estimated q (Bisection.budget).
    max_runs: Annotated[int, Field(ge=1)] | None = None
    # auto: one all-off run right after the first divergence, and before a culprit-found
    # verdict enough all-off runs to rule out drift without prefetch as strong as the
    # answer's (about 10 more runs at a per-run chance of 0.3). A count N: N all-off
    # runs right after the first divergence and no more controls, cheaper but trusting
    # drift without prefetch to be rare. Either way more all-off runs come whenever they
    # are the most informative question.
    all_off_runs: Annotated[int, Field(ge=1)] | Literal["auto"] = "auto"
    # auto: several masks per run (search/segments.py), the mask changing at step
    # boundaries, so that a start-up is paid about once per divergence; segment length
    # and step cap from the start-up and step time the runs measure. off: one mask a run.
    segments: Literal["auto", "off"] = "off"

    @field_validator("segments", mode="before")
    @classmethod
    def _switch_words(cls, value: Any) -> Any:
        return _yaml_switch(value)  # `segments: off` (on is no mode of it: refused as a bool)


class Record(_Strict):
    """What the in-job adapter records besides metrics (the plan's ``record``)."""

    # Gradient digests: per step, rank and parameter, a hash of the gradient's bytes (plus
    # its norm and max abs). A run diverges at the first step any digest differs from the
    # golden run, often steps before a printed metric does. false: only the metrics decide.
    digests: bool = True
    every: Annotated[int, Field(ge=1)] = 1  # record every N-th step
    params: Annotated[str, Field(min_length=1)] = "*"  # glob over parameter names
    # Steps whose unit order (who unsharded each unit, its uses, its reshards) is
    # recorded for the audit; the first few show every edge; 0: none.
    order_steps: Annotated[int, Field(ge=0)] = 3
    # Steps whose every op is traced, "A-B" (adapters/op_trace.py; `explain` sets it): each
    # op's inputs and outputs fingerprinted. Costly on the traced steps; none by default.
    trace: str | None = None

    @field_validator("trace")
    @classmethod
    def _trace_window(cls, value: str | None) -> str | None:
        if value is not None:
            parse_steps_window(value)
        return value

    def trace_window(self) -> tuple[int, int] | None:
        """The traced steps as (first, last), or None."""
        return None if self.trace is None else parse_steps_window(self.trace)


def parse_steps_window(text: str) -> tuple[int, int]:
    """"A-B" (or "A": one step) as (A, B) with 1 <= A <= B; ValueError says what is wrong."""
    match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", str(text))
    if not match:
        raise ValueError(f"a window of steps is A-B (e.g. 3-5), got {text!r}")
    first = int(match.group(1))
    last = int(match.group(2) or first)
    if not 1 <= first <= last:
        raise ValueError(f"a window of steps needs 1 <= A <= B, got {text!r}")
    return first, last


def _yaml_switch(value: Any) -> Any:
    """YAML 1.1 reads a bare off and on as booleans: they mean the words."""
    if value is True:
        return "on"
    if value is False:
        return "off"
    return value


class Stress(_Strict):
    """Delays before each prefetch is issued, to make a race show in fewer runs
    (adapters/stress.py, docs/stress.md). off | on | auto (measure both, keep the better)."""

    mode: StressMode = STRESS_OFF

    @field_validator("mode", mode="before")
    @classmethod
    def _switch_words(cls, value: Any) -> Any:
        return _yaml_switch(value)


SLURM_ONLY = ("partition", "nodes", "ntasks_per_node", "gpus_per_node", "gres", "time",
              "account", "qos", "sbatch_args", "expand_env")


class ExecutorConfig(_Strict):
    """Where runs execute: local slots on this machine, or one Slurm job per run."""

    kind: Literal["local", "slurm"] = "local"
    slots: Annotated[int, Field(ge=1, le=256)] = 1  # the most runs in flight at once
    devices_per_slot: Annotated[int, Field(ge=1)] | None = None  # local: devices each slot owns
    partition: str | None = None
    nodes: Annotated[int, Field(ge=1)] = 1
    ntasks_per_node: Annotated[int, Field(ge=1)] | None = None
    gpus_per_node: Annotated[int, Field(ge=1)] | None = None
    gres: str | None = None
    time: str | None = None  # Slurm's --time; default: the experiment's timeout_s
    account: str | None = None
    qos: str | None = None
    sbatch_args: list[str] = Field(default_factory=list)  # passed to every sbatch as they are
    # Slurm: the environment names whose `$NAME` or `${NAME}` in the command expand on the
    # node (e.g. MASTER_ADDR, SLURM_NODEID); every other character reaches the job as given.
    expand_env: list[str] = Field(default_factory=list)

    @field_validator("expand_env")
    @classmethod
    def _env_names(cls, names: list[str]) -> list[str]:
        for name in names:
            if not ENV_NAME.fullmatch(name):
                raise ValueError(f"expand_env: {name!r} is not an environment name")
        return names

    @model_validator(mode="after")
    def _no_control_characters(self) -> ExecutorConfig:
        # These become lines of a batch script: a newline would start a line of its own.
        for key in ("partition", "gres", "time", "account", "qos", "sbatch_args"):
            value = getattr(self, key)
            for word in value if isinstance(value, list) else [value]:
                if word is not None and any(ord(c) < 32 or ord(c) == 127 for c in word):
                    raise ValueError(f"executor.{key} {word!r} holds a control character")
        return self

    @model_validator(mode="after")
    def _keys_fit_kind(self) -> ExecutorConfig:
        if self.kind == "local":
            given = [k for k in SLURM_ONLY if k in self.model_fields_set]
            if given:
                raise ValueError(f"{', '.join(given)}: Slurm keys, but executor kind is local")
        elif self.devices_per_slot is not None:
            raise ValueError("devices_per_slot is for the local executor; use gpus_per_node or gres")
        if self.gpus_per_node is not None and self.gres is not None:
            raise ValueError("give gpus_per_node or gres, not both")
        return self


class Experiment(_Strict):
    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    workload: Workload | None = None
    command: list[str] | None = None
    config: str | None = None
    overrides: dict[str, Any] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    metrics: Metrics = Field(default_factory=Metrics)
    graph: GraphSource = Field(default_factory=GraphSource)
    steps: Annotated[int, Field(ge=1, strict=True)] = 30  # strict: `steps: true` is no 1
    seed: Annotated[int, Field(strict=True)] = 1234
    timeout_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 600.0
    no_progress_timeout_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    guard: Guard = "none"
    search: Search = Field(default_factory=Search)
    executor: ExecutorConfig = Field(default_factory=ExecutorConfig)
    record: Record = Field(default_factory=Record)
    stress: Stress = Field(default_factory=Stress)

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
        # The mindformers workload trains from a MindFormers YAML: its own, or `config`.
        takes_config = self.command is not None or self.workload.builtin == "mindformers"
        if not takes_config and (self.config or self.overrides):
            raise ValueError("config and overrides go with a command or the mindformers workload, "
                             "not this built-in workload")
        if self.overrides and not self.config and self.command is not None:
            raise ValueError("overrides need a config file to apply to")
        # What exec and every executor take: no NUL byte anywhere, identifier env names
        # (Slurm passes no other), so a bad word stops here, not in a launched job.
        for word in self.command or []:
            if "\0" in word:
                raise ValueError(f"command argument {word!r} holds a NUL byte")
            if len(word.encode()) > MAX_ARG_BYTES:
                raise ValueError(f"a command argument of {len(word.encode()):,} bytes is longer than "
                                 f"exec takes ({MAX_ARG_BYTES:,})")
        uses_config = any("{config}" in word for word in self.command or [])
        if uses_config and not self.config:
            raise ValueError("the command uses {config} but the experiment gives no config: file")
        if self.stress.mode != STRESS_OFF:
            check_stress_fits(self)
        for key, value in self.env.items():
            if not ENV_NAME.fullmatch(key):
                raise ValueError(f"env name {key!r} is not a name every executor can pass "
                                 "(letters, digits and _, not starting with a digit)")
            if "\0" in value:
                raise ValueError(f"env {key} holds a NUL byte")
        size = exec_bytes(self.command or [], {**os.environ, **self.env})
        if size > arg_max():
            raise ValueError(f"the command and its environment take {size:,} bytes, more than "
                             f"exec takes on this machine ({arg_max():,})")
        return self

    @property
    def base_dir(self) -> Path:
        return self._base_dir

    def config_path(self) -> Path | None:
        if self.config is None:
            if self.workload is not None and self.workload.builtin == "mindformers":
                return mindformers_workload.DEFAULT_CONFIG
            return None
        return (self._base_dir / self.config).resolve()

    def world_size(self) -> int:
        return self.workload.world_size if self.workload is not None else 1

    def fingerprint(self) -> str:
        """Short hash of everything that changes a run's numbers or what it records.

        Steps and guard are left out: the run store keys them separately. The
        search settings and timeouts are left out too: changing them must not
        throw finished runs away.
        """
        keys = {"workload", "command", "config", "overrides", "env", "metrics", "seed", "record"}
        data = self.model_dump(mode="json", include=keys)
        if data.get("workload") and not data["workload"].get("compute_ms"):
            del data["workload"]["compute_ms"]  # added later: unset keeps earlier runs' hash
        if data.get("record") and data["record"].get("trace") is None:
            data["record"].pop("trace", None)  # added later: unset keeps earlier runs' hash
        data["record_format"] = RECORD_FORMAT  # runs recorded another way are other runs
        if self.config_path() is not None and self.config_path().is_file():
            data["config_sha256"] = hashlib.sha256(self.config_path().read_bytes()).hexdigest()
        canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _graph_mode(experiment: Experiment) -> str | None:
    """What says the job runs MindSpore graph mode (its prefetch hooks compiled into the
    graph once), or None."""
    w = experiment.workload
    if w is not None and w.builtin == "mindformers":
        return "the mindformers workload runs MindSpore graph mode"
    if experiment.graph.source == "static" and experiment.graph.policy == "mindformers":
        return "a static mindformers graph is for MindSpore graph mode"
    return None


def check_stress_fits(experiment: Experiment) -> None:
    """ValueError, one line, where the engine cannot take stress (adapters/stress.py)."""
    if where := _graph_mode(experiment):
        raise ValueError(f"stress: {where}, where prefetches are compiled into the graph: no "
                         "issue to delay (stress: off)")


def stress_fits(experiment: Experiment) -> bool:
    """Whether the engine can take stress (check_stress_fits says why not)."""
    return _graph_mode(experiment) is None


def with_stress(experiment: Experiment, mode: str | None) -> Experiment:
    """The experiment with --stress applied (None: its own stress.mode)."""
    if mode is None or mode == experiment.stress.mode:
        return experiment
    if mode != STRESS_OFF:
        try:
            check_stress_fits(experiment)
        except ValueError as e:
            raise BisectPrefetchError(f"--stress {mode}: {e}") from None
    return experiment.model_copy(update={"stress": Stress(mode=mode)})


def segments_unfit(experiment: Experiment) -> str | None:
    """Why the engine cannot switch masks inside a run (search/segments.py), or None."""
    if _graph_mode(experiment):
        return ("MindSpore graph mode compiles the prefetch hooks into the graph once, so a "
                "run keeps its first mask")
    return None


def with_segments(experiment: Experiment, mode: str | None) -> Experiment:
    """The experiment with --segments applied (None: its own search.segments)."""
    if mode is None or mode == experiment.search.segments:
        return experiment
    if mode not in ("auto", "off"):
        raise BisectPrefetchError(f"--segments must be auto or off, got {mode!r}")
    return experiment.model_copy(
        update={"search": experiment.search.model_copy(update={"segments": mode})})


class Cell(_Strict):
    name: Annotated[str, Field(min_length=1)]
    overrides: dict[str, Any] = Field(default_factory=dict)
    mask: str | list[str]
    guard: Guard | None = None
    runs: Annotated[int, Field(ge=2)]
    expect: Expectation

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
    cells: Annotated[list[Cell], Field(min_length=1)]
    executor: ExecutorConfig | None = None  # replaces the experiment's, for every cell

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
    for cell in parsed.cells:
        try:
            with_overrides(experiment, cell.overrides)
        except BisectPrefetchError as exc:
            raise BisectPrefetchError(f"{path}: cell {cell.name!r}: {exc}") from None
    return Matrix(experiment, parsed.cells)
