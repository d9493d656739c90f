"""The adapter for hyper-parallel, both lineages, on its MindSpore and torch backends.

- the newer ``fully_shard`` lineage (core/fully_shard: HSDPSchedulerV2, and the
  backends' MindSporeHSDPStateV2 / TorchHSDPStateV2): parameters hold their local
  tensor as ``sharded_param``, a prefetch is ``unshard(async_op=True)``; a prefetch into
  a unit of shard size 1 copies the local shard at once (no collective), which the
  unit's own unshard does again;
- the older ``hyper_parallel.hsdp(cell, shard_size, threshold, ...)`` lineage
  (core/hsdp, platform/*/hsdp): parameters hold it as ``param`` (``sharded_param`` is
  None at shard size 1), a prefetch is ``prefetch_unsharded()`` of each sharded
  parameter, so a prefetch into a unit of shard size 1 does nothing by construction;
  with ``shard_size=1`` no prefetching hook is registered at all.

A state is of the older lineage when its parameters have ``prefetch_unsharded`` (a
state without parameters: when it has no ``wait_for_unshard``), of the newer when they
have ``unshard``; a build whose states have neither (or no ``prefetch``) is not one the
adapter recognizes: it says so once, naming what is missing and the version found (the
probe's ``hyper_parallel.unrecognized``; ``graph`` and every command that discovers the
graph stop there, exit 2).

Activated by ``bisect_prefetch.adapters.install()`` when the job imports
``hyper_parallel``; a job whose schedulers live in other modules (something
that follows hyper-parallel's interface) names them to ``activate(session,
modules=...)`` itself. It imports no framework itself.

What it patches (class attributes of every scheduler class, i.e. a class with
``set_forward_prefetch_cells`` and ``set_backward_prefetch_cells``, in the
modules of ``SCHEDULER_MODULES`` as they are imported):

- ``set_forward_prefetch_cells`` / ``set_backward_prefetch_cells`` (MindFormers
  calls the module-level ``set_modules_to_*_prefetch``, which forward to these):
  once names are known, each edge of the list given joins the graph. The
  lists themselves are left as given: the mask is applied at one place only.
- ``_hsdp_forward_pre_hook`` / ``_hsdp_backward_pre_hook``, the hooks that
  unshard a cell and prefetch its lists: they note the running scheduler, the
  source of any prefetch issued inside (a thread-local stack). The first
  forward pre-hook is the root's: before it runs, every wrapped module is named
  by fqn (``cells_and_names()`` / ``named_modules()``; the root is ``root``),
  each state is instrumented and the graph is written.

Each state's ``prefetch()`` (instance attribute) goes through ``Session.prefetch``,
the one gate: it masks, applies the size-one guard, probes and notifies
listeners; a prefetch from outside any hook (no edge) meets the guard alone. Each
call that starts a gather early is counted: a parameter's (or comm-fusion buffer's)
``unshard`` with ``async_op=True``, or its ``prefetch_unsharded()``. The probe gets,
under ``"hyper_parallel"``, per edge ``async_unshards`` (those calls) and
``already_unsharded`` (the target was unsharded when the prefetch came), per unit its
effective shard size, whether it is size-one, its parameter count, how many carry
``shard_size``, and its ``lineage``; ``size_one_prefetch``: what a size-one prefetch
does in each lineage seen. The scheduler classes' ``__init__`` is wrapped too: when a
step ends and no prefetching hook ever ran because every scheduler has
``no_param_sharded`` (the older lineage with ``shard_size=1``), the probe's
``no_prefetch_hooks`` says so, and ``graph`` says it instead of "recorded no graph".

Step boundaries (adapters/steps.py): the root's forward pre-hook tells the clock
a forward begins; the optimizer's call (adapters/optimizers.py: a MindSpore
optimizer Cell in PyNative mode, or torch's optimizer hooks) is the update. When
the optimizer is about to apply a step's gradients, each wrapped parameter's
local gradient (``.grad`` of the lineage's tensor: ``sharded_param``, where the newer
post-backward leaves it, or ``param``, where the older grad-buffer hook does; a
DTensor's local shard) and its local value (that tensor) are read
as numpy arrays (``asnumpy()``; a torch tensor through ``numpy()``: on the host)
and digested as adapters/digest.py says (adapters/numpy_digest.py), with norm and max abs, into
digests.jsonl. A parameter is named by its path from the root
(``parameters_and_names()`` / ``named_parameters()``), the names the units come
from; a gradient that is None (not computed, or cleared) is skipped.

While the session records the order (the first steps), the state's
``unshard`` and ``shard`` (instance attributes) record unshards that start
work (an async unshard leaves its gathers pending until the state is
unsharded) and reshards, and each prefetching hook records its cell's use; the older
lineage's prefetch, which gathers without the state's ``unshard``, records its unshard
at the gate.

A plan's schedule of masks (adapters/plan.py) is followed at the step boundaries the
optimizer shows, as in any adapter, except where the engine takes the prefetch decisions
once: at discovery, a MindSpore root under MindSpore's graph mode
(``mindspore.get_context("mode") == mindspore.GRAPH_MODE``) runs its hooks when the
graph is compiled (Cell's ``_jit_forward_pre_hook``), so whatever the gate decides then
is what every step does; the adapter calls ``Session.refuse_schedule`` (the probe's
``schedule_refused``) and segment 0's mask stays. (hyper-parallel's older scheduler
registers no prefetching hooks in graph mode at all: there is then no prefetch to gate
and no step boundary, and the record says so.) What the adapter cannot tell: a job in
PyNative mode that compiles its own training step (``mindspore.jit`` around forward and
backward) fixes the decisions at compile time too; the context says PyNative there, so
the adapter switches, and the probe's per-step tally would show the gate's decisions,
not the compiled graph's.

Effective shard size of a parameter: ``shard_size`` where present (the older
lineage's group size, 1 under its threshold), else ``shard_world_size`` (the shard
mesh's size) if ``is_sharded``, else 1. Of a state: the largest over its parameters
(``sharded_hsdp_params`` where present, else ``hsdp_params``).
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import sys
from collections.abc import Iterator
from typing import Any

from bisect_prefetch.adapters import numpy_digest
from bisect_prefetch.adapters.base import DigestColumns, FrameworkAdapter
from bisect_prefetch.adapters.numpy_digest import local_array
from bisect_prefetch.adapters.units import ROOT_NAME
from bisect_prefetch.vocab import BWD, FWD

SCHEDULER_MODULES = (
    "hyper_parallel.core.fully_shard.hsdp_scheduler",  # HSDPSchedulerV2, both backends
    "hyper_parallel.core.hsdp.hsdp_scheduler",  # the older HSDPScheduler
)
PREFETCH_HOOKS = {"_hsdp_forward_pre_hook": FWD, "_hsdp_backward_pre_hook": BWD}
LIST_SETTERS = {
    "set_forward_prefetch_cells": (FWD, "forward_prefetch_cells"),
    "set_backward_prefetch_cells": (BWD, "backward_prefetch_cells"),
}
HSDP_LINEAGE = "hsdp"  # hyper_parallel.hsdp(...): core/hsdp, platform/*/hsdp
FULLY_SHARD_LINEAGE = "fully_shard"  # fully_shard(...): core/fully_shard, *HSDPStateV2
# What a prefetch into a unit of shard size 1 does, per lineage (the audit's evidence).
SIZE_ONE_PREFETCH = {
    HSDP_LINEAGE: "a no-op by construction: hyper-parallel's older hsdp lineage leaves "
                  "size-one parameters out of sharded_hsdp_params, the only ones its "
                  "prefetch touches (no guard is involved)",
    FULLY_SHARD_LINEAGE: "a local copy made at once (no collective), which the unit's own "
                         "unshard makes again",
}
NO_HOOKS = ("every unit has shard size 1: hyper-parallel registered no prefetch hooks "
            "(its older hsdp lineage does not, with shard_size=1), so there is no prefetch "
            "to gate, and whether a size-one guard is present is moot")
_adapter: HyperParallelAdapter | None = None


# -- shard sizes ----------------------------------------------------------------------
def param_shard_size(param: Any) -> int:
    """The parameter's FSDP shard group size (see the module docstring)."""
    if hasattr(param, "shard_size"):
        return int(param.shard_size)
    if getattr(param, "is_sharded", False):
        return int(getattr(param, "shard_world_size", 1))
    return 1


def state_params(state: Any) -> list[Any]:
    params = getattr(state, "sharded_hsdp_params", None)
    if params is None:
        params = getattr(state, "hsdp_params", None)
    return list(params or [])


def state_shard_size(state: Any) -> int:
    """Largest effective shard size over the state's parameters; 1 for none."""
    return max((param_shard_size(p) for p in state_params(state)), default=1)


def all_params(state: Any) -> list[Any]:
    """Every wrapped parameter of the state (sharded or not)."""
    return list(getattr(state, "hsdp_params", None) or state_params(state))


# -- lineages -------------------------------------------------------------------------
def lineage_of(state: Any) -> tuple[str | None, list[str]]:
    """(HSDP_LINEAGE or FULLY_SHARD_LINEAGE, []) for a state the adapter knows, else
    (None, the attributes neither lineage's state or parameters lacked)."""
    if not callable(getattr(state, "prefetch", None)):
        return None, ["hsdp_state.prefetch"]
    params = all_params(state)
    if any(callable(getattr(p, "prefetch_unsharded", None)) for p in params):
        return HSDP_LINEAGE, []
    lacking = [p for p in params if not callable(getattr(p, "unshard", None))]
    if lacking:
        return None, ["parameter.unshard (fully_shard)", "parameter.prefetch_unsharded (hsdp)"]
    if not params and not callable(getattr(state, "wait_for_unshard", None)):
        return HSDP_LINEAGE, []  # a unit with no parameter of its own: the state tells
    return FULLY_SHARD_LINEAGE, []


def tensor_of(param: Any) -> Any:
    """The wrapped parameter's local value: the older lineage keeps it in ``param`` (its
    ``sharded_param`` is None at shard size 1, and stale otherwise), the newer one in
    ``sharded_param``."""
    if callable(getattr(param, "prefetch_unsharded", None)):
        return getattr(param, "param", None)
    return getattr(param, "sharded_param", None)


def version_found() -> str:
    """hyper-parallel's version as installed (or the module's own), for messages."""
    module = sys.modules.get("hyper_parallel")
    version = getattr(module, "__version__", None)
    if version is None:
        try:
            from importlib import metadata

            version = metadata.version("hyper_parallel")
        except Exception:  # not installed as a distribution (a source tree, a stand-in)
            version = "of unknown version"
    return f"hyper-parallel {version}"


# -- names ----------------------------------------------------------------------------
def named_submodules(root: Any) -> Iterator[tuple[str, Any]]:
    """(fqn, module) under ``root``, itself first: MindSpore cells or torch modules."""
    if hasattr(root, "cells_and_names"):
        return root.cells_and_names()
    return root.named_modules()


def scheduler_modules(scheduler: Any) -> tuple[Any, ...]:
    modules = getattr(scheduler, "modules", None)
    return tuple(modules) if modules else (scheduler.cell,)


def named_parameters(root: Any) -> Iterator[tuple[str, Any]]:
    """(path, parameter) under ``root``: MindSpore cells or torch modules."""
    if hasattr(root, "parameters_and_names"):
        return root.parameters_and_names()
    return root.named_parameters()


def hsdp_param_name(param: Any, paths: dict[int, str]) -> str | None:
    """A wrapped parameter's path from the root, whichever of its Parameters the cell holds."""
    for attr in ("param", "sharded_param", "_unsharded_param", "unsharded_param"):
        path = paths.get(id(getattr(param, attr, None)))
        if path is not None:
            return path
    return getattr(param, "_param_fqn", None) or getattr(
        getattr(param, "sharded_param", None), "name", None
    )


def _async_op(args: tuple, kwargs: dict) -> bool:
    return bool(kwargs.get("async_op", args[0] if args else False))


class HyperParallelAdapter(FrameworkAdapter):
    """Names wrapped modules, graphs their prefetch lists, routes prefetches through the gate."""

    def __init__(self, session: Any) -> None:
        super().__init__(session)  # its units are the schedulers, its roots the root modules
        self.state_owner: dict[int, Any] = {}  # id(state) -> scheduler
        self.edge_extra: dict[str, dict[str, int]] = {}
        self.unit_facts: dict[str, dict[str, Any]] = {}  # unit name -> what the probe says of it
        self.async_unshards = 0
        self.pending: set[int] = set()  # id(state) of states with an async unshard not yet waited
        self.lineages: dict[int, str] = {}  # id(state) -> its lineage
        self.created: list[Any] = []  # every scheduler made, hooked or not
        self.facts: dict[str, Any] = {"edges": self.edge_extra, "units": self.unit_facts}
        self.facts["version"] = version_found()  # the audit words its evidence by it
        session.probe_extra["hyper_parallel"] = self.facts

    def name_of_cell(self, cell: Any) -> str:
        return self.name_of(getattr(cell, "hsdp_scheduler", None))

    @contextlib.contextmanager
    def running_hook(self, scheduler: Any, phase: str) -> Iterator[None]:
        """Around a scheduler's prefetching pre-hook: it is the source of prefetches inside."""
        if id(scheduler) not in self.unit_names and phase == FWD:
            self.discover(scheduler)  # the first forward pre-hook to run is the root's
        if phase == FWD and scheduler_modules(scheduler)[0] in self.roots:
            self.root_forward_begins()  # before it unshards: a new step's
        with self.prefetching_from((phase, scheduler)):
            yield
        order = self.recording_order()
        if order is not None:
            order.use(self.name_of(scheduler), phase)  # the hook unsharded it: it computes now

    # -- discovery --------------------------------------------------------------------
    def discover(self, root_scheduler: Any) -> None:
        """Name every wrapped module under the root, graph their lists, instrument their states."""
        root = scheduler_modules(root_scheduler)[0]
        self.roots.append(root)
        found: dict[int, tuple[Any, list[str]]] = {}
        for fqn, module in named_submodules(root):
            scheduler = getattr(module, "hsdp_scheduler", None)
            if scheduler is None or id(scheduler) in self.unit_names:
                continue
            entry = found.setdefault(id(scheduler), (scheduler, []))
            entry[1].append(fqn or ROOT_NAME)
        for scheduler, fqns in found.values():
            self.name_unit(scheduler, "+".join(fqns))
        for scheduler, _ in found.values():
            self.instrument_state(scheduler)
            for phase, attr in LIST_SETTERS.values():
                self.note_list(scheduler, phase, getattr(scheduler, attr, None) or [])
        reason = compiled_once(root)
        if reason is not None:  # before the first step ends: no switch has happened yet
            self.session.refuse_schedule(reason)
        self.check_plan_agreement(root)
        self.write_graph()

    def instrument_state(self, scheduler: Any) -> None:
        state = getattr(scheduler, "hsdp_state", None)
        if state is None or id(state) in self.state_owner:
            return
        lineage, missing = lineage_of(state)
        if lineage is None:
            self.unrecognized(missing)
            return
        self.state_owner[id(state)] = scheduler
        self.lineages[id(state)] = lineage
        params = all_params(state)
        size = state_shard_size(state)
        self.unit_facts[self.name_of(scheduler)] = {
            "shard_size": size,
            "size_one": size == 1,
            "params": len(params),
            "params_with_shard_size": sum(hasattr(p, "shard_size") for p in params),
            "lineage": lineage,
        }
        self.facts.setdefault("size_one_prefetch", {})[lineage] = SIZE_ONE_PREFETCH[lineage]
        # Every call that starts a gather early: unshard(async_op=True) (fully_shard) or
        # prefetch_unsharded() (hsdp), of a parameter or of a comm-fusion buffer.
        buffers = [getattr(state, "param_group", None), *(getattr(state, "param_buffers", None) or [])]
        for unsharder in [*params, *buffers]:
            if unsharder is None:
                continue
            if callable(getattr(unsharder, "prefetch_unsharded", None)):
                unsharder.prefetch_unsharded = self._counting_unshard(
                    unsharder.prefetch_unsharded, always=True)
            elif callable(getattr(unsharder, "unshard", None)):
                unsharder.unshard = self._counting_unshard(unsharder.unshard)
        state.prefetch = self._routed_prefetch(state, state.prefetch)
        if self.session.order is not None:
            name = self.name_of(scheduler)
            if hasattr(state, "unshard"):  # an interface without it just records less
                state.unshard = self._ordered_unshard(state, name, state.unshard)
            if hasattr(state, "shard"):
                state.shard = self._ordered_shard(state, name, state.shard)

    # -- the order record (first steps only) ------------------------------------------
    def _ordered_unshard(self, state: Any, name: str, original: Any) -> Any:
        """Records who starts the state's unshard: its own hook, or the edge prefetching it."""
        @functools.wraps(original)
        def unshard(*args: Any, **kwargs: Any) -> Any:
            order = self.session.order
            if order.steps_left <= 0:
                return original(*args, **kwargs)
            # An async unshard leaves the state sharded with its gathers pending.
            starts = getattr(state, "is_shard", True) and id(state) not in self.pending
            result = original(*args, **kwargs)
            if starts:
                order.unshard(name)
            if getattr(state, "is_shard", False):
                if _async_op(args, kwargs):
                    self.pending.add(id(state))
            else:
                self.pending.discard(id(state))
            return result

        return unshard

    def _ordered_shard(self, state: Any, name: str, original: Any) -> Any:
        @functools.wraps(original)
        def shard(*args: Any, **kwargs: Any) -> Any:
            order = self.session.order
            was_unsharded = order.steps_left > 0 and getattr(state, "is_shard", True) is False
            result = original(*args, **kwargs)
            if was_unsharded and getattr(state, "is_shard", False):
                order.reshard(name)
            return result

        return shard

    def _counting_unshard(self, original: Any, *, always: bool = False) -> Any:
        """Counts the calls that start a gather early (``always``: every call)."""
        @functools.wraps(original)
        def unshard(*args: Any, **kwargs: Any) -> Any:
            if always or _async_op(args, kwargs):
                self.async_unshards += 1
            return original(*args, **kwargs)

        return unshard

    def unrecognized(self, missing: list[str]) -> None:
        """A hyper-parallel whose units neither lineage's interface fits: say so once."""
        if "unrecognized" in self.facts:
            return
        line = (f"{version_found()} is not a version the adapter recognizes: missing "
                + ", ".join(missing))
        self.facts["unrecognized"] = line
        self.session.note_error(line)

    def scheduler_created(self, scheduler: Any) -> None:
        if all(s is not scheduler for s in self.created):
            self.created.append(scheduler)

    def _routed_prefetch(self, state: Any, original: Any) -> Any:
        @functools.wraps(original)
        def prefetch(*args: Any, **kwargs: Any) -> Any:
            return self.prefetch(state, original, args, kwargs)

        return prefetch

    def _prefetch_started(self, state: Any, scheduler: Any) -> None:
        """The older lineage's prefetch gathers without the state's unshard: the order
        record gets the unshard here (the gate names the edge), and the state's own unshard
        that follows is no new one."""
        order = self.recording_order()
        if order is not None and id(state) not in self.pending:
            order.unshard(self.name_of(scheduler))
        self.pending.add(id(state))

    def check_plan_agreement(self, root: Any) -> None:
        """Every rank records all ranks' plan hashes; different plans would make collectives diverge."""
        plan = self.session.plan
        if plan is None or "plan_hashes" in self.session.probe_extra:
            return
        hashes = _gather_plan_hashes(root, plan.hash)
        if hashes is not None:
            self.check_hashes(hashes)

    # -- prefetch lists ---------------------------------------------------------------
    def note_list(self, scheduler: Any, phase: str, cells: Any) -> None:
        """Graph the edges of a prefetch list (once names are known: at discovery, or now)."""
        if id(scheduler) not in self.unit_names:
            return  # names come at the first root forward; graphed then
        src = self.name_of(scheduler)
        for cell in cells:
            self.add_edge(phase, src, self.name_of_cell(cell))

    def add_edge(self, phase: str, src: str, dst: str, *, implicit: bool = False) -> str:
        edge = super().add_edge(phase, src, dst, implicit=implicit)
        self.edge_extra.setdefault(edge, {"async_unshards": 0, "already_unsharded": 0})
        return edge

    # -- the prefetch gate ------------------------------------------------------------
    def prefetch(self, state: Any, original: Any, args: tuple, kwargs: dict) -> Any:
        sources = self.sources()
        target = self.state_owner[id(state)]
        size = state_shard_size(state)
        if not sources:
            # Not from a scheduler hook (a user's unshard(async_op=True)): no edge; the guard holds.
            if self.session.guard_skips(size):
                return None
            return original(*args, **kwargs)
        phase, source = sources[-1]
        edge = self.add_edge(phase, self.name_of(source), self.name_of(target))
        extra = self.edge_extra[edge]
        result = None

        def run() -> bool:
            nonlocal result
            if getattr(state, "is_shard", True) is False:
                extra["already_unsharded"] += 1
            before = self.async_unshards
            result = original(*args, **kwargs)
            issued = self.async_unshards - before
            extra["async_unshards"] += issued
            if issued and self.lineages.get(id(state)) == HSDP_LINEAGE:
                self._prefetch_started(state, target)  # not through state.unshard there
            return issued > 0

        self.session.prefetch(
            edge,
            target_shard_size=size,
            target_module=scheduler_modules(target)[0],
            run=run,
        )
        return result

    # -- graph and digests ------------------------------------------------------------
    def unit_rows(self) -> list[tuple[str, int, Any]]:
        """In discovery order (the root first, then its wrapped modules as walked)."""
        return [(name, order, self.unit_facts.get(name, {}).get("shard_size"))
                for order, name in enumerate(map(self.name_of, self.units))]

    def find_digest_params(self, glob: str) -> list[tuple[str, Any]]:
        paths = {id(p): path for root in self.roots for path, p in named_parameters(root)}
        seen: set[int] = set()
        found = []
        for scheduler in self.units:
            state = getattr(scheduler, "hsdp_state", None)
            for param in getattr(state, "hsdp_params", None) or ():
                name = hsdp_param_name(param, paths)
                if id(param) in seen or name is None:
                    continue
                seen.add(id(param))
                if fnmatch.fnmatchcase(name, glob):
                    found.append((name, param))
        return found

    def gradient(self, param: Any) -> Any:
        """Where hyper-parallel leaves the local gradient (on the lineage's tensor), on the host."""
        grad = getattr(tensor_of(param), "grad", None)
        return None if grad is None else local_array(grad)

    def value(self, param: Any) -> Any:
        value = tensor_of(param)
        return None if value is None else local_array(value)

    def measure(self, names: list[str], tensors: list[Any]) -> DigestColumns:
        return numpy_digest.measure(names, tensors)

    def on_step_end(self, step: int) -> None:
        if not self.roots and self.created and "no_prefetch_hooks" not in self.facts:
            self.say_why_no_hooks()
        super().on_step_end(step)

    def say_why_no_hooks(self) -> None:
        """A step ended and no scheduler's prefetching hook ever ran: say why, if known."""
        states = [getattr(s, "hsdp_state", None) for s in self.created]
        for state in states:
            lineage, missing = lineage_of(state)
            if lineage is None:
                self.unrecognized(missing)
                return
        if all(getattr(s, "no_param_sharded", False) for s in self.created):
            self.facts["no_prefetch_hooks"] = NO_HOOKS
            self.session.note(NO_HOOKS)

    def nothing_digested_reason(self) -> str:
        return "the adapter found no parameter tensors in hyper-parallel's units"


def compiled_once(root: Any) -> str | None:
    """Why this root's prefetch decisions are taken once, when its graph is compiled (a
    MindSpore root under graph mode), or None where every hook runs at each step."""
    if not hasattr(root, "cells_and_names"):
        return None  # torch: the hooks run eagerly
    ms = sys.modules.get("mindspore")  # never import a framework the job did not
    if ms is None:
        return None
    try:
        mode = ms.get_context("mode")
    except Exception:  # a MindSpore without this context key: nothing known
        return None
    if mode == getattr(ms, "GRAPH_MODE", 0):
        return ("MindSpore graph mode: the prefetch hooks run when the graph is compiled, "
                "so the mask is fixed for the whole run")
    return None


def _gather_plan_hashes(root: Any, plan_hash: str) -> list[str] | None:
    """All ranks' plan hashes over the job's own collectives; None when not distributed."""
    if hasattr(root, "cells_and_names"):
        from mindspore import Tensor, int32, ops
        from mindspore.communication import get_group_size

        try:
            world = get_group_size()
        except RuntimeError:  # communication not initialised: a single process
            return None
        if world == 1:
            return [plan_hash]
        # Seven hex digits fit an int32; enough to tell plans apart.
        mine = int(plan_hash[:7], 16)
        theirs = ops.AllGather()(Tensor([mine], int32)).asnumpy().tolist()
        return [plan_hash if v == mine else f"{v:07x}..." for v in theirs]
    dist = sys.modules.get("torch.distributed")  # never import a framework the job did not
    if dist is None or not (dist.is_available() and dist.is_initialized()):
        return None
    hashes: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(hashes, plan_hash)
    return hashes


# -- class patches ----------------------------------------------------------------------
def _patched_hook(original: Any, phase: str) -> Any:
    @functools.wraps(original)
    def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        adapter = _adapter
        if adapter is None:
            return original(self, *args, **kwargs)
        with adapter.running_hook(self, phase):
            return original(self, *args, **kwargs)

    return hook


def _patched_setter(original: Any, phase: str) -> Any:
    @functools.wraps(original)
    def setter(self: Any, hsdp_cell_list: Any) -> Any:
        adapter = _adapter
        if adapter is None:
            return original(self, hsdp_cell_list)
        adapter.note_list(self, phase, hsdp_cell_list)
        return original(self, hsdp_cell_list)

    return setter


def _patched_init(original: Any) -> Any:
    @functools.wraps(original)
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        adapter = _adapter
        if adapter is not None:
            adapter.scheduler_created(self)  # hooked or not (the older lineage at size 1)

    return init


def is_scheduler_class(obj: Any) -> bool:
    return isinstance(obj, type) and all(callable(getattr(obj, s, None)) for s in LIST_SETTERS)


def patch_scheduler_class(cls: type) -> None:
    """Wrap the setters and prefetching hooks the class itself defines (once)."""
    if cls.__dict__.get("_bisect_prefetch_patched", False):
        return
    cls._bisect_prefetch_patched = True
    for name, phase in PREFETCH_HOOKS.items():
        if name in cls.__dict__:
            setattr(cls, name, _patched_hook(cls.__dict__[name], phase))
    for name, (phase, _) in LIST_SETTERS.items():
        if name in cls.__dict__:
            setattr(cls, name, _patched_setter(cls.__dict__[name], phase))
    if "__init__" in cls.__dict__:
        cls.__init__ = _patched_init(cls.__dict__["__init__"])


def _patch_module(module: Any) -> None:
    for obj in list(vars(module).values()):
        if is_scheduler_class(obj) and obj.__module__ == module.__name__:
            patch_scheduler_class(obj)


def activate(session: Any, *, modules: tuple[str, ...] = SCHEDULER_MODULES) -> None:
    """Hook the scheduler classes of these modules for this session; idempotent.

    modules: where scheduler classes are defined (default: hyper-parallel's); each
    is patched when imported, or now if it already is.
    """
    global _adapter
    if _adapter is None:
        _adapter = HyperParallelAdapter(session)  # it listens to the session's steps and exit
    from .import_hook import when_imported

    for name in modules:
        when_imported(name, _patch_module)


def adapter() -> HyperParallelAdapter | None:
    """The active adapter, or None."""
    return _adapter

