"""The torch mode of hyper-parallel's TEST DOUBLE (workloads/hsdp_double.py has the
MindSpore modes): the newer ``fully_shard`` lineage on torch, over gloo on CPU.

Not an FSDP for anyone's training: it lets the adapter's torch path be tested where
hyper-parallel is not installable. It keeps the attributes the adapter touches and the
call sequence of hyper-parallel's torch backend (mindspore-ai/hyper-parallel, commit
fdd0a80 of 2026-03-05; file:line below), written anew (no code of it is copied):

- ``fully_shard(module, ...)`` gives the module an ``hsdp_scheduler``
  (core/fully_shard/api.py:64) with ``forward_prefetch_cells`` /
  ``backward_prefetch_cells``, their setters (core/fully_shard/hsdp_scheduler.py:184) and
  ``reshard_after_forward`` (:39).
- Its hooks, as TorchHSDPSchedulerV2 registers them
  (platform/torch/fully_shard/scheduler.py:126): a forward pre-hook with kwargs that
  calls ``_hsdp_forward_pre_hook(cell, args, kwargs)`` (:79), which unshards the state and
  prefetches the forward list (core/fully_shard/hsdp_scheduler.py:129); a forward hook
  that hooks the output's gradient (:82) and calls ``_hsdp_forward_hook``, which reshards
  only with ``reshard_after_forward`` on (core/fully_shard/hsdp_scheduler.py:149); the
  output's gradient hook calls ``_hsdp_backward_pre_hook(cell, None)`` (scheduler.py:110),
  which unshards again only with ``reshard_after_forward`` on, then prefetches the
  backward list (core/fully_shard/hsdp_scheduler.py:159).
- The state (core/fully_shard/hsdp_state.py; the MindSpore mode's HSDPStateDouble,
  workloads/hsdp_double_states.py): ``hsdp_params``, ``sharded_hsdp_params``
  (the ``is_sharded`` ones), ``is_shard``, ``unshard(async_op)`` (:123: each sharded
  parameter's ``unshard``, then ``wait_for_unshard`` unless async), ``prefetch()`` =
  ``unshard(async_op=True)`` (:135), ``wait_for_unshard()`` (:139), ``shard()`` (:110).
- Each parameter (platform/torch/fully_shard/param.py): ``sharded_param`` (this rank's
  chunk, an ``nn.Parameter``), ``shard_world_size`` (the shard mesh's size, :529),
  ``is_sharded``, ``prefetch_handle``; ``unshard(async_op)`` is a no-op while a handle is
  pending (:660); ``_get_unsharded_param_data`` (:608) copies the local chunk at once
  when the shard group has size 1 and returns no handle (:645), else starts an
  ``all_gather_into_tensor`` over the shard group; ``wait_for_unshard`` (:668) waits and
  makes the parameter unsharded.

Simplified: the module always computes with its own full-size Parameter (unsharding
writes the gathered value into its ``.data``, reshard frees nothing), there are no
DTensors, no mixed precision and no threshold, and the post-backward is the job's call of
``reduce_gradients``: each gradient averaged over the ranks (all_reduce) and this rank's
chunk left on ``sharded_param.grad`` (where the torch backend's ``apply_reduced_grad``
leaves it, param.py:120). The mesh is (replicate, shard): ``shard_size`` ranks share a
shard group; the others hold replicas.

Run as a workload: ``torchrun --nproc_per_node 2 -m bisect_prefetch.workloads.hsdp_double_torch
--steps 3 --shard-size 2 --reshard-after-forward off``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from bisect_prefetch.workloads.hsdp_double_states import HSDPStateDouble

LINEAGE = "fully_shard"


class HSDPParamTorchDouble:
    """One parameter: this rank's chunk as ``sharded_param``, the module's full Parameter."""

    def __init__(self, module: nn.Module, name: str, *, shard_size: int, shard_rank: int,
                 group: Any) -> None:
        full = getattr(module, name)
        if full.shape[0] % shard_size:
            raise ValueError(f"{name}: dim 0 ({full.shape[0]}) not divisible by {shard_size}")
        self.unsharded_param = full  # what the module computes with
        self._shard_size = shard_size
        self.shard_rank = shard_rank
        self.group = group
        self.is_sharded = True
        chunk = full.detach().chunk(shard_size, 0)[shard_rank].clone()
        self.sharded_param = nn.Parameter(chunk)
        self.prefetch_handle: Any = None
        self.all_gather_output: torch.Tensor | None = None

    @property
    def shard_world_size(self) -> int:
        return self._shard_size

    def _get_unsharded_param_data(self, async_op: bool = False) -> tuple[torch.Tensor, Any]:
        local = self.sharded_param.detach().reshape(-1)
        out = torch.empty(local.numel() * self.shard_world_size, dtype=local.dtype)
        if self.group is None or self.shard_world_size <= 1:
            out.copy_(local)  # a shard group of size 1: a local copy, made now, no handle
            return out, None
        handle = dist.all_gather_into_tensor(out, local, group=self.group, async_op=async_op)
        return out, handle

    def unshard(self, async_op: bool = False) -> None:
        if self.prefetch_handle is not None:
            return  # a prefetch already started this parameter's all-gather
        self.all_gather_output, self.prefetch_handle = self._get_unsharded_param_data(async_op)

    def wait_for_unshard(self) -> None:
        if self.prefetch_handle is not None:
            self.prefetch_handle.wait()
            self.prefetch_handle = None
        if self.all_gather_output is not None:
            # .data: no autograd version bump on a weight backward may have saved.
            self.unsharded_param.data.copy_(self.all_gather_output.view_as(self.unsharded_param))
            self.all_gather_output = None

    def to_sharded(self) -> None:
        """Nothing to do: the double keeps the full buffer (the state's is_shard says sharded)."""


class HSDPSchedulerTorchDouble:
    """Per wrapped module: the prefetch lists and TorchHSDPSchedulerV2's hook sequence."""

    def __init__(self, module: nn.Module, state: HSDPStateDouble, *,
                 reshard_after_forward: bool) -> None:
        self.cell = module
        self.hsdp_state = state
        self.reshard_after_forward = reshard_after_forward
        self.forward_prefetch_cells: list[nn.Module] = []
        self.backward_prefetch_cells: list[nn.Module] = []
        module.register_forward_pre_hook(self._forward_pre_hook, with_kwargs=True)
        module.register_forward_hook(self._forward_hook)

    def _forward_pre_hook(self, cell, args, kwargs):
        return self._hsdp_forward_pre_hook(cell, args, kwargs)

    def _forward_hook(self, cell, inputs, outputs):
        if isinstance(outputs, torch.Tensor) and outputs.requires_grad:
            outputs.register_hook(self._backward_pre_hook)
        self._hsdp_forward_hook(cell, inputs, outputs)
        return outputs

    def _backward_pre_hook(self, grad):
        self._hsdp_backward_pre_hook(self.cell, None)
        return grad

    def _hsdp_forward_pre_hook(self, cell, args, kwargs):
        self.hsdp_state.unshard()
        for prefetch_cell in self.forward_prefetch_cells:
            prefetch_cell.hsdp_scheduler.hsdp_state.prefetch()
        return args, kwargs

    def _hsdp_forward_hook(self, cell, inputs, outputs):
        if self.reshard_after_forward:
            self.hsdp_state.shard()

    def _hsdp_backward_pre_hook(self, cell, grad_outputs):
        if self.reshard_after_forward:
            self.hsdp_state.unshard()
        for prefetch_cell in self.backward_prefetch_cells:
            prefetch_cell.hsdp_scheduler.hsdp_state.prefetch()

    def set_forward_prefetch_cells(self, hsdp_cell_list: list[nn.Module]) -> None:
        self.forward_prefetch_cells = hsdp_cell_list

    def set_backward_prefetch_cells(self, hsdp_cell_list: list[nn.Module]) -> None:
        self.backward_prefetch_cells = hsdp_cell_list


def fully_shard(module: nn.Module, *, shard_size: int, shard_rank: int, group: Any,
                reshard_after_forward: bool) -> nn.Module:
    """Wrap ``module``: shard the parameters no inner wrapped module owns. Inner ones first."""
    params = []
    for owner in module.modules():
        for name, param in list(owner.named_parameters(recurse=False)):
            if getattr(param, "_hsdp_double_managed", False):
                continue
            param._hsdp_double_managed = True
            params.append(HSDPParamTorchDouble(owner, name, shard_size=shard_size,
                                               shard_rank=shard_rank, group=group))
    module.hsdp_scheduler = HSDPSchedulerTorchDouble(
        module, HSDPStateDouble(params), reshard_after_forward=reshard_after_forward)
    return module


def wrapped_params(root: nn.Module) -> list[HSDPParamTorchDouble]:
    return [p for m in root.modules() if hasattr(m, "hsdp_scheduler")
            for p in m.hsdp_scheduler.hsdp_state.hsdp_params]


def reduce_gradients(params: Sequence[HSDPParamTorchDouble], *, world_size: int) -> None:
    """The post-backward: average each full gradient over the ranks, keep this rank's chunk."""
    for param in params:
        grad = param.unsharded_param.grad
        if world_size > 1:
            dist.all_reduce(grad)
            grad /= world_size
        param.sharded_param.grad = grad.chunk(param.shard_world_size, 0)[param.shard_rank].clone()
        param.unsharded_param.grad = None


# -- the workload -----------------------------------------------------------------------
class Model(nn.Module):
    def __init__(self, layers: int, width: int = 8) -> None:
        super().__init__()
        self.embedding = nn.Linear(width, width)
        self.layers = nn.ModuleList([nn.Linear(width, width) for _ in range(layers)])
        self.output_layer = nn.Linear(width, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.embedding(x))
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.output_layer(x)


def train(args: argparse.Namespace) -> None:
    from bisect_prefetch import adapters
    from bisect_prefetch.adapters import hyper_parallel as hyper_parallel_adapter

    session = adapters.install()  # a no-op under the launcher's sitecustomize
    # hyper-parallel activates the adapter by being imported; the double names its module.
    hyper_parallel_adapter.activate(session, modules=(__name__,))
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    shard = args.shard_size
    if world % shard:
        raise SystemExit(f"--shard-size {shard} does not divide the world size {world}")
    group = None  # every rank creates every group, in the same order
    for first in range(0, world, shard):
        ranks = list(range(first, first + shard))
        made = dist.new_group(ranks) if shard > 1 else None
        if rank in ranks:
            group = made
    torch.manual_seed(args.seed)
    model = Model(args.layers)
    units = [model.embedding, *model.layers, model.output_layer, model]
    for unit in units:
        fully_shard(unit, shard_size=shard, shard_rank=rank % shard, group=group,
                    reshard_after_forward=args.reshard_after_forward == "on")
    layers = list(model.layers)
    for before, after in zip([model.embedding, *layers], [*layers, model.output_layer], strict=True):
        before.hsdp_scheduler.set_forward_prefetch_cells([after])
        after.hsdp_scheduler.set_backward_prefetch_cells([before])
    params = wrapped_params(model)
    optimizer = torch.optim.SGD([p.sharded_param for p in params], lr=0.1)
    data = torch.randn(args.steps, 4, 8, generator=torch.Generator().manual_seed(args.seed + rank))
    for step in range(1, args.steps + 1):
        loss = model(data[step - 1]).pow(2).mean()
        loss.backward()
        reduce_gradients(params, world_size=world)
        for unit in units:  # the post-backward reshard
            unit.hsdp_scheduler.hsdp_state.shard()
        optimizer.step()
        optimizer.zero_grad()
        total = loss.detach().clone()
        dist.all_reduce(total)
        if rank == 0:
            print(f"step: {step:2d}  loss: {total.item() / world:7.4f}", flush=True)
    dist.destroy_process_group()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bisect_prefetch.workloads.hsdp_double_torch",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=int(os.environ.get("SEED", "1234")))
    parser.add_argument("--shard-size", type=int, default=2,
                        help="ranks per shard group (1: every unit of shard size 1)")
    parser.add_argument("--reshard-after-forward", choices=("on", "off"), default="off")
    return parser.parse_args(argv)


if __name__ == "__main__":
    train(parse_args())
