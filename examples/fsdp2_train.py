"""An example of a user's own FSDP2 training script: it imports nothing of bisect-prefetch and
calls nothing (configs/own-job-fsdp2.yaml runs it; so do the zero-touch tests).

Launched with torchrun (1-4 ranks, gloo, CPU). Six pre-norm MLP layers and a head, each
layer and the root sharded with ``fully_shard``; AdamW; gradient accumulation over
``--accumulate`` micro-batches (default 2) per optimizer step. Rank 0 prints torchtitan-style
lines, the loss and grad norm at 4 decimals: ``step:  3  loss:  4.1234  grad_norm:  0.5678``.

Its own knobs, none of which the tool is told about:

- ``--fault-target layers.K --fault-hazard H``: a drift of its own on the backward prefetch
  into layer K (FSDP2's implicit chain: layers.K+1 prefetches it). The script wraps FSDP2's
  ``FSDPParamGroup._prefetch_unshard``; each time a backward prefetch into layer K really
  starts an all-gather, with chance H (OS entropy, not the seed) it nudges one element of
  layer K's local shard by one ulp, as a prefetch that wrote into the wrong buffer would.
- ``--mistarget``: layers.0 also prefetches layers.5 in backward, whose backward already
  ran: a prefetch nobody consumes.
- ``--depth2``: each layer prefetches the two layers before it in backward, so i->i-1 finds
  its target already prefetched by i+1 (shadowed).
- ``--adam-per-group``: two optimizers (layers, the rest), both stepped every iteration.
- ``--manual-update``: no torch.optim at all (a hand-written SGD update).
- ``--shard-ends``: embedding and head are sharded on their own too, as torchtitan does, so
  the root holds no parameters of its own.
- ``--skip-step-on-rank1 N``: rank 1 skips its optimizer step at step N (bad input: the
  ranks then step different numbers of times).
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

LAYERS, DIM, VOCAB = 6, 32, 48


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.up = nn.Linear(DIM, 2 * DIM)
        self.down = nn.Linear(2 * DIM, DIM)

    def forward(self, x):
        return x + self.down(torch.tanh(self.up(self.norm(x))))


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
    target_module = model.layers[int(target.rsplit(".", 1)[1])]
    entropy = random.SystemRandom()
    original = FSDPParamGroup._prefetch_unshard

    def prefetch(group, pass_type):
        before = group.is_unsharded or group._all_gather_result is not None
        original(group, pass_type)
        after = group.is_unsharded or group._all_gather_result is not None
        ours = group is target_module._get_fsdp_state()._fsdp_param_group
        if ours and pass_type == "backward" and not before and after and (
                entropy.random() < hazard):
            with torch.no_grad():
                shard = target_module.up.weight.to_local().view(-1)
                if shard.numel():
                    k = entropy.randrange(shard.numel())
                    shard[k] = torch.nextafter(shard[k], torch.tensor(math.inf))

    FSDPParamGroup._prefetch_unshard = staticmethod(prefetch)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--accumulate", type=int, default=2)
    parser.add_argument("--fault-target", default=None)
    parser.add_argument("--fault-hazard", type=float, default=0.3)
    parser.add_argument("--mistarget", action="store_true")
    parser.add_argument("--depth2", action="store_true")
    parser.add_argument("--adam-per-group", action="store_true")
    parser.add_argument("--manual-update", action="store_true")
    parser.add_argument("--skip-step-on-rank1", type=int, default=None)
    parser.add_argument("--shard-ends", action="store_true")
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    model = Model()
    mesh = init_device_mesh("cpu", (world,))
    if args.shard_ends:
        fully_shard(model.embed, mesh=mesh)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    if args.shard_ends:
        fully_shard(model.head, mesh=mesh)
    fully_shard(model, mesh=mesh)  # last: with --shard-ends it holds no parameters
    layers = list(model.layers)
    if args.depth2 or args.mistarget:
        for i, layer in enumerate(layers):
            targets = [layers[j] for j in (i - 1, i - 2) if j >= 0] if args.depth2 else (
                [layers[i - 1]] if i else [])
            if args.mistarget and i == 0:
                targets = targets + [layers[5]]
            if targets:
                layer.set_modules_to_backward_prefetch(targets)
    if args.fault_target:
        plant_fault(model, args.fault_target, args.fault_hazard)

    if args.manual_update:
        optimizers = []
    elif args.adam_per_group:
        layer_params = [p for layer in layers for p in layer.parameters()]
        ids = {id(p) for p in layer_params}
        optimizers = [torch.optim.AdamW(layer_params, lr=1e-2),
                      torch.optim.AdamW([p for p in model.parameters() if id(p) not in ids],
                                        lr=1e-2)]
    else:
        optimizers = [torch.optim.AdamW(model.parameters(), lr=1e-2)]

    generator = torch.Generator().manual_seed(args.seed)
    data = torch.randint(VOCAB, (4, 8 * world, 17), generator=generator)
    for step in range(1, args.steps + 1):
        for micro in range(args.accumulate):
            batch = data[(step + micro) % 4][rank * 8:(rank + 1) * 8]
            logits = model(batch[:, :-1])
            loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
            (loss / args.accumulate).backward()
        grad_norm = nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if isinstance(grad_norm, DTensor):
            grad_norm = grad_norm.full_tensor()
        if args.manual_update:
            with torch.no_grad():
                for p in model.parameters():
                    if p.grad is not None:
                        p -= 1e-2 * p.grad
                        p.grad = None
        skip = rank == 1 and step == args.skip_step_on_rank1
        for optimizer in optimizers:
            if not skip:
                optimizer.step()
            optimizer.zero_grad()
        if rank == 0:
            print(f"step: {step:2d}  loss: {loss.item():7.4f}  grad_norm: {grad_norm.item():7.4f}",
                  flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
