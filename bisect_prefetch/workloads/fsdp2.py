"""Reference workload: a tiny transformer trained with real PyTorch FSDP2 on CPU (gloo).

Run with torch's own launcher, world size 1 to 4::

    python -m torch.distributed.run --nproc_per_node=2 --master_port=29500 \\
        -m bisect_prefetch.workloads.fsdp2 --layers 8 --steps 30 --seed 1234

Model: embedding, N pre-norm transformer layers, final norm, output head.
``fully_shard`` wraps each layer and the root; layers get the MindFormers-style
explicit chain (forward ``layers.i -> layers.i+1``, backward ``layers.i ->
layers.i-1``), so the root keeps FSDP2's implicit backward prefetch of the last
layer. AdamW on fixed synthetic data; seeded, deterministic algorithms, one
CPU thread (the result changes with the thread count), so two runs with the
same seed are bitwise identical.

After each optimizer step it calls ``bisect_prefetch.adapters.report_step(step,
loss=..., grad_norm=...)`` for its metrics.jsonl line only (steps count from 1;
loss is the rank's local loss, grad_norm the global norm before clipping), and
rank 0 prints ``step N loss X grad_norm Y`` with full float reprs. The step
boundaries for digests, the order record and step times come from the optimizer
step, as in a user's job that calls nothing of ours. Without the adapter
installed (no sitecustomize, no plan) it trains the same way.

FAULT INJECTION (off by default; for validating the tool, never for real use):
``--fault-edge EDGE --fault-hazard H`` (or the plan's ``fault``) registers a
prefetch listener. Each time prefetch edge EDGE issues a real unshard, with
probability H drawn from OS entropy (random.SystemRandom, not the seed) it
nudges one randomly chosen element of the target unit's local shard by one ulp
(torch.nextafter, random direction, below torch's dispatch modes). Runs then diverge at random steps, as a
race would make them; masking EDGE off removes the fault.

``--fault-mode race`` (or the plan's ``fault.mode: race``) plants a real data race
instead, with no entropy draw: every unit's unshards become asynchronous
(``FSDPModule._set_unshard_async_op(True)``: on gloo a prefetch then returns a work
handle and gloo's worker thread fills the peer's chunk of the all-gather output at
the very end), and the copy-out of an all-gather that edge EDGE's prefetch issued
skips ``work.wait()``: the handle is hidden from ``foreach_all_gather_copy_out`` (wrapped
in ``torch.distributed.fsdp._fully_shard._fsdp_param_group``'s namespace, where
``wait_for_unshard`` looks it up) and waited on after the optimizer step. The target
layer may then read a half-filled buffer: drift at a random step (a NaN from stale
memory), more often the longer the peer takes to issue. Masking EDGE off removes the
race (the target's own unshard waits). Forward edges only: on a backward edge gloo's
synchronous reduce-scatter, issued between the prefetch and its use on the same process
group, waits behind the all-gather, so the window never opens (checked: no drift in 30
runs); the loader refuses it. Use a bigger model so there is compute to race against
(``--dim 64 --batch 384``: 192 a rank).

``--async-unshard`` makes every unshard asynchronous (as race mode does) with every
wait in place: prefetches overlap compute and nothing races (a job stress can delay
without changing a number).

``--compute-ms MS`` (``workload.compute_ms``; default 0: none) makes every
transformer layer's forward sleep MS milliseconds (``time.sleep``): the device
compute a host waits on in a job on an accelerator. All layers alike (the tool is
never told where a race is); it changes timing only, never a number (an A/A stays
bitwise identical). In race mode it lengthens the compute between the racing
prefetch's issue and its use, so the peer rank's scheduler lag under CPU load
rarely outlasts it, while stress, whose delays scale with the measured gap, still
opens the window (figures: docs/stress.md).

Options to plant suspect edges for the audit (``bisect-prefetch audit``):
``--checkpoint`` (activation checkpointing around each layer),
``--backward-prefetch-depth 2`` (each layer prefetches the two before it:
the edge i->i-1 is shadowed by i+1->i-1, and targets are duplicated),
``--extra-edge PHASE:SRC->DST`` (more explicit edges over ``layers.N`` and
``root``; ``bwd:layers.1->layers.2`` prefetches a layer whose backward
already ran: never consumed; ``bwd:layers.0->root`` comes after the root
unsharded itself: late). World size 1 makes every edge size-one.

``--tp N`` (``workload.tp``; default 1): tensor parallelism x FSDP2 on a 2-D mesh
(dp_shard = world size / N, tp = N). Each layer's MLP is split over ``tp``
(``parallelize_module``: ``up`` column-parallel, ``down`` row-parallel, DTensor weights,
the row-parallel output all-reduced through functional collectives); attention, norms,
embedding and head stay whole. Then ``fully_shard`` shards every unit over ``dp_shard``:
with N equal to the world size every unit has a shard group of size one (FSDP2 then
copies the local shard in ``wait_for_unshard`` instead of all-gathering), the reported
case's topology in small. Ranks of one tp group see the same batch; the grad norm is
taken over both meshes by hand (``clip_grad_norm_`` will not stack norms of two meshes).

``--timings FILE`` (rank 0) writes ``{"first_step_start": unix time,
"step_s": [seconds per step]}`` for the benchmarks.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import _disable_current_modes

from bisect_prefetch.vocab import parse_edge_id


class Block(nn.Module):
    """Pre-norm causal self-attention and MLP."""

    def __init__(self, dim: int, heads: int, compute_ms: float = 0.0) -> None:
        super().__init__()
        self.heads = heads
        self.compute_ms = compute_ms  # host waits this long in each forward (--compute-ms)
        self.attn_norm = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.mlp_norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.compute_ms > 0:
            time.sleep(self.compute_ms / 1000.0)  # timing only: no number changes
        batch, seq, dim = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).chunk(3, dim=-1)
        q, k, v = (t.reshape(batch, seq, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        causal = torch.ones(seq, seq, dtype=torch.bool).triu(1)
        attn = scores.masked_fill(causal, float("-inf")).softmax(dim=-1) @ v
        x = x + self.proj(attn.transpose(1, 2).reshape(batch, seq, dim))
        return x + self.down(F.gelu(self.up(self.mlp_norm(x))))


class TinyTransformer(nn.Module):
    def __init__(
        self, *, vocab: int, dim: int, heads: int, layers: int, checkpoint: bool = False,
        compute_ms: float = 0.0,
    ) -> None:
        super().__init__()
        self.checkpoint = checkpoint
        self.embedding = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, heads, compute_ms) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens)
        for layer in self.layers:
            if self.checkpoint:
                # Activation checkpointing around the FSDP unit: its forward runs again in backward.
                x = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False)
            else:
                x = layer(x)
        return self.output(self.norm(x))


def synthetic_batches(
    *, seed: int, count: int, batch: int, seq: int, vocab: int
) -> list[torch.Tensor]:
    """Fixed token sequences that follow a learnable rule (next = 3 * token + 1 mod vocab)."""
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        tokens = torch.empty(batch, seq + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(vocab, (batch,), generator=generator)
        for t in range(seq):
            tokens[:, t + 1] = (3 * tokens[:, t] + 1) % vocab
        noise = torch.rand(batch, seq + 1, generator=generator) < 0.1  # some unpredictability
        tokens[noise] = torch.randint(vocab, (int(noise.sum()),), generator=generator)
        batches.append(tokens)
    return batches


def apply_tensor_parallel(model: TinyTransformer, tp_mesh) -> None:
    """Each layer's MLP split over the tp mesh: ``up`` by columns, ``down`` by rows (before
    fully_shard, which then shards the DTensor weights over the other mesh dimension)."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    for layer in model.layers:
        parallelize_module(layer, tp_mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})


def apply_fsdp(
    model: TinyTransformer, mesh, *, backward_depth: int = 1, extra_edges: tuple[str, ...] = ()
) -> None:
    """fully_shard each layer, then the root; then the explicit prefetch chain.

    backward_depth: each layer prefetches that many layers before it in backward
    (2: the edge i->i-1 is usually shadowed by i+1->i-1). extra_edges: more
    explicit edges, ``PHASE:SRC->DST`` over unit names (``layers.N``, ``root``),
    to plant mistargeted or late prefetches.
    """
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    # After fully_shard, before the first forward (the adapter reads the lists then).
    layers = list(model.layers)
    forward = {i: [layers[i + 1]] if i + 1 < len(layers) else [] for i in range(len(layers))}
    backward = {i: [layers[j] for j in range(i - 1, max(i - 1 - backward_depth, -1), -1)]
                for i in range(len(layers))}
    units = {f"layers.{i}": layer for i, layer in enumerate(layers)} | {"root": model}
    extra: dict[tuple[str, str], list[nn.Module]] = {}
    for edge in extra_edges:
        try:
            phase, src, dst = parse_edge_id(edge)
        except ValueError:
            phase = src = dst = ""
        if src not in units or dst not in units:
            raise SystemExit(f"--extra-edge {edge!r}: want PHASE:SRC->DST over {sorted(units)}")
        extra.setdefault((phase, src), []).append(units[dst])
    for i, layer in enumerate(layers):
        src = f"layers.{i}"
        if forward[i] or ("fwd", src) in extra:
            layer.set_modules_to_forward_prefetch(forward[i] + extra.get(("fwd", src), []))
        if backward[i] or ("bwd", src) in extra:
            layer.set_modules_to_backward_prefetch(backward[i] + extra.get(("bwd", src), []))
    if ("fwd", "root") in extra:
        model.set_modules_to_forward_prefetch(extra[("fwd", "root")])
    if ("bwd", "root") in extra:  # replaces the root's implicit prefetch of the last layer
        model.set_modules_to_backward_prefetch(extra[("bwd", "root")])


def make_fault(edge: str, hazard: float):
    """Prefetch listener that nudges the target's local shard by one ulp (fault injection)."""
    entropy = random.SystemRandom()

    def nudge(edge_id: str, target_module: nn.Module, issued: bool) -> None:
        if edge_id != edge or not issued or entropy.random() >= hazard:
            return
        # Below torch's dispatch modes: the buffer a wrong copy writes is written unseen,
        # as a copy below the dispatcher would (explain's tracer then sees only its effect).
        with torch.no_grad(), _disable_current_modes():
            shards = [
                p.to_local() if isinstance(p, DTensor) else p for p in target_module.parameters()
            ]
            shards = [s for s in shards if s.numel() > 0]
            if not shards:
                return
            flat = entropy.choice(shards).view(-1)
            i = entropy.randrange(flat.numel())
            toward = torch.tensor(entropy.choice((math.inf, -math.inf)), dtype=flat.dtype)
            flat[i] = torch.nextafter(flat[i], toward)

    return nudge


class Race:
    """A planted race on one forward prefetch edge (``--fault-mode race``; module docstring).

    ``listen`` is a prefetch listener: it marks the all-gathers ``edge`` issued.
    ``after_step`` waits on the work handles the copy-out did not wait on.
    """

    def __init__(self, model: nn.Module, edge: str) -> None:
        from torch.distributed.fsdp._fully_shard import _fsdp_param_group

        self.edge = edge
        self.marked: list[object] = []  # AllGatherResults the racing edge issued, not yet copied
        self.hidden: list[object] = []  # their work handles, waited on after the step
        self.fired = 0
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module._set_unshard_async_op(True)
        original = _fsdp_param_group.foreach_all_gather_copy_out

        def copy_out(result, fsdp_params, group) -> None:
            for k, marked in enumerate(self.marked):
                if marked is result and result.all_gather_work is not None:
                    del self.marked[k]
                    self.hidden.append(result.all_gather_work)
                    self.fired += 1
                    result = result._replace(all_gather_work=None)  # the missing wait
                    break
            original(result, fsdp_params, group)

        # wait_for_unshard looks the function up in its module's globals at each call.
        _fsdp_param_group.foreach_all_gather_copy_out = copy_out

    def listen(self, edge_id: str, target_module: nn.Module, issued: bool) -> None:
        if edge_id != self.edge or not issued or target_module is None:
            return
        for group in target_module._get_fsdp_state()._fsdp_param_groups:
            if group._all_gather_result is not None:
                self.marked.append(group._all_gather_result)

    def after_step(self) -> None:
        while self.hidden:
            self.hidden.pop().wait()
        self.marked.clear()


def train_step(model: TinyTransformer, optimizer, tokens: torch.Tensor, *,
               two_meshes: bool = False) -> tuple[float, float]:
    """One optimizer step on a batch; returns (local loss, global grad norm before clipping).

    two_meshes: the weights live on two meshes (--tp): the norm is taken by hand."""
    optimizer.zero_grad(set_to_none=True)  # grads stay until the next step: digests read them
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    loss.backward()
    if two_meshes:
        grad_norm = _clip_over_meshes(model, max_norm=1.0)
    else:
        grad_norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    if isinstance(grad_norm, DTensor):
        grad_norm = grad_norm.full_tensor()
    optimizer.step()
    return loss.item(), grad_norm.item()


def _clip_over_meshes(model: nn.Module, *, max_norm: float) -> torch.Tensor:
    """The global gradient norm over weights on several meshes; gradients scaled to it."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    whole = [g.full_tensor() if isinstance(g, DTensor) else g for g in grads]
    norm = torch.stack([g.pow(2).sum() for g in whole]).sum().sqrt()
    scale = min(1.0, max_norm / (norm.item() + 1e-6))
    with torch.no_grad():
        for g in grads:
            g.mul_(scale)
    return norm


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--seq", type=int, default=16)
    parser.add_argument("--batch", type=int, default=8, help="global batch size")
    parser.add_argument("--vocab", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument(
        "--fault-edge", default=None, help="FAULT INJECTION: edge to plant drift on"
    )
    parser.add_argument("--fault-hazard", type=float, default=0.0, help="chance per firing")
    parser.add_argument("--fault-mode", choices=("nudge", "race"), default="nudge",
                        help="nudge: one ulp at the chance; race: the edge's copy-out skips its wait")
    parser.add_argument("--async-unshard", action="store_true",
                        help="asynchronous unshards (no race): prefetches overlap compute")
    parser.add_argument("--compute-ms", type=float, default=0.0,
                        help="each layer's forward sleeps this many ms (modelled device compute)")
    parser.add_argument("--tp", type=int, default=1,
                        help="tensor-parallel degree: each layer's MLP split over it, FSDP2 "
                             "over the rest (equal to the world size: shard groups of one)")
    parser.add_argument("--timings", default=None, help="rank 0 writes step timings here")
    parser.add_argument("--checkpoint", action="store_true", help="activation checkpointing")
    parser.add_argument("--backward-prefetch-depth", type=int, default=1,
                        help="layers each layer prefetches in backward")
    parser.add_argument("--extra-edge", action="append", default=[],
                        help="an extra explicit prefetch edge PHASE:SRC->DST (repeatable)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.compute_ms < 0 or not math.isfinite(args.compute_ms):
        raise SystemExit(f"--compute-ms {args.compute_ms}: want a finite number >= 0")
    try:  # the adapter is optional: without it the workload trains the same way
        from bisect_prefetch import adapters
    except ImportError:
        adapters = None

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.tp < 1 or world % args.tp:
        raise SystemExit(f"--tp {args.tp} must divide the world size {world}")
    replicas = world // args.tp  # FSDP2's shard group; every rank of a tp group one batch
    if args.batch % replicas:
        raise SystemExit(f"--batch {args.batch} must be divisible by {replicas}, the ranks "
                         "FSDP2 shards over")

    fault_edge, hazard, mode = args.fault_edge, args.fault_hazard, args.fault_mode
    plan = adapters.current_plan() if adapters is not None else None
    if fault_edge is None and plan and plan.get("fault"):
        fault_edge = plan["fault"]["edge"]
        hazard = float(plan["fault"].get("hazard") or 0.0)
        mode = plan["fault"].get("mode") or "nudge"
    if fault_edge is not None and adapters is None and (hazard > 0 or mode == "race"):
        raise SystemExit("fault injection needs bisect_prefetch.adapters")
    if fault_edge is not None and mode == "race" and replicas == 1:
        raise SystemExit("--fault-mode race needs an all-gather to race: with --tp equal to "
                         "the world size every shard group has size one")
    if fault_edge is not None and mode == "race" and not fault_edge.startswith("fwd:"):
        raise SystemExit(f"--fault-mode race plants forward edges only, not {fault_edge}: "
                         "on gloo the synchronous reduce-scatter closes a backward edge's window")
    if fault_edge is not None and mode == "nudge" and hazard > 0:
        adapters.add_prefetch_listener(make_fault(fault_edge, hazard))

    torch.manual_seed(args.seed)
    model = TinyTransformer(vocab=args.vocab, dim=args.dim, heads=args.heads, layers=args.layers,
                            checkpoint=args.checkpoint, compute_ms=args.compute_ms)
    if args.tp > 1:  # before fully_shard: it shards the DTensor weights over dp_shard
        mesh = init_device_mesh("cpu", (replicas, args.tp), mesh_dim_names=("dp_shard", "tp"))
        apply_tensor_parallel(model, mesh["tp"])
        mesh = mesh["dp_shard"]
    else:
        mesh = init_device_mesh("cpu", (world,))
    apply_fsdp(model, mesh, backward_depth=args.backward_prefetch_depth,
               extra_edges=tuple(args.extra_edge))
    if args.async_unshard:
        model._set_unshard_async_op(True)  # the root's and every layer's groups
    race = None
    if fault_edge is not None and mode == "race":  # after fully_shard, before the first forward
        race = Race(model, fault_edge)
        adapters.add_prefetch_listener(race.listen)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    batches = synthetic_batches(
        seed=args.seed, count=4, batch=args.batch, seq=args.seq, vocab=args.vocab
    )
    per_rank, replica = args.batch // replicas, rank // args.tp

    timings = {"first_step_start": time.time(), "step_s": []}
    for step in range(1, args.steps + 1):
        started = time.perf_counter()
        tokens = batches[(step - 1) % len(batches)][replica * per_rank:(replica + 1) * per_rank]
        loss_value, grad_norm_value = train_step(model, optimizer, tokens,
                                                 two_meshes=args.tp > 1)
        if race is not None:
            race.after_step()
        if adapters is not None:
            adapters.report_step(step, loss=loss_value, grad_norm=grad_norm_value)
        if rank == 0:
            print(f"step {step} loss {loss_value!r} grad_norm {grad_norm_value!r}", flush=True)
        timings["step_s"].append(time.perf_counter() - started)  # reporting included

    if args.timings and rank == 0:
        with open(args.timings, "w", encoding="utf-8") as f:
            json.dump(timings, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
