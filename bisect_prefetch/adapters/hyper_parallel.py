"""The adapter for hyper-parallel's ``fully_shard`` (MindSpore and torch backends).

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
parameter's ``unshard`` (and a comm-fusion ``param_group.unshard``) counts
calls with ``async_op=True``. The probe gets, under ``"hyper_parallel"``,
per edge ``async_unshards`` and ``already_unsharded`` (the target was unsharded
when the prefetch came), and per unit its effective shard size, whether it is
size-one, and how many of its parameters carry ``shard_size``.

Step boundaries (adapters/steps.py): the root's forward pre-hook tells the clock
a forward begins; the optimizer's call (adapters/optimizers.py: a MindSpore
optimizer Cell in PyNative mode, or torch's optimizer hooks) is the update. When
the optimizer is about to apply a step's gradients, each wrapped parameter's
local gradient (``hsdp_param.sharded_param.grad``, where hyper-parallel's
post-backward leaves it; a DTensor's local shard) and its local value are read
as numpy arrays (``asnumpy()``; a torch tensor through ``numpy()``: on the host)
and digested as adapters/digest.py says, with norm and max abs, into
digests.jsonl. A parameter is named by its path from the root
(``parameters_and_names()`` / ``named_parameters()``), the names the units come
from; a gradient that is None (not computed, or cleared) is skipped.

While the session records the order (the first steps), the state's
``unshard`` and ``shard`` (instance attributes) record unshards that start
work (an async unshard leaves its gathers pending until the state is
unsharded) and reshards, and each prefetching hook records its cell's use.

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

Effective shard size of a parameter: ``shard_size`` where present (the FSDP
shard group's size, from ``_init_group_infos()``), else ``shard_world_size``
if ``is_sharded``, else 1. Of a state: the largest over its parameters
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
    for attr in ("sharded_param", "_unsharded_param", "unsharded_param"):
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
        session.probe_extra["hyper_parallel"] = {"edges": self.edge_extra, "units": self.unit_facts}

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
        self.state_owner[id(state)] = scheduler
        params = state_params(state)
        size = state_shard_size(state)
        self.unit_facts[self.name_of(scheduler)] = {
            "shard_size": size,
            "size_one": size == 1,
            "params": len(params),
            "params_with_shard_size": sum(hasattr(p, "shard_size") for p in params),
        }
        for unsharder in [*params, getattr(state, "param_group", None)]:
            if unsharder is not None and hasattr(unsharder, "unshard"):
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

    def _counting_unshard(self, original: Any) -> Any:
        @functools.wraps(original)
        def unshard(*args: Any, **kwargs: Any) -> Any:
            if _async_op(args, kwargs):
                self.async_unshards += 1
            return original(*args, **kwargs)

        return unshard

    def _routed_prefetch(self, state: Any, original: Any) -> Any:
        @functools.wraps(original)
        def prefetch(*args: Any, **kwargs: Any) -> Any:
            return self.prefetch(state, original, args, kwargs)

        return prefetch

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
        """Where hyper-parallel's post-backward leaves the local gradient, read on the host."""
        grad = getattr(getattr(param, "sharded_param", None), "grad", None)
        return None if grad is None else local_array(grad)

    def value(self, param: Any) -> Any:
        value = getattr(param, "sharded_param", None)
        return None if value is None else local_array(value)

    def measure(self, names: list[str], tensors: list[Any]) -> DigestColumns:
        return numpy_digest.measure(names, tensors)

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

