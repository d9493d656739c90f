"""A user's own 2-D tensor-parallel x FSDP2 training script with drift on one backward
prefetch into a size-one unit: it imports nothing of bisect-prefetch and calls nothing of it.

Launched with torchrun (2 ranks, gloo, CPU) on a (dp_shard=1, tp=2) mesh: the reported case's
topology in small. Four MLP layers and a head. Each layer's ``up`` is column-parallel and its
``down`` row-parallel over ``tp`` (``parallelize_module``: DTensor weights, the row-parallel
output all-reduced through functional collectives); then each layer and the root are sharded
with ``fully_shard`` over ``dp``, a mesh dimension of size 1, so every FSDP unit has a shard
group of size one: an unshard copies the local shard (in ``wait_for_unshard``) instead of
all-gathering. Both ranks see the same batch (one data-parallel replica). AdamW.

``--fault-target layers.K --fault-hazard H`` (default layers.2, 0.5) plants the script's own
drift on the backward prefetch into layer K (FSDP2's implicit chain: layers.K+1 prefetches it).
The script wraps FSDP2's ``FSDPParamGroup._prefetch_unshard``; each time a backward prefetch
into layer K really starts its unshard, it takes a numpy view of layer K's local ``up`` weight,
and with chance H (OS entropy, not the seed) moves one element of it by one ulp through that
view: a write into the prefetched unit's memory that torch's dispatcher never sees, as a
redundant copy by an extension or another engine would make. With that prefetch off the
script is deterministic. Rank 0 prints torchtitan-style lines:
``step:  3  loss:  4.1234  grad_norm:  0.5678``.
"""

from __future__ import annotations

import argparse
import random

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

LAYERS, DIM, VOCAB = 4, 16, 32


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(DIM, 4 * DIM)
        self.down = nn.Linear(4 * DIM, DIM)

    def forward(self, x):
        return x + self.down(torch.tanh(self.up(x)))


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def plant_fault(model: Model, target: str, hazard: float) -> None:
    """The script's own drift on the backward prefetch into one layer (module docstring)."""
    module = model.layers[int(target.rsplit(".", 1)[1])]
    group = module._get_fsdp_state()._fsdp_param_groups[0]
    entropy = random.SystemRandom()
    original = FSDPParamGroup._prefetch_unshard

    def prefetch(target_group, pass_type):
        before = target_group.is_unsharded or target_group._all_gather_result is not None
        original(target_group, pass_type)
        after = target_group.is_unsharded or target_group._all_gather_result is not None
        # Only a prefetch that really started the unshard can go wrong (a size-one unit's
        # records its result at once; its copy waits for the unit's own use).
        if target_group is group and pass_type == "backward" and not before and after:
            with torch.no_grad():
                local = module.up.weight.to_local().detach()
            memory = local.numpy().reshape(-1)  # the same memory, outside the dispatcher
            if memory.size and entropy.random() < hazard:
                k = entropy.randrange(memory.size)
                memory[k] = np.nextafter(memory[k], np.float32(np.inf))

    FSDPParamGroup._prefetch_unshard = staticmethod(prefetch)


def clip_gradients(model: Model, max_norm: float) -> torch.Tensor:
    """The global gradient norm, gradients scaled to at most ``max_norm`` (the weights live on
    two meshes, tp-sharded and not, which ``clip_grad_norm_`` will not stack)."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    full = [g.full_tensor() if isinstance(g, DTensor) else g for g in grads]
    norm = torch.stack([g.pow(2).sum() for g in full]).sum().sqrt()
    scale = min(1.0, max_norm / (norm.item() + 1e-6))
    with torch.no_grad():
        for g in grads:
            g.mul_(scale)
    return norm


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fault-target", default="layers.2")
    parser.add_argument("--fault-hazard", type=float, default=0.5)
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    torch.manual_seed(args.seed)
    model = Model()
    mesh = init_device_mesh("cpu", (1, world), mesh_dim_names=("dp", "tp"))
    for layer in model.layers:
        parallelize_module(layer, mesh["tp"], {"up": ColwiseParallel(),
                                               "down": RowwiseParallel()})
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    if args.fault_target:
        plant_fault(model, args.fault_target, args.fault_hazard)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(args.seed)
    data = torch.randint(VOCAB, (4, 8, 9), generator=generator)
    for step in range(1, args.steps + 1):
        batch = data[step % 4]  # every rank the same: one data-parallel replica
        logits = model(batch[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        loss.backward()
        grad_norm = clip_gradients(model, 1.0)
        optimizer.step()
        optimizer.zero_grad()
        if dist.get_rank() == 0:
            print(f"step: {step:2d}  loss: {loss.item():7.4f}  grad_norm: {grad_norm.item():7.4f}",
                  flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
