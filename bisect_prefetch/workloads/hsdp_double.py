"""A TEST DOUBLE of hyper-parallel's ``fully_shard`` interface, on real MindSpore.

This is not an FSDP for anyone's training. It exists so the hyper-parallel
adapter can be tested on this machine, where hyper-parallel is not installable.
It keeps the parts of the interface the adapter touches, with the same names
and the same control flow as hyper-parallel's MindSpore backend:

- ``fully_shard(cell, ...)`` gives the cell an ``hsdp_scheduler`` holding
  ``forward_prefetch_cells`` / ``backward_prefetch_cells``, their setters
  ``set_forward_prefetch_cells`` / ``set_backward_prefetch_cells``, and an
  ``hsdp_state``.
- The state has ``hsdp_params`` / ``sharded_hsdp_params``, ``unshard(async_op)``,
  ``wait_for_unshard()``, ``shard()`` and ``prefetch()`` (= ``unshard(async_op=True)``).
- Each parameter has ``shard_world_size`` and ``is_sharded``; on the older
  line (``shard_size_source="shard_size"``) ``_init_group_infos()`` also sets
  ``shard_size``, which the later refactor dropped.
- Forward and backward pre-hooks unshard the cell and prefetch its lists.
- A parameter's ``unshard`` is a no-op while a prefetch handle is pending. With
  shard size 1 there is no collective: it copies the local buffer and leaves the
  handle None, so the cell's own unshard copies again (the reported bug). With
  shard size > 1 it runs a real AllGather over mindspore.communication; CPU
  collectives are synchronous, so the handle it returns is already complete.

What is simplified: the cell always computes with its own full-size Parameter
(unshard writes the gathered value into it; reshard does not free memory),
there are no replicate parameters, no mixed precision, no comm fusion, and
gradients are reduced by ``shard_gradients`` after backward (AllReduce + own
chunk: MindSpore's CPU backend has no ReduceScatter).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from mindspore import Parameter, Tensor, nn, ops

SHARD_SIZE_SOURCES = ("shard_size", "shard_world_size")
# The build's own prefetch guard: none (the reported bug) or the upstream fix,
# which skips a prefetch when no parameter has `shard_size > 1`.
BUILD_GUARDS = ("none", "shard-size")


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


class HSDPStateDouble:
    """The FSDP state of one wrapped cell: its parameters and their shard/unshard cycle."""

    def __init__(self, params: list[HSDPParamDouble], *, build_guard: str = "none") -> None:
        if build_guard not in BUILD_GUARDS:
            raise ValueError(f"build_guard must be one of {BUILD_GUARDS}")
        self.hsdp_params = params
        self.sharded_hsdp_params = list(params)
        self.build_guard = build_guard
        self.is_shard = True
        self.module_name: str | None = None

    def shard(self) -> None:
        if not self.is_shard:
            for param in self.sharded_hsdp_params:
                param.to_sharded()
            self.is_shard = True

    def unshard(self, async_op: bool = False, unshard_replicate: bool = True) -> None:
        if not self.is_shard:
            return
        for param in self.sharded_hsdp_params:
            param.unshard(async_op)
        if not async_op:
            self.wait_for_unshard()

    def wait_for_unshard(self) -> None:
        if not self.is_shard:
            return
        for param in self.sharded_hsdp_params:
            param.wait_for_unshard()
        self.is_shard = False

    def prefetch(self, unshard_replicate: bool = True) -> None:
        if self.build_guard == "shard-size" and not any(
            getattr(param, "shard_size", 1) > 1 for param in self.sharded_hsdp_params
        ):
            return  # the upstream fix, as written against the older parameter line
        self.unshard(async_op=True, unshard_replicate=unshard_replicate)


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


def wrapped_params(root: nn.Cell) -> Iterable[HSDPParamDouble]:
    """Every HSDPParamDouble under ``root``, in cells_and_names order."""
    for _, sub in root.cells_and_names():
        scheduler = getattr(sub, "hsdp_scheduler", None)
        if scheduler is not None:
            yield from scheduler.hsdp_state.hsdp_params


def shard_gradients(
    params: Sequence[HSDPParamDouble], grads: Sequence[Tensor], *, world_size: int
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
        if param.is_sharded:
            grad = ops.chunk(grad, param.shard_world_size, 0)[param.shard_rank]
        sharded.append(grad)
    return sharded


__all__ = [
    "BUILD_GUARDS",
    "SHARD_SIZE_SOURCES",
    "CompletedHandle",
    "HSDPParamDouble",
    "HSDPSchedulerDouble",
    "HSDPStateDouble",
    "fully_shard",
    "set_modules_to_backward_prefetch",
    "set_modules_to_forward_prefetch",
    "shard_gradients",
    "wrapped_params",
]
