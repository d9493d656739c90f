"""The adapter for hyper-parallel's ``fully_shard`` (MindSpore and torch backends).

Activated by ``bisect_prefetch.adapters.install()`` when the job imports
``hyper_parallel``; the MindSpore reference workload activates it by hand for
hyper-parallel's test double (bisect_prefetch.workloads.hsdp_double), which
follows the same interface. It imports no framework itself.

What it patches (class attributes of every scheduler class, i.e. a class with
``set_forward_prefetch_cells`` and ``set_backward_prefetch_cells``, in the
modules of ``SCHEDULER_MODULES`` as they are imported):

- ``set_forward_prefetch_cells`` / ``set_backward_prefetch_cells`` (MindFormers
  calls the module-level ``set_modules_to_*_prefetch``, which forward to these):
  the list given is kept as the original; once names are known the scheduler
  gets only the cells the mask enables.
- ``_hsdp_forward_pre_hook`` / ``_hsdp_backward_pre_hook``, the hooks that
  unshard a cell and prefetch its lists: they note the running scheduler, the
  source of any prefetch issued inside (a thread-local stack). The first
  forward pre-hook is the root's: before it runs, every wrapped module is named
  by fqn (``cells_and_names()`` / ``named_modules()``; the root is ``root``),
  the lists are filtered (before the scheduler can back a list up for
  recompute), each state is instrumented and the graph is written.

Each state's ``prefetch()`` (instance attribute) goes through ``Session.prefetch``,
which masks, applies the size-one guard, probes and notifies listeners. Each
parameter's ``unshard`` (and a comm-fusion ``param_group.unshard``) counts
calls with ``async_op=True``. The probe gets, under ``"hyper_parallel"``,
per edge ``async_unshards`` and ``already_unsharded`` (the target was unsharded
when the prefetch came), and per unit its effective shard size, whether it is
size-one, and how many of its parameters carry ``shard_size``.

Effective shard size of a parameter: ``shard_size`` where present (the FSDP
shard group's size, from ``_init_group_infos()``), else ``shard_world_size``
if ``is_sharded``, else 1. Of a state: the largest over its parameters
(``sharded_hsdp_params`` where present, else ``hsdp_params``).
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
from collections.abc import Iterator
from typing import Any

from bisect_prefetch.adapters.units import ROOT_NAME, UNKNOWN_NAME, is_layer, node_kind

SCHEDULER_MODULES = (
    "hyper_parallel.core.fully_shard.hsdp_scheduler",  # HSDPSchedulerV2, both backends
    "hyper_parallel.core.hsdp.hsdp_scheduler",  # the older HSDPScheduler
    "bisect_prefetch.workloads.hsdp_double",  # the test double
)
PREFETCH_HOOKS = {"_hsdp_forward_pre_hook": "fwd", "_hsdp_backward_pre_hook": "bwd"}
LIST_SETTERS = {
    "set_forward_prefetch_cells": ("fwd", "forward_prefetch_cells"),
    "set_backward_prefetch_cells": ("bwd", "backward_prefetch_cells"),
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


def _async_op(args: tuple, kwargs: dict) -> bool:
    return bool(kwargs.get("async_op", args[0] if args else False))


class HyperParallelAdapter:
    """Names wrapped modules, filters prefetch lists, routes prefetches through the session."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.names: dict[int, str] = {}  # id(scheduler) -> unit name
        self.schedulers: list[Any] = []  # named schedulers, in discovery order
        self.state_owner: dict[int, Any] = {}  # id(state) -> scheduler
        self.originals: dict[tuple[int, str], list[Any]] = {}  # (id(scheduler), phase) -> list given
        self.edges: dict[str, dict[str, Any]] = {}
        self.edge_extra: dict[str, dict[str, int]] = {}
        self.units: dict[str, dict[str, Any]] = {}
        self.async_unshards = 0
        self.graph_dirty = False
        self._local = threading.local()
        session.probe_extra["hyper_parallel"] = {"edges": self.edge_extra, "units": self.units}

    # -- prefetch sources -------------------------------------------------------------
    def sources(self) -> list[tuple[str, Any]]:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def name_of(self, scheduler: Any) -> str:
        return self.names.get(id(scheduler), UNKNOWN_NAME)

    def name_of_cell(self, cell: Any) -> str:
        return self.name_of(getattr(cell, "hsdp_scheduler", None))

    @contextlib.contextmanager
    def running_hook(self, scheduler: Any, phase: str) -> Iterator[None]:
        """Around a scheduler's prefetching pre-hook: it is the source of prefetches inside."""
        if id(scheduler) not in self.names and phase == "fwd":
            self.discover(scheduler)  # the first forward pre-hook to run is the root's
        self.tally_masked(scheduler, phase)
        sources = self.sources()
        sources.append((phase, scheduler))
        try:
            yield
        finally:
            sources.pop()

    # -- discovery --------------------------------------------------------------------
    def discover(self, root_scheduler: Any) -> None:
        """Name every wrapped module under the root, filter their lists, instrument their states."""
        root = scheduler_modules(root_scheduler)[0]
        found: dict[int, tuple[Any, list[str]]] = {}
        for fqn, module in named_submodules(root):
            scheduler = getattr(module, "hsdp_scheduler", None)
            if scheduler is None or id(scheduler) in self.names:
                continue
            entry = found.setdefault(id(scheduler), (scheduler, []))
            entry[1].append(fqn or ROOT_NAME)
        for scheduler, fqns in found.values():
            self.names[id(scheduler)] = "+".join(fqns)
            self.schedulers.append(scheduler)
        for scheduler, _ in found.values():
            self.instrument_state(scheduler)
            for setter, (phase, attr) in LIST_SETTERS.items():
                cells = self.originals.get((id(scheduler), phase))
                if cells is None:
                    cells = list(getattr(scheduler, attr, None) or [])
                getattr(scheduler, setter)(cells)  # the patched setter filters now
        self.check_plan_agreement(root)
        self.write_graph()

    def instrument_state(self, scheduler: Any) -> None:
        state = getattr(scheduler, "hsdp_state", None)
        if state is None or id(state) in self.state_owner:
            return
        self.state_owner[id(state)] = scheduler
        params = state_params(state)
        size = state_shard_size(state)
        self.units[self.name_of(scheduler)] = {
            "shard_size": size,
            "size_one": size == 1,
            "params": len(params),
            "params_with_shard_size": sum(hasattr(p, "shard_size") for p in params),
        }
        for unsharder in [*params, getattr(state, "param_group", None)]:
            if unsharder is not None and hasattr(unsharder, "unshard"):
                unsharder.unshard = self._counting_unshard(unsharder.unshard)
        state.prefetch = self._routed_prefetch(state, state.prefetch)

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
        if hashes is None:
            return
        self.session.probe_extra["plan_hashes"] = hashes
        if len(set(hashes)) > 1:
            self.session.note_error(f"ranks run with different plans: {hashes}")
            self.session.write_probe()
            raise RuntimeError(f"bisect-prefetch: ranks run with different plans: {hashes}")

    # -- prefetch lists ---------------------------------------------------------------
    def enabled_cells(self, scheduler: Any, phase: str, cells: Any) -> Any:
        """Keep ``cells`` as the original list; return what the scheduler should get."""
        self.originals[(id(scheduler), phase)] = list(cells)
        if id(scheduler) not in self.names:
            return cells  # names come at the first root forward; filtered then
        src = self.name_of(scheduler)
        for cell in cells:
            self.add_edge(phase, src, self.name_of_cell(cell))
        plan = self.session.plan
        if plan is None or plan.mask is None:
            return cells
        kept = [c for c in cells if plan.allows(self.edge_id(phase, scheduler, c))]
        return type(cells)(kept) if isinstance(cells, tuple) else kept

    def tally_masked(self, scheduler: Any, phase: str) -> None:
        """Count, as masked, each original target the scheduler no longer has."""
        plan = self.session.plan
        if plan is None or plan.mask is None:
            return
        for cell in self.originals.get((id(scheduler), phase), ()):
            edge_id = self.edge_id(phase, scheduler, cell)
            if not plan.allows(edge_id):
                self.session.prefetch(
                    edge_id,
                    target_shard_size=self.units.get(self.name_of_cell(cell), {}).get(
                        "shard_size", 1
                    ),
                    target_module=cell,
                    run=_never_runs,
                )

    def edge_id(self, phase: str, scheduler: Any, cell: Any) -> str:
        return f"{phase}:{self.name_of(scheduler)}->{self.name_of_cell(cell)}"

    def add_edge(self, phase: str, src: str, dst: str) -> str:
        edge_id = f"{phase}:{src}->{dst}"
        if edge_id not in self.edges:
            self.edges[edge_id] = {
                "id": edge_id, "phase": phase, "src": src, "dst": dst, "implicit": False,
            }
            self.edge_extra[edge_id] = {"async_unshards": 0, "already_unsharded": 0}
            self.graph_dirty = True
        return edge_id

    # -- the prefetch gate ------------------------------------------------------------
    def prefetch(self, state: Any, original: Any, args: tuple, kwargs: dict) -> Any:
        sources = self.sources()
        target = self.state_owner[id(state)]
        size = state_shard_size(state)
        if not sources:
            # Not from a scheduler hook (a user's unshard(async_op=True)): no edge; the guard holds.
            plan = self.session.plan
            if plan is not None and plan.guard == "size-one" and size == 1:
                return None
            return original(*args, **kwargs)
        phase, source = sources[-1]
        edge_id = self.add_edge(phase, self.name_of(source), self.name_of(target))
        extra = self.edge_extra[edge_id]
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
            edge_id,
            target_shard_size=size,
            target_module=scheduler_modules(target)[0],
            run=run,
        )
        return result

    # -- graph, steps and exit --------------------------------------------------------
    def graph(self) -> dict[str, Any]:
        names = [self.name_of(s) for s in self.schedulers]
        layers = [i for i, n in enumerate(names) if is_layer(n)]
        first_layer = min(layers, default=None)
        nodes = [
            {
                "name": name,
                "kind": node_kind(name, order, names, first_layer),
                "order": order,
                "shard_size": self.units.get(name, {}).get("shard_size"),
            }
            for order, name in enumerate(names)
        ]
        return {"nodes": nodes, "edges": list(self.edges.values())}

    def write_graph(self) -> None:
        self.graph_dirty = False
        recorder = self.session.recorder
        if recorder is not None and self.session.plan.record_graph:
            recorder.graph(self.graph())

    def on_step_end(self, step: int) -> None:
        if self.graph_dirty:
            self.write_graph()

    def on_exit(self) -> None:
        if self.graph_dirty:
            self.write_graph()


def _never_runs() -> bool:
    raise AssertionError("a masked prefetch must not run")


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
        return original(self, adapter.enabled_cells(self, phase, hsdp_cell_list))

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


def activate(session: Any) -> None:
    """Hook hyper-parallel (and its test double) for this session; idempotent."""
    global _adapter
    if _adapter is None:
        _adapter = HyperParallelAdapter(session)
        session.add_step_end_listener(_adapter.on_step_end)
        session.add_exit_listener(_adapter.on_exit)
    from .import_hook import when_imported

    for name in SCHEDULER_MODULES:
        when_imported(name, _patch_module)


def adapter() -> HyperParallelAdapter | None:
    """The active adapter, or None."""
    return _adapter

