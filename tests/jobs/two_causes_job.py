"""A user's own FSDP2 training script with two independent causes of drift, each enough alone:
it imports nothing of bisect-prefetch and calls nothing of it.

Launched with torchrun (2 ranks, gloo, CPU). Eight small MLP layers (``--layers``) and a head,
each layer and the root sharded with ``fully_shard``; AdamW. FSDP2's implicit backward chain
prefetches layer K from layer K+1 (the root prefetches the last layer), so there are eight
backward edges. It runs on torch 2.8 and later (tests/e2e/test_torch_versions.py).

``--fault-targets layers.4,layers.1 --fault-hazard H`` (the defaults) plants the script's own
drift on the backward prefetch into each of those layers, independently: the script wraps
FSDP2's ``FSDPParamGroup._prefetch_unshard``, and each time a backward prefetch into a target
layer really starts an all-gather, with chance H (OS entropy, not the seed) it nudges one
element of that layer's local shard by one ulp. Either edge alone makes runs drift; with both
off the script is deterministic. Rank 0 prints torchtitan-style lines:
``step:  3  loss:  4.1234  grad_norm:  0.5678``.
"""

from __future__ import annotations

import argparse
import math
import random

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
from torch.distributed.tensor import DTensor

DIM, VOCAB = 16, 32


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(DIM, 2 * DIM)
        self.down = nn.Linear(2 * DIM, DIM)

    def forward(self, x):
        return x + self.down(torch.tanh(self.up(x)))


class Model(nn.Module):
    def __init__(self, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Layer() for _ in range(layers))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def plant_faults(model: Model, targets: list[str], hazard: float) -> None:
    """The script's own drift on the backward prefetch into each target layer (see above)."""
    modules = [model.layers[int(name.rsplit(".", 1)[1])] for name in targets]
    groups = {id(m._get_fsdp_state()._fsdp_param_group): m for m in modules}
    entropy = random.SystemRandom()
    original = FSDPParamGroup._prefetch_unshard

    def prefetch(group, pass_type):
        before = group.is_unsharded or group._all_gather_result is not None
        original(group, pass_type)
        after = group.is_unsharded or group._all_gather_result is not None
        target = groups.get(id(group))
        # Only a prefetch that really started an all-gather can go wrong.
        if target is not None and pass_type == "backward" and not before and after and (
                entropy.random() < hazard):
            with torch.no_grad():
                shard = target.up.weight.to_local().view(-1)
                if shard.numel():
                    k = entropy.randrange(shard.numel())
                    shard[k] = torch.nextafter(shard[k], torch.tensor(math.inf))

    FSDPParamGroup._prefetch_unshard = staticmethod(prefetch)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fault-targets", default="layers.4,layers.1")
    parser.add_argument("--fault-hazard", type=float, default=0.25)
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    model = Model(args.layers)
    mesh = init_device_mesh("cpu", (world,))
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    targets = [t for t in args.fault_targets.split(",") if t]
    if targets:
        plant_faults(model, targets, args.fault_hazard)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(args.seed)
    data = torch.randint(VOCAB, (4, 4 * world, 9), generator=generator)
    for step in range(1, args.steps + 1):
        batch = data[step % 4][rank * 4:(rank + 1) * 4]
        logits = model(batch[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if isinstance(grad_norm, DTensor):
            grad_norm = grad_norm.full_tensor()
        optimizer.step()
        optimizer.zero_grad()
        if rank == 0:
            print(f"step: {step:2d}  loss: {loss.item():7.4f}  grad_norm: {grad_norm.item():7.4f}",
                  flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
