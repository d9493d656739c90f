"""A TEST DOUBLE of hyper-parallel's interface, on real MindSpore, in one mode per lineage.

This is not an FSDP for anyone's training. It exists so the hyper-parallel adapter can be
tested on this machine, where hyper-parallel is not on the package index. Each mode keeps
the attributes the adapter touches and the call sequence of hyper-parallel's public source
(mindspore-ai/hyper-parallel, commit fdd0a80 of 2026-03-05; file:line below), written
anew (no code of it is copied):

``lineage="fully_shard"`` (``fully_shard``: the newer lineage, core/fully_shard, which
MindSporeHSDPStateV2 and TorchHSDPStateV2 build on):

- ``fully_shard(cell, ...)`` gives the cell an ``hsdp_scheduler`` holding
  ``forward_prefetch_cells`` / ``backward_prefetch_cells`` and their setters
  (core/fully_shard/hsdp_scheduler.py:184), and an ``hsdp_state``.
- The state has ``hsdp_params`` / ``sharded_hsdp_params``, ``unshard(async_op)`` (it
  unshards each of ``sharded_hsdp_params``, then waits unless async:
  core/fully_shard/hsdp_state.py:123), ``wait_for_unshard()`` (:139), ``shard()`` and
  ``prefetch()`` = ``unshard(async_op=True)`` (:135): no guard of its own.
- Each parameter has ``sharded_param``, ``shard_world_size`` (the shard mesh's size,
  platform/torch/fully_shard/param.py:529) and ``is_sharded`` (the source sets it False
  only below its threshold, :246; the double, which has no threshold, at shard size 1:
  either way the size read is 1); its ``unshard(async_op)``
  is a no-op while a prefetch handle is pending (:660). With shard size 1 there is no
  collective: ``_get_unsharded_param_data`` copies the local shard at once and returns no
  handle (:645), so the cell's own unshard copies again (the reported bug). With shard
  size > 1 it runs a real AllGather; CPU collectives are synchronous, so the handle it
  returns is already complete.
- Forward and backward pre-hooks unshard the cell and prefetch its lists
  (core/fully_shard/hsdp_scheduler.py:129, :159; the backward one unshards only when
  ``reshard_after_forward`` is on, :162).
- ``shard_size_source="shard_size"`` adds a ``shard_size`` attribute to each parameter
  (what the older lineage's parameters carry), for the audit's refactor-pitfall checks;
  ``build_guard="shard-size"`` is an upstream fix as written against it (it skips a
  prefetch when no parameter has ``shard_size > 1``).

``lineage="hsdp"`` (the older lineage: ``hyper_parallel.hsdp(cell, shard_size,
threshold, ...)``, core/hsdp/api.py:162, MindSpore's platform/mindspore/hsdp):

- ``hsdp(cell, shard_size=..., threshold=...)`` gives the cell an ``hsdp_scheduler``
  (core/hsdp/api.py:49) with the same lists and setters (core/hsdp/hsdp_scheduler.py:168);
  it sets ``no_param_sharded = shard_size == 1`` (:47) and then registers no forward or
  backward hooks at all (:90): with shard size 1 nothing prefetches.
- Each parameter keeps the cell's own Parameter as ``param`` (core/hsdp/hsdp_param.py:28);
  ``sharded_param`` stays None (:33) unless the parameter is sharded; its ``shard_size``
  is the group's, 1 below the threshold (``_init_param_shard_size``), and ``sharded`` is
  False at size 1 (:248). ``prefetch_unsharded()`` starts an async all-gather unless a
  handle is pending (:282); ``to_unsharded()`` waits for it or gathers (:291).
- The state lists only sharded parameters in ``sharded_hsdp_params``
  (platform/mindspore/hsdp/state.py:38); its ``prefetch()`` returns when the state is
  unsharded and otherwise calls ``prefetch_unsharded()`` on each of them
  (core/hsdp/hsdp_state.py:124): a prefetch into a unit of shard size 1 does nothing, by
  construction (no guard is involved). ``unshard()`` takes no ``async_op`` (:111).
- The gradient is left on ``param.grad`` as the grad-buffer hook does
  (platform/mindspore/hsdp/scheduler.py:192).

What is simplified in both: the cell always computes with its own full-size Parameter
(unshard writes the gathered value into it; reshard does not free memory), the optimizer
updates a separate shard Parameter (``sharded_param``; the older lineage's size-one
parameters: ``param`` itself), there are no replicate parameters, no mixed precision, no
comm fusion, and gradients are reduced by ``shard_gradients`` after backward (AllReduce +
own chunk: MindSpore's CPU backend has no ReduceScatter).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from mindspore import Parameter, Tensor, nn, ops

from bisect_prefetch.workloads.hsdp_double_states import (
    BUILD_GUARDS,
    HSDPStateDouble,
    HSDPStateV1Double,
)

LINEAGES = ("fully_shard", "hsdp")
SHARD_SIZE_SOURCES = ("shard_size", "shard_world_size")


class CompletedHandle:
    """Async handle of a collective that already finished (CPU collectives are synchronous)."""

    def wait(self) -> None:
        return None


class HSDPParamDouble:
    """One parameter under the double: a local shard plus the full Parameter the cell uses."""

    def __init__(
        self,
        param: Parameter,
        *,
        shard_world_size: int,
        shard_rank: int,
        shard_size_source: str = "shard_size",
    ) -> None:
        if shard_size_source not in SHARD_SIZE_SOURCES:
            raise ValueError(f"shard_size_source must be one of {SHARD_SIZE_SOURCES}")
        if param.shape[0] % shard_world_size:
            raise ValueError(
                f"{param.name}: dim 0 ({param.shape[0]}) not divisible by {shard_world_size}"
            )
        self.unsharded_param = param
        self.shard_world_size = shard_world_size
        self.shard_rank = shard_rank
        self.is_sharded = shard_world_size > 1
        self._shard_size_source = shard_size_source
        chunk = ops.chunk(param.value(), shard_world_size, 0)[shard_rank]
        self.sharded_param = Parameter(chunk.copy(), name=f"{param.name}.shard")
        self.prefetch_handle: CompletedHandle | None = None
        self.all_gather_output: Tensor | None = None
        self._init_group_infos()

    # The double's own helpers (not the interface): which Parameter the cell computes
    # with, which the optimizer updates, and where the reduced gradient is left.
    @property
    def cell_param(self) -> Parameter:
        return self.unsharded_param

    @property
    def trained_param(self) -> Parameter:
        return self.sharded_param

    def leave_gradient(self, grad: Tensor) -> None:
        self.sharded_param.grad = grad  # where the post-backward leaves it

    @property
    def gathers(self) -> bool:
        """Whether unsharding is a real collective (else a local copy)."""
        return self.is_sharded

    def own_shard(self, grad: Tensor) -> Tensor:
        return ops.chunk(grad, self.shard_world_size, 0)[self.shard_rank] if self.is_sharded else grad

    def _init_group_infos(self) -> None:
        # The older line records the FSDP shard group's size here; the later refactor does not.
        if self._shard_size_source == "shard_size":
            self.shard_size = self.shard_world_size

    def unshard(self, async_op: bool = False) -> None:
        if self.prefetch_handle is not None:
            return  # a prefetch already started this parameter's all-gather
        self.prefetch_handle = self._get_unsharded_param_data(async_op)

    def _get_unsharded_param_data(self, async_op: bool) -> CompletedHandle | None:
        local = self.sharded_param.value()
        if not self.is_sharded:
            # Shard group of size 1: no collective, a local copy, and no handle.
            self.all_gather_output = local.copy()
            return None
        self.all_gather_output = ops.AllGather()(local)
        return CompletedHandle() if async_op else None

    def wait_for_unshard(self) -> None:
        if self.prefetch_handle is not None:
            self.prefetch_handle.wait()
            self.prefetch_handle = None
        self.unsharded_param.set_data(self.all_gather_output)

    def to_sharded(self) -> None:
        """Nothing to do: the double keeps the full buffer (the state's is_shard says sharded)."""


class HSDPSchedulerDouble:
    """Per wrapped cell: the prefetch lists and the hooks that unshard and prefetch."""

    def __init__(self, cell: nn.Cell, state: HSDPStateDouble) -> None:
        self.cell = cell
        self.hsdp_state = state
        self.forward_prefetch_cells: list[nn.Cell] = []
        self.backward_prefetch_cells: list[nn.Cell] = []
        self.reshard_after_forward = True
        self.root_module: nn.Cell | None = None
        self._register_hooks()

    def _register_hooks(self) -> None:
        # As in hyper-parallel, the registered hooks look the _hsdp_* methods up at call time.
        self.cell.register_forward_pre_hook(self._forward_pre_hook)
        self.cell.register_forward_hook(self._forward_hook)
        self.cell.register_backward_pre_hook(self._backward_pre_hook)
        self.cell.register_backward_hook(self._backward_hook)

    def _forward_pre_hook(self, cell, args):
        self._hsdp_forward_pre_hook(cell, args)

    def _forward_hook(self, cell, inputs, outputs):
        self._hsdp_forward_hook(cell, inputs, outputs)

    def _backward_pre_hook(self, cell, grad_outputs):
        self._hsdp_backward_pre_hook(cell, grad_outputs)

    def _backward_hook(self, cell, grad_inputs, grad_outputs):
        self._hsdp_backward_hook(cell, grad_inputs, grad_outputs)

    def set_forward_prefetch_cells(self, hsdp_cell_list: list[nn.Cell]) -> None:
        self.forward_prefetch_cells = hsdp_cell_list

    def set_backward_prefetch_cells(self, hsdp_cell_list: list[nn.Cell]) -> None:
        self.backward_prefetch_cells = hsdp_cell_list

    def _name_states_from_root(self) -> None:
        # As hyper-parallel does: the first cell to run forward is the root; it names every state.
        self.root_module = self.cell
        for name, sub in self.cell.cells_and_names():
            scheduler = getattr(sub, "hsdp_scheduler", None)
            if scheduler is not None:
                scheduler.root_module = self.cell
                scheduler.hsdp_state.module_name = name

    def _hsdp_forward_pre_hook(self, cell, args):
        if self.root_module is None:
            self._name_states_from_root()
        self.hsdp_state.unshard()
        for prefetch_cell in self.forward_prefetch_cells:
            prefetch_cell.hsdp_scheduler.hsdp_state.prefetch()

    def _hsdp_forward_hook(self, cell, inputs, outputs):
        if self.reshard_after_forward:
            self.hsdp_state.shard()

    def _hsdp_backward_pre_hook(self, cell, grad_outputs):
        if self.reshard_after_forward:
            self.hsdp_state.unshard(unshard_replicate=False)
        for prefetch_cell in self.backward_prefetch_cells:
            prefetch_cell.hsdp_scheduler.hsdp_state.prefetch(unshard_replicate=False)

    def _hsdp_backward_hook(self, cell, grad_inputs, grad_outputs):
        self.hsdp_state.shard()


# -- the older lineage (hyper_parallel.hsdp) -------------------------------------------
class HSDPParamV1Double:
    """One parameter under the older lineage: ``param`` is the cell's own Parameter."""

    def __init__(self, param: Parameter, *, shard_size: int, shard_rank: int) -> None:
        if param.shape[0] % shard_size:
            raise ValueError(f"{param.name}: dim 0 ({param.shape[0]}) not divisible by {shard_size}")
        self.param = param
        self.shard_size = shard_size
        self.shard_rank = shard_rank
        self.sharded = shard_size > 1
        self.sharded_param: Parameter | None = None
        self.prefetch_handle: CompletedHandle | None = None
        self.prefetch_data: Tensor | None = None
        if self.sharded:
            chunk = ops.chunk(param.value(), shard_size, 0)[shard_rank]
            self.sharded_param = Parameter(chunk.copy(), name=f"sharded_{param.name}")

    # The double's own helpers, as on HSDPParamDouble.
    @property
    def cell_param(self) -> Parameter:
        return self.param

    @property
    def trained_param(self) -> Parameter:
        return self.sharded_param if self.sharded else self.param

    def leave_gradient(self, grad: Tensor) -> None:
        self.param.grad = grad  # as the older grad-buffer hook does

    @property
    def gathers(self) -> bool:
        return self.sharded

    def own_shard(self, grad: Tensor) -> Tensor:
        return ops.chunk(grad, self.shard_size, 0)[self.shard_rank] if self.sharded else grad

    def _get_unsharded_param_data(self, async_op: bool) -> tuple[Tensor, CompletedHandle | None]:
        return ops.AllGather()(self.sharded_param.value()), CompletedHandle() if async_op else None

    def prefetch_unsharded(self) -> None:
        if self.prefetch_handle is not None:
            return
        self.prefetch_data, self.prefetch_handle = self._get_unsharded_param_data(True)

    def to_unsharded(self) -> None:
        if self.prefetch_handle is not None:
            self.prefetch_handle.wait()
            self.param.set_data(self.prefetch_data)
            self.prefetch_handle = self.prefetch_data = None
            return
        data, _ = self._get_unsharded_param_data(False)
        self.param.set_data(data)

    def to_sharded(self) -> None:
        """Nothing to do: the double keeps the full buffer (the state's is_shard says sharded)."""


class HSDPSchedulerV1Double(HSDPSchedulerDouble):
    """The older scheduler: no prefetching hooks at all when the shard size is 1."""

    def __init__(self, cell: nn.Cell, state: HSDPStateV1Double, *, shard_size: int) -> None:
        self.no_param_sharded = shard_size == 1
        super().__init__(cell, state)

    def _register_hooks(self) -> None:
        if self.no_param_sharded:
            return
        super()._register_hooks()

    def _hsdp_forward_pre_hook(self, cell, args):
        self.hsdp_state.unshard()
        for prefetch_cell in self.forward_prefetch_cells:
            prefetch_cell.hsdp_scheduler.hsdp_state.prefetch()

    def _hsdp_backward_pre_hook(self, cell, grad_outputs):
        self.hsdp_state.unshard()
        for prefetch_cell in self.backward_prefetch_cells:
            prefetch_cell.hsdp_scheduler.hsdp_state.prefetch()


def hsdp(cell: nn.Cell, *, shard_size: int, shard_rank: int, threshold: int = 0) -> nn.Cell:
    """The older lineage's entry: shard the parameters no inner wrapped cell owns; a
    parameter under ``threshold`` bytes keeps shard size 1. Wrap inner cells first."""
    params = []
    for _, param in cell.parameters_and_names():
        if getattr(param, "has_hsdp_param", False):
            continue
        param.has_hsdp_param = True
        size = shard_size if param.value().nbytes >= threshold else 1
        params.append(HSDPParamV1Double(param, shard_size=size, shard_rank=shard_rank))
    cell.hsdp_scheduler = HSDPSchedulerV1Double(cell, HSDPStateV1Double(params),
                                                shard_size=shard_size)
    return cell


def fully_shard(
    cell: nn.Cell,
    *,
    shard_world_size: int,
    shard_rank: int,
    shard_size_source: str = "shard_size",
    build_guard: str = "none",
) -> nn.Cell:
    """Wrap ``cell``: shard the parameters no inner wrapped cell already owns. Wrap inner cells first."""
    params = []
    for _, param in cell.parameters_and_names():
        if getattr(param, "_hsdp_double_managed", False):
            continue
        param._hsdp_double_managed = True
        params.append(
            HSDPParamDouble(
                param,
                shard_world_size=shard_world_size,
                shard_rank=shard_rank,
                shard_size_source=shard_size_source,
            )
        )
    state = HSDPStateDouble(params, build_guard=build_guard)
    cell.hsdp_scheduler = HSDPSchedulerDouble(cell, state)
    return cell


def set_modules_to_forward_prefetch(cell: nn.Cell, modules: Sequence[nn.Cell]) -> None:
    """What MindFormers calls: forwards to the scheduler's setter."""
    cell.hsdp_scheduler.set_forward_prefetch_cells(list(modules))


def set_modules_to_backward_prefetch(cell: nn.Cell, modules: Sequence[nn.Cell]) -> None:
    """What MindFormers calls: forwards to the scheduler's setter."""
    cell.hsdp_scheduler.set_backward_prefetch_cells(list(modules))


def wrapped_params(root: nn.Cell) -> Iterable[HSDPParamDouble | HSDPParamV1Double]:
    """Every wrapped parameter under ``root``, in cells_and_names order."""
    for _, sub in root.cells_and_names():
        scheduler = getattr(sub, "hsdp_scheduler", None)
        if scheduler is not None:
            yield from scheduler.hsdp_state.hsdp_params


def shard_gradients(
    params: Sequence[HSDPParamDouble | HSDPParamV1Double], grads: Sequence[Tensor], *,
    world_size: int
) -> list[Tensor]:
    """Full gradients -> this rank's shard gradients, averaged over the shard group.

    Stands in for hyper-parallel's post-backward reduce-scatter: MindSpore's CPU
    backend has AllReduce but no ReduceScatter, so reduce, then keep our chunk.
    """
    all_reduce = ops.AllReduce(ops.ReduceOp.SUM) if world_size > 1 else None
    sharded = []
    for param, grad in zip(params, grads, strict=True):
        if all_reduce is not None:
            grad = all_reduce(grad) / world_size
        sharded.append(param.own_shard(grad))
    return sharded


__all__ = [
    "BUILD_GUARDS",
    "SHARD_SIZE_SOURCES",
    "CompletedHandle",
    "LINEAGES",
    "HSDPParamDouble",
    "HSDPParamV1Double",
    "HSDPSchedulerDouble",
    "HSDPSchedulerV1Double",
    "HSDPStateDouble",
    "HSDPStateV1Double",
    "fully_shard",
    "hsdp",
    "set_modules_to_backward_prefetch",
    "set_modules_to_forward_prefetch",
    "shard_gradients",
    "wrapped_params",
]
