"""The experiment file's models (pydantic): what an experiment says, checked field by field.

An experiment says what to run (a built-in reference workload or a command),
how to read its metrics, where its prefetch graph comes from, and the seed,
step count and timeouts. Reading one from YAML, with its limits and error
wording, is experiment/yaml_reader.py's; the matrix, experiment/matrix.py's.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    field_validator,
    model_validator,
)

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.vocab import (
    DEFAULT_CONFIDENCE,
    EXPECTATIONS,
    GUARDS,
    MAX_INNER,
    MAX_LAYERS,
    METRIC_FORMATS,
    RECORD_FORMAT,
    STRESS_MODES,
    STRESS_OFF,
    placeholders_in,
)
from bisect_prefetch.workloads import mindformers as mindformers_workload

# The words come from vocab; pydantic checks a value against them through these types.
MetricFormat = Literal[METRIC_FORMATS]  # type: ignore[valid-type]
Guard = Literal[GUARDS]  # type: ignore[valid-type]
StressMode = Literal[STRESS_MODES]  # type: ignore[valid-type]
Expectation = Literal[EXPECTATIONS]  # type: ignore[valid-type]

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
    # fsdp2 only: tensor-parallel degree. Each layer's MLP is split over a tp mesh dimension
    # (DTensor weights) and FSDP2 shards over the rest, world_size / tp ranks: with tp equal
    # to world_size every unit has a shard group of size one, the reported case's topology.
    tp: Annotated[int, Field(ge=1, le=8)] = 1
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
                    "async_unshard", "compute_ms", "tp"}
                   & self.model_fields_set)
        if self.builtin != "fsdp2" and planted:
            raise ValueError(f"{', '.join(sorted(planted))}: options of the fsdp2 workload only")
        if self.world_size % self.tp:
            raise ValueError(f"tp {self.tp} must divide world_size {self.world_size}")
        if self.tp == self.world_size > 1 and self.fault is not None and self.fault.mode == "race":
            raise ValueError("fault mode race needs an all-gather to race: with tp equal to "
                             "world_size every shard group has size one")
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
        # `step` and `rank` say where a value belongs in every format: never a metric, and
        # refused here, before a run is launched, not when its first log is read.
        if reserved := [n for n in self.names if n in ("step", "rank")]:
            raise ValueError(f"metrics.names may not hold {', '.join(reserved)}: a line's step "
                             "and rank are no metrics")
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
    confidence: Annotated[float, Field(gt=0.0, lt=1.0)] = DEFAULT_CONFIDENCE
    # None: a budget that scales with the graph and the estimated q (Bisection.budget).
    max_runs: Annotated[int, Field(ge=1)] | None = None
    # auto: one all-off run right after the first divergence, and before a culprit-found
    # verdict enough all-off runs to rule out drift without prefetch as strong as the
    # answer's (about 10 more runs at a per-run chance of 0.3). A count N: N all-off
    # runs right after the first divergence and no more controls, cheaper but trusting
    # drift without prefetch to be rare. Either way more all-off runs come whenever they
    # are the most informative question.
    all_off_runs: Annotated[int, Field(ge=1)] | Literal["auto"] = "auto"
    # auto (the default): several masks per run (search/segments.py), the mask changing at
    # step boundaries, so that a start-up is paid about once per divergence, wherever the
    # cost model says that costs less than one mask a run (from the start-up, step time
    # and per-run chance the runs measure); elsewhere one mask a run. off: one mask a run.
    segments: Literal["auto", "off"] = "auto"

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
    # Only these units' ops are traced (`explain`'s targeted tracing: the source and target
    # units of the few edges its mask enables); none: every unit's.
    trace_units: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)] | None = None

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
        uses_config = any("config" in placeholders_in(word) for word in self.command or [])
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
        if data.get("workload") and data["workload"].get("tp") == 1:
            del data["workload"]["tp"]  # likewise
        if data.get("record") and data["record"].get("trace") is None:
            data["record"].pop("trace", None)  # added later: unset keeps earlier runs' hash
        if data.get("record") and data["record"].get("trace_units") is None:
            data["record"].pop("trace_units", None)  # likewise
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


def steps_fixed(experiment: Experiment) -> str | None:
    """Why no run of this experiment can be given another step count than `steps:` (a
    command that sets its own count: no `{steps}` in any of its arguments), or None.

    Such a job runs its own number of steps whatever the tool asks: a run asked for more
    stops short (truncated), one asked for fewer runs on. A built-in workload takes any.
    """
    if experiment.command is None:
        return None
    if any("steps" in placeholders_in(word) for word in experiment.command):
        return None
    return "the command sets its own step count ({steps} is in none of its arguments)"


def check_steps_settable(experiment: Experiment, steps: int, option: str) -> None:
    """Refuse, before any run, a step count the job cannot be given (steps_fixed)."""
    if steps != experiment.steps and (fixed := steps_fixed(experiment)):
        raise BisectPrefetchError(
            f"{option} {steps}: {fixed}, so every run makes the steps: {experiment.steps} of "
            "the experiment; put {steps} where the command takes its step count to choose "
            "another")


def with_segments(experiment: Experiment, mode: str | None) -> Experiment:
    """The experiment with --segments applied (None: its own search.segments)."""
    if mode is None or mode == experiment.search.segments:
        return experiment
    if mode not in ("auto", "off"):
        raise BisectPrefetchError(f"--segments must be auto or off, got {mode!r}")
    return experiment.model_copy(
        update={"search": experiment.search.model_copy(update={"segments": mode})})
