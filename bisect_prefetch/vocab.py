"""The words both sides use, named once: the orchestrator and the in-process adapter.

Standard library only and free of imports from the rest of the package, so
a training job (through adapters/) can import it as cheaply as the CLI can.
A value spelled in several files drifts in one of them: spell it here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

# -- the search's options ---------------------------------------------------------
# The chance the answer must reach when neither --confidence nor search.confidence says
# (the experiment file, `simulate`); search/evidence.Settings.of checks any value given.
DEFAULT_CONFIDENCE = 0.95

# -- how one run ended (launcher, runner, journal, search, reports) ----------------
OK = "ok"  # ran every step asked for
STOPPED_EARLY = "stopped-early"  # stopped on purpose at its first difference
TRUNCATED = "truncated"  # ended by itself (any exit code) after fewer steps than asked
ERROR = "error"  # failed: no metrics, a crash before the first step, a bad probe
TIMEOUT = "timeout"  # killed: ran too long or stopped making progress
RUN_OUTCOMES = (OK, ERROR, TIMEOUT, STOPPED_EARLY, TRUNCATED)
# Only these say whether a run diverged; every other run is retried or left out, never evidence.
USABLE_OUTCOMES = (OK, STOPPED_EARLY)

# -- what an A/A group (or a matrix cell) concluded, and what a cell may expect ----
# consistent is a group's verdict: its runs agree with each other. A single run compared
# with its reference (the group's first run, or a bisection's golden run) is clean or
# diverged; "clean" never names a group, "consistent" never a single run.
CONSISTENT = "consistent"
DIVERGED = "diverged"  # a group with two runs that differ, or a single run that differed
CLEAN = "clean"  # a single run that agreed with its reference (and runs that each did)
EXPECTATIONS = (CONSISTENT, DIVERGED, "any")

# -- the bisection: its verdicts (search/verdict.py) and the protocol's stages ------
# (search/protocol.py). A stage is a part of the protocol; a "step" is a training step.
VERDICT_FOUND = "culprit-found"
VERDICT_NO_DRIFT = "no-drift-reproduced"
VERDICT_NOT_PREFETCH = "not-prefetch"
VERDICT_INCONCLUSIVE = "inconclusive"
VERDICTS = (VERDICT_FOUND, VERDICT_NO_DRIFT, VERDICT_NOT_PREFETCH, VERDICT_INCONCLUSIVE)
# Presets that are also stages: keep-only of an answer (it must diverge), drop-only (it must not).
KEEP_ONLY = "keep-only"
DROP_ONLY = "drop-only"
STAGE_CALIBRATE = "calibrate"  # checking that all-on diverges
STAGE_CHECK_OFF = "check-off"  # checking that all-off's runs are clean
STAGE_SEARCH = "search"  # testing the most informative mask
STAGE_LEADING = "leading-set"  # keep-only of the leading set, before any answer is confirmed
STAGE_REDUCE = "reduce"  # reducing the edges every diverged run enabled
STAGE_EXTRA = "extra"  # a run the search did not ask for
STAGES = (STAGE_CALIBRATE, STAGE_CHECK_OFF, STAGE_SEARCH, STAGE_LEADING, STAGE_REDUCE, KEEP_ONLY,
          DROP_ONLY, STAGE_EXTRA)

# -- guards: prefetches the adapter skips whatever the mask says -------------------
GUARD_NONE = "none"
GUARD_SIZE_ONE = "size-one"  # skip prefetches into a unit whose shard group has size 1
GUARDS = (GUARD_NONE, GUARD_SIZE_ONE)

# -- stress (adapters/stress.py): delays before each prefetch is issued --------------
# auto: the orchestrator measures both and keeps the one that shows drift more often.
STRESS_OFF = "off"
STRESS_ON = "on"
STRESS_AUTO = "auto"
STRESS_MODES = (STRESS_OFF, STRESS_ON, STRESS_AUTO)

# -- metric log formats ------------------------------------------------------------
METRIC_FORMATS = ("jsonl", "mindformers", "torchtitan", "megatron", "regex")

# -- what happened to one prefetch at the adapter's gate (probe files, audit) --------
ISSUED = "issued"  # a real unshard (all-gather) was started
NOOP = "noop"  # allowed, but its target was already unsharded or pending
MASKED = "masked"  # the mask switched the edge off
GUARDED = "guarded"  # the guard skipped it
PROBE_OUTCOMES = (ISSUED, NOOP, MASKED, GUARDED)

# -- an adapter that could not hook the job's engine (adapters/__init__.py) ------------
# Its line, on the job's stderr (after "bisect-prefetch: ") and in the probe under
# NOT_ACTIVE_KEY: "adapter not active: torch 2.7.1 is outside the supported range 2.8-2.15".
# The job stops with it; the orchestrator makes it the run's error (runs/run_judge.py).
ADAPTER_NOT_ACTIVE = "adapter not active"
NOT_ACTIVE_KEY = "adapter_not_active"

# -- the files a rank writes into its run dir (adapters/recorder.py writes, metrics/ reads) --
# Every rank writes files of its own: nothing in a run dir is appended to by two processes
# (O_APPEND is not atomic across the clients of a shared filesystem, and interleaved
# blocks land in another order each run). docs/contract.md has the table of who writes what.
DIGESTS_PREFIX = "digests.rank"  # digests.rank<R>.jsonl
METRICS_PREFIX = "metrics.rank"  # metrics.rank<R>.jsonl (report_step)
RANK_FILE_SUFFIX = ".jsonl"
# Older run dirs: every rank appended to one file. Still read, never written.
SHARED_DIGESTS_FILE = "digests.jsonl"
# The jsonl metrics a job writes itself, in one file (read when no rank wrote its own).
METRICS_FILE = "metrics.jsonl"


def digests_rank_file(rank: int) -> str:
    """The file one rank's gradient digests are written to, in the run dir."""
    return f"{DIGESTS_PREFIX}{rank}{RANK_FILE_SUFFIX}"


def metrics_rank_file(rank: int) -> str:
    """The file one rank's report_step lines are written to, in the run dir."""
    return f"{METRICS_PREFIX}{rank}{RANK_FILE_SUFFIX}"


# -- gradient digests (digests.rank<R>.jsonl: adapters/digest.py writes, metrics/ reads) -------
# A parameter's value digest is recorded under the parameter's name plus this suffix.
VALUE_SUFFIX = "@value"
# How a run's records are made (adapters/digest.py, adapters/steps.py): runs journaled
# under another format are not reused. 2: digests of every element, of gradients and
# values, at the optimizer's step boundary.
RECORD_FORMAT = 2

# -- the job's environment (env.rank{R}.json: adapters/environment.py writes, runs/envprint.py reads)
# Libraries whose versions a run's numbers may depend on, as the job sees them.
ENV_LIBRARIES = ("torch", "mindspore", "numpy", "hyper-parallel", "mindformers", "torchtitan", "triton")
# Thread counts and determinism switches that change results or their order.
ENV_VARIABLES = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "PYTHONHASHSEED",
    "CUBLAS_WORKSPACE_CONFIG",
    "CUDA_LAUNCH_BLOCKING",
    "NCCL_ALGO",
    "NCCL_PROTO",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "HCCL_DETERMINISTIC",
    "ASCEND_LAUNCH_BLOCKING",
    "MS_DEV_RUNTIME_CONF",
    "MS_ALLOC_CONF",
    "TE_PARALLEL_COMPILER",
)


# -- a command's placeholders (experiment files; runs/workloads.py fills them in) ------
PLACEHOLDERS = ("run_dir", "config", "port", "rank_log_dir", "steps", "seed")
# `{steps}` is replaced in every run; `{{steps}}` is the escape: a literal `{steps}`.
# Other braces are no placeholders and stay as written (JSON in an argument survives).
_PLACEHOLDER = re.compile(r"\{\{(" + "|".join(PLACEHOLDERS) + r")\}\}|\{(" + "|".join(PLACEHOLDERS)
                          + r")\}")


def placeholders_in(word: str) -> set[str]:
    """The placeholders a command argument uses (escaped ones are not used)."""
    return {m.group(2) for m in _PLACEHOLDER.finditer(word) if m.group(2)}


def escape_placeholders(word: str) -> str:
    """A word as a shell would pass it, written so that the tool keeps it literal: each
    `{steps}` (any placeholder's name) becomes `{{steps}}`."""
    return _PLACEHOLDER.sub(lambda m: f"{{{{{m.group(2)}}}}}" if m.group(2) else m.group(0), word)


def fill_placeholders(word: str, value: Callable[[str], str]) -> str:
    """The argument with each placeholder replaced by value(name), each escape undone."""
    return _PLACEHOLDER.sub(lambda m: f"{{{m.group(1)}}}" if m.group(1) else value(m.group(2)),
                            word)


# -- the arguments `init` gave a placeholder (experiment/init_file.py finds them; runs/rank_logs.py
# and commands/init.py read them): here, so that a job's life needs nothing of a command's file
STEPS, SEED, PORT = "steps", "seed", "port"
INTEGER = re.compile(r"^[+-]?\d+$")  # a whole number as a command argument spells it


@dataclass(frozen=True)
class Marked:
    """One argument init gave a placeholder: `--steps 100` -> `--steps {steps}`."""

    kind: str  # steps | seed | port
    flag: str  # the argument's name as written: --steps, --rdzv-endpoint, MASTER_PORT
    value: str  # the value it had
    index: int  # the argv word that holds the value

    def describe(self) -> str:
        return f"{self.flag} {self.value} -> {{{self.kind}}}"


@dataclass
class Placeholders:
    """A command with `{steps}`, `{seed}` and `{port}` where init found their arguments."""

    original: list[str]
    argv: list[str]
    marked: list[Marked] = field(default_factory=list)
    launcher: str | None = None  # torchrun, msrun, ... when the command starts one
    standalone: bool = False  # torchrun --standalone: it picks a free port itself
    notes: list[str] = field(default_factory=list)  # arguments seen but left as they are

    def found(self, kind: str) -> Marked | None:
        return next((m for m in reversed(self.marked) if m.kind == kind), None)

    def value(self, kind: str) -> int | None:
        """The command's own value of steps or seed, when it had one."""
        mark = self.found(kind)
        return int(mark.value) if mark is not None and INTEGER.match(mark.value) else None

    def needs_port(self) -> bool:
        """Whether runs side by side would meet at one port: a launcher, no {port}, not standalone."""
        return self.launcher is not None and not self.standalone and self.found(PORT) is None


# -- every other file name of a state dir and a run dir ------------------------------
# A rank's file is named by a function of its rank; given "*", the function gives the
# glob that finds every rank's. tests/test_words_spelled_once.py fails on a literal of
# one of these names elsewhere in the package.
# The state dir (<state dir>/<experiment>/):
JOURNAL_FILE = "journal.jsonl"  # one finished run a line (runs/store.py)
LOCK_FILE = "lock"
RUNS_DIR = "runs"  # a run dir per run: runs/<run id>/
REPORT_FILE = "report.html"
BISECT_FILE = "bisect.json"
EXPLAIN_FILE = "explain.json"  # commands/explain.py: the first op that differs
MATRIX_FILE = "matrix.json"
# A run dir, written by the orchestrator or the job's launcher:
PLAN_FILE = "plan.json"  # what the in-job adapter reads (runs/plan.py writes it)
STATUS_FILE = "status.json"  # how the run ended, once collected
STDOUT_FILE = "stdout.log"
STDERR_FILE = "stderr.log"
ENV_FILE = "env.json"  # the environment the orchestrator started the job with
GRAPH_FILE = "graph.json"  # the ranks' graph files merged (judge/merge.py)
PROBE_FILE = "probe.json"  # the ranks' probes merged
SCRIPT_FILE = "job.sbatch"  # a Slurm run's batch script
STEP_FILE = "job.srun"  # a run's srun command line, when it is a step of the tool's allocation
EXIT_FILE = "job_exit_code"  # a Slurm run's exit code, as its script saw it
MANIFEST_FILES = "manifest.*.jsonl"  # every process's manifest (adapters/manifest.py)
RANK_LOG_DIR = "rank_logs"  # {rank_log_dir} of a run's command: a launcher's per-worker logs
ADAPTER_TREE = "adapter"  # the copy of the in-job code a job's PYTHONPATH starts with
PLOTS_DIR = "report"  # the state dir's plots, beside REPORT_FILE


def op_trace_file(rank: int | str) -> str:
    """One rank's op trace in a run dir (adapters/op_trace.py, cell_trace.py; explain)."""
    return f"optrace.rank{rank}.jsonl"


def env_rank_file(rank: int | str) -> str:
    """The file one rank's environment fingerprint is written to, in the run dir."""
    return f"env.rank{rank}.json"


def graph_rank_file(rank: int | str) -> str:
    """The prefetch graph one rank found (merged into GRAPH_FILE)."""
    return f"graph.rank{rank}.json"


def probe_rank_file(rank: int | str) -> str:
    """What happened to each edge on one rank (merged into PROBE_FILE)."""
    return f"probe.rank{rank}.json"


def order_rank_file(rank: int | str) -> str:
    """One rank's order record of its first steps (adapters/order.py; audit)."""
    return f"order.rank{rank}.jsonl"


def manifest_process_file(host: str, pid: int | str) -> str:
    """What one process of a job read (adapters/manifest.py), named by host and pid: every
    process writes its own, ranks, launcher agents and forked workers alike."""
    return f"manifest.{host}-{pid}.jsonl"


# -- edges and masks -----------------------------------------------------------------
# A mask: the set of ENABLED edge ids. One type from the search to the plan file; it
# becomes a sorted JSON list only when the plan is written, and a Mask again when read.
Mask = frozenset[str]
FWD = "fwd"
BWD = "bwd"
PHASES = (FWD, BWD)
# The most layers a static policy builds: far above any model trained today (a few
# hundred), far below what exhausts memory (100,000,000 layers took 9 GB).
MAX_LAYERS = 4096
# The most inner units a layer of the mindformers policy holds.
MAX_INNER = 64


def edge_id(phase: str, src: str, dst: str) -> str:
    """The id of a prefetch edge: `PHASE:SRC->DST`, e.g. `bwd:layers.1->layers.0`."""
    return f"{phase}:{src}->{dst}"


def edge_phase(text: str) -> str:
    """The phase an edge id starts with (`fwd`, `bwd`; anything else for a non-id)."""
    return text.partition(":")[0]


# In a selector (select.py reads them back), a backslash makes the next character plain:
# a comma, a glob character or a backslash inside an edge id is written escaped.
SELECTOR_SPECIAL = ",*?[]\\"


def quote_edges(edge_ids: Iterable[str]) -> str:
    """Edge ids as one selector string that selects exactly them: `keep-only:` + this is a
    mask a user can paste back (select.py reads the escapes)."""
    return ",".join("".join("\\" + ch if ch in SELECTOR_SPECIAL else ch for ch in edge)
                    for edge in edge_ids)


def parse_edge_id(text: str) -> tuple[str, str, str]:
    """(phase, src, dst) of an edge id; ValueError when it is not one."""
    phase, sep, rest = text.partition(":")
    src, arrow, dst = rest.partition("->")
    if not sep or not arrow or phase not in PHASES or not src or not dst:
        raise ValueError(f"not an edge id (PHASE:SRC->DST, PHASE fwd or bwd): {text!r}")
    return phase, src, dst
