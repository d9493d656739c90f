"""MindSpore reference workload: a small GPT on real MindSpore under hyper-parallel's test double.

Launch with msrun (1 or 2 ranks; msrun runs ``python`` from PATH)::

    msrun --worker_num=2 --local_worker_num=2 --master_port=PORT --join=True \\
        --log_dir=DIR --cluster_time_out=60 \\
        python -m bisect_prefetch.workloads.mindspore --layers 4 --steps 20 --seed 1234

or, for one rank, plainly: ``python -m bisect_prefetch.workloads.mindspore ...``.

Every unit (``embedding``, ``decoder.layers.{i}``, ``decoder.final_layernorm``,
``output_layer``, and the root) is wrapped by the double's ``fully_shard`` with
shard size = world size: on 1 rank every unit is size-one (a local copy per
unshard), on 2 ranks every unit is sharded over 2 (a real AllGather). The
prefetch lists are MindFormers' chain, set through the module-level
``set_modules_to_*_prefetch``. PyNative with ``launch_blocking()`` (faster on
CPU here and bitwise equal), seeded, fixed data: A/A runs are bitwise equal.

Planted drift, FAULT INJECTION for validating the tool (off by default; the
tool passes it through and never reads it). ``--fault-edge E --fault-hazard H``
(or the plan's ``fault``), with ``--fault-mode``:

- ``nudge``: each time edge E's prefetch really runs, with probability H drawn
  from OS entropy (not the seed) one element of the target's local shard moves
  by one ulp, so runs diverge at random steps, like a race does.
- ``size-one-copy``: the reported mechanism: the same, but only when the
  prefetch is the redundant local copy into a size-one unit. The size-one guard
  skips exactly those prefetches, so it removes this drift end to end.

Metrics per step (``report_step`` and a stdout line): ``loss`` (mean over
ranks) and ``grad_norm`` (of the averaged gradient). ``report_step`` writes the
metrics line only: the adapter finds the step boundaries for digests, the order
record and step times in the optimizer Cell's call, as in a user's job.
"""

from __future__ import annotations

import argparse
import math
import os
import random
from collections.abc import Sequence
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops

from bisect_prefetch import adapters
from bisect_prefetch.adapters import hyper_parallel as hyper_parallel_adapter
from bisect_prefetch.workloads import hsdp_double
from bisect_prefetch.workloads.hsdp_double import (
    HSDPParamDouble,
    set_modules_to_backward_prefetch,
    set_modules_to_forward_prefetch,
)

FAULT_MODES = ("nudge", "size-one-copy")
VOCAB = 64
HIDDEN = 32
SEQ = 16
BATCH = 4
BATCHES = 4  # the fixed data cycles through this many batches


# -- the model ------------------------------------------------------------------------
class Attention(nn.Cell):
    """Single-head causal self-attention."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.qkv = nn.Dense(hidden, 3 * hidden)
        self.proj = nn.Dense(hidden, hidden)
        self.scale = 1.0 / math.sqrt(hidden)
        causal = np.triu(np.full((SEQ, SEQ), -1e9, dtype=np.float32), k=1)
        self.mask = Tensor(causal)

    def construct(self, x):
        q, k, v = ops.split(self.qkv(x), x.shape[-1], axis=-1)
        scores = ops.matmul(q, k.swapaxes(-1, -2)) * self.scale + self.mask
        return self.proj(ops.matmul(ops.softmax(scores, axis=-1), v))


class TransformerLayer(nn.Cell):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.input_layernorm = nn.LayerNorm((hidden,))
        self.attention = Attention(hidden)
        self.post_attention_layernorm = nn.LayerNorm((hidden,))
        self.mlp = nn.SequentialCell(
            nn.Dense(hidden, 4 * hidden), nn.GELU(), nn.Dense(4 * hidden, hidden)
        )

    def construct(self, x):
        x = x + self.attention(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Cell):
    def __init__(self, layers: int, hidden: int) -> None:
        super().__init__()
        self.layers = nn.CellList([TransformerLayer(hidden) for _ in range(layers)])
        self.final_layernorm = nn.LayerNorm((hidden,))

    def construct(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.final_layernorm(x)


class GPT(nn.Cell):
    """Names as in MindFormers: embedding, decoder.layers.{i}, decoder.final_layernorm, output_layer."""

    def __init__(self, layers: int, hidden: int = HIDDEN, vocab: int = VOCAB) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, hidden)
        self.decoder = Decoder(layers, hidden)
        self.output_layer = nn.Dense(hidden, vocab, has_bias=False)

    def construct(self, ids):
        return self.output_layer(self.decoder(self.embedding(ids)))


def shard_model(
    model: GPT, *, world_size: int, rank: int, shard_size_source: str, build_guard: str,
    lineage: str = "fully_shard", threshold: int = 0, shard_size: int | None = None,
) -> list[HSDPParamDouble]:
    """Shard every unit (fully_shard, or the older lineage's hsdp over ``shard_size``,
    default the world size, with parameters under ``threshold`` bytes left at size 1),
    inner first and the root last, then set MindFormers' chain."""
    layers = list(model.decoder.layers)
    units = [model.embedding, *layers, model.decoder.final_layernorm, model.output_layer, model]
    for unit in units:
        if lineage == "hsdp":
            hsdp_double.hsdp(unit, shard_size=shard_size or world_size, shard_rank=rank,
                             threshold=threshold)
            continue
        hsdp_double.fully_shard(
            unit,
            shard_world_size=world_size,
            shard_rank=rank,
            shard_size_source=shard_size_source,
            build_guard=build_guard,
        )
    set_modules_to_forward_prefetch(model.embedding, [layers[0]])
    for layer, following in zip(layers, layers[1:], strict=False):
        set_modules_to_forward_prefetch(layer, [following])
    set_modules_to_forward_prefetch(layers[-1], [model.decoder.final_layernorm, model.output_layer])
    set_modules_to_backward_prefetch(model.output_layer, [layers[-1]])
    for layer, previous in zip(layers[1:], layers, strict=False):
        set_modules_to_backward_prefetch(layer, [previous])
    set_modules_to_backward_prefetch(layers[0], [model.embedding])
    return list(hsdp_double.wrapped_params(model))


# -- the planted fault ----------------------------------------------------------------
class PlantedFault:
    """FAULT INJECTION (see the module docstring): drift tied to one prefetch edge."""

    def __init__(self, edge: str, hazard: float, mode: str) -> None:
        if mode not in FAULT_MODES:
            raise ValueError(f"fault mode must be one of {FAULT_MODES}, got {mode!r}")
        self.edge = edge
        self.hazard = hazard
        self.mode = mode
        self.nudges = 0
        self._entropy = random.SystemRandom()  # not the seed: runs must differ

    def on_prefetch(self, edge_id: str, target_module: Any, issued: bool) -> None:
        if edge_id != self.edge or not issued:
            return
        params = target_module.hsdp_scheduler.hsdp_state.hsdp_params
        if self.mode == "size-one-copy" and any(p.gathers for p in params):
            return  # a real AllGather, not the redundant local copy
        if self._entropy.random() < self.hazard:
            nudge_one_ulp(params[0].trained_param)
            self.nudges += 1


def nudge_one_ulp(param: ms.Parameter) -> None:
    values = param.asnumpy().copy()
    flat = values.reshape(-1)
    flat[0] = np.nextafter(flat[0], np.float32(np.inf))
    param.set_data(Tensor(values))


def fault_from(args: argparse.Namespace) -> PlantedFault | None:
    """The --fault-* flags, else the plan's fault (reference workloads only)."""
    if args.fault_edge:
        return PlantedFault(args.fault_edge, args.fault_hazard, args.fault_mode)
    plan = adapters.current_plan()
    fault = plan.get("fault") if plan else None
    if not fault:
        return None
    return PlantedFault(fault["edge"], float(fault.get("hazard", 1.0)), fault.get("mode", "nudge"))


# -- training -------------------------------------------------------------------------
def init_distributed() -> tuple[int, int]:
    """(world size, rank): msrun's workers join its cluster; a plain run is one rank."""
    if not os.environ.get("MS_ROLE"):
        return 1, 0
    from mindspore.communication import get_group_size, get_rank, init

    init()
    return get_group_size(), get_rank()


def fixed_batches(seed: int, rank: int) -> list[tuple[Tensor, Tensor]]:
    """Token batches from the seed; each rank gets its own data, as in data parallelism."""
    rng = np.random.RandomState(seed * 1009 + rank)
    batches = []
    for _ in range(BATCHES):
        tokens = rng.randint(0, VOCAB, size=(BATCH, SEQ + 1)).astype(np.int32)
        batches.append((Tensor(tokens[:, :-1]), Tensor(tokens[:, 1:].reshape(-1))))
    return batches


def train(args: argparse.Namespace) -> None:
    session = adapters.install()  # a no-op under the launcher's sitecustomize
    # hyper-parallel activates the adapter by being imported; the double is not hyper_parallel,
    # so the workload names the module its schedulers live in.
    hyper_parallel_adapter.activate(session, modules=(hsdp_double.__name__,))
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    ms.runtime.launch_blocking()
    world_size, rank = init_distributed()
    ms.set_seed(args.seed)
    model = GPT(args.layers)
    params = shard_model(
        model,
        world_size=world_size,
        rank=rank,
        shard_size_source=args.shard_size_source,
        build_guard=args.build_guard,
        lineage=args.lineage,
    )
    fault = fault_from(args)
    if fault is not None:
        adapters.add_prefetch_listener(fault.on_prefetch)
    optimizer = nn.Adam([p.trained_param for p in params], learning_rate=args.lr)
    loss_fn = nn.CrossEntropyLoss()

    def forward(ids: Tensor, targets: Tensor) -> Tensor:
        return loss_fn(model(ids).reshape(-1, VOCAB), targets)

    grad_fn = ms.value_and_grad(forward, None, [p.cell_param for p in params])
    all_reduce = ops.AllReduce(ops.ReduceOp.SUM) if world_size > 1 else None
    batches = fixed_batches(args.seed, rank)
    for step in range(1, args.steps + 1):
        ids, targets = batches[(step - 1) % len(batches)]
        loss, grads = grad_fn(ids, targets)
        if all_reduce is not None:
            loss = all_reduce(loss) / world_size
            grads = [all_reduce(g) / world_size for g in grads]
        grad_norm = math.sqrt(sum(float((g.astype(ms.float64) ** 2).sum()) for g in grads))
        shards = own_shards(params, grads)
        for param, shard in zip(params, shards, strict=True):
            # Where hyper-parallel leaves it (per lineage); the adapter digests it there.
            param.leave_gradient(shard)
        optimizer(tuple(shards))
        loss_value = float(loss.asnumpy())
        adapters.report_step(step, loss=loss_value, grad_norm=grad_norm)
        if rank == 0:
            print(f"step {step} loss {loss_value!r} grad_norm {grad_norm!r}", flush=True)
    if fault is not None:
        print(f"rank {rank}: planted fault nudged {fault.nudges} times", flush=True)


def own_shards(params: Sequence[HSDPParamDouble], grads: Sequence[Tensor]) -> list[Tensor]:
    """This rank's chunk of each averaged gradient (the double has no ReduceScatter)."""
    return [p.own_shard(g) for p, g in zip(params, grads, strict=True)]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bisect_prefetch.workloads.mindspore", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--fault-edge", default=None, help="planted drift on this edge id")
    parser.add_argument("--fault-hazard", type=float, default=1.0)
    parser.add_argument("--fault-mode", choices=FAULT_MODES, default="nudge")
    parser.add_argument(
        "--shard-size-source",
        choices=hsdp_double.SHARD_SIZE_SOURCES,
        default="shard_size",
        help="shard_size: the older parameter line; shard_world_size: the refactor without it",
    )
    parser.add_argument(
        "--lineage",
        choices=hsdp_double.LINEAGES,
        default="fully_shard",
        help="which hyper-parallel lineage the double plays: fully_shard (the newer) or hsdp "
             "(the older hyper_parallel.hsdp)",
    )
    parser.add_argument(
        "--build-guard",
        choices=hsdp_double.BUILD_GUARDS,
        default="none",
        help="the double's own prefetch guard: none (the bug) or the upstream fix",
    )
    args = parser.parse_args(argv)
    if args.layers < 1 or args.steps < 1:
        parser.error("--layers and --steps must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    train(parse_args(argv))


if __name__ == "__main__":
    main()
