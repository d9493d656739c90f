"""A user's torch job sharded by a hyper-parallel build (tests/jobs/hp_standin) whose
parameters hold no tensor where the adapter looks: it trains a small torch model with SGD
and prints torchtitan-style lines. Imports nothing of ours, calls nothing of ours.

Usage: python hp_tensorless_job.py STEPS
"""

import sys

import torch
from hyper_parallel.core.fully_shard.hsdp_scheduler import HSDPSchedulerV2


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)])

    def forward(self, x):
        return self.layers[1](torch.tanh(self.layers[0](x)))


def main() -> None:
    steps = int(sys.argv[1])
    torch.manual_seed(0)
    root = Model()
    layers = list(root.layers)
    for module in [*layers, root]:
        HSDPSchedulerV2(module)
    layers[0].hsdp_scheduler.set_forward_prefetch_cells([layers[1]])
    layers[1].hsdp_scheduler.set_backward_prefetch_cells([layers[0]])
    optimizer = torch.optim.SGD(root.parameters(), lr=0.1)
    x = torch.randn(4, 8)
    for step in range(1, steps + 1):
        for module in [root, *layers]:
            module.hsdp_scheduler._hsdp_forward_pre_hook(module, ())
        loss = root(x).pow(2).mean()
        layers[1].hsdp_scheduler._hsdp_backward_pre_hook(layers[1], None)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step: {step:2d}  loss: {loss.item():7.4f}  grad_norm: {loss.sqrt().item():7.4f}",
              flush=True)


if __name__ == "__main__":
    main()
