"""A user's own FSDP2 training script whose drift is not prefetch: it imports nothing of
bisect-prefetch and calls nothing of it.

Launched with torchrun (2 ranks, gloo, CPU). Three MLP layers and a head, each layer and the
root sharded with ``fully_shard``; AdamW. From step ``--noise-from`` on (default 3), the forward
of ``layers.1`` adds a little noise drawn from a generator seeded from the clock: every run
draws other numbers there, whatever the prefetch edges do. Rank 0 prints torchtitan-style
lines: ``step:  3  loss:  4.1234  grad_norm:  0.5678``.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

LAYERS, DIM, VOCAB, NOISY = 3, 16, 32, 1


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(DIM, 2 * DIM)
        self.down = nn.Linear(2 * DIM, DIM)
        self.noisy = False  # set by the training loop

    def forward(self, x):
        y = self.down(torch.tanh(self.up(x)))
        if self.noisy:
            clock = torch.Generator().manual_seed(time.time_ns())
            y = y + 1e-4 * torch.randn(y.shape, generator=clock)
        return x + y


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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--noise-from", type=int, default=3)
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    model = Model()
    mesh = init_device_mesh("cpu", (world,))
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(args.seed)
    data = torch.randint(VOCAB, (4, 4 * world, 9), generator=generator)
    for step in range(1, args.steps + 1):
        model.layers[NOISY].noisy = step >= args.noise_from
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
