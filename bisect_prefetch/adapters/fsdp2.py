"""The adapter for PyTorch FSDP2 (``torch.distributed.fsdp.fully_shard``), torch 2.13.

Activated by ``bisect_prefetch.adapters.install()`` when the job imports
``torch.distributed.fsdp``: that is before any ``fully_shard`` call, which
matters because FSDP2 registers its forward pre-hooks as bound methods at
``fully_shard`` time, so only methods patched before then are seen.

What it patches (class attributes, once per process):

- ``FSDPState._lazy_init``: after the root's lazy init (first root forward,
  after every ``fully_shard`` and ``set_modules_to_*_prefetch`` call, before
  the first unshard) it names every FSDP state by module fqn (the root, whose
  fqn is empty, is ``root``), reads the explicit prefetch lists and each unit's
  shard size, and checks through the job's c10d store that all ranks run the
  same plan (``plan_hashes`` in the probe; a mismatch stops the job).
- ``FSDPState._pre_forward`` / ``_pre_backward``: note which state is running,
  the source of any prefetch issued inside (a thread-local stack).
- ``FSDPParamGroup._record_post_forward``: the post-forward order of the
  first iteration, which gives node order and FSDP2's implicit backward
  prefetch (reverse post-forward order, for states without an explicit
  backward list); the graph is written when the first backward starts.
- ``FSDPParamGroup._prefetch_unshard(target, pass_type)``: the single choke
  point of explicit and implicit prefetches. Each call is named
  ``fwd|bwd:SRC->DST`` and sent through ``Session.prefetch``, which masks,
  guards, probes and notifies listeners. An empty backward list does not
  switch prefetch off in FSDP2 (it falls back to the implicit one), so the
  mask is applied here, not by editing the lists.
- ``FSDPParamGroup.unshard``, ``pre_forward``, ``pre_backward``,
  ``_to_sharded`` and ``_to_sharded_post_forward``: while the session records
  the order (the first steps), each unshard that starts an all-gather (by the
  group's own hook, or inside a prefetch: the gate names the edge), each use
  (forward or backward pre-hook) and each reshard; afterwards they pass
  straight through.

At each step end it rewrites the graph if a prefetch edge not yet in it was
seen, and writes gradient digests when the plan asks for them.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import fnmatch
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors

from bisect_prefetch import vocab
from bisect_prefetch.adapters import digest
from bisect_prefetch.adapters.digest import gradient_digests
from bisect_prefetch.adapters.units import (
    ROOT_NAME,
    UNKNOWN_NAME,
    is_layer,
    node_kind,
    record_graph,
)

if TYPE_CHECKING:
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

_PLAN_HASH_KEY = "bisect_prefetch/plan_hash/{rank}"
_PLAN_HASH_WAIT_S = 300
_adapter: _Fsdp2Adapter | None = None


def _group_shard_size(group: FSDPParamGroup) -> int:
    """Size of the mesh dimension the group's params are sharded over (1: replicated)."""
    # FSDPMeshInfo (and HSDP's) has shard_mesh_size; DDP's replicate-only mesh has none.
    return getattr(group.mesh_info, "shard_mesh_size", 1)


class _Fsdp2Adapter:
    """Names FSDP states, builds the graph and routes prefetches through the session."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.roots: list[FSDPState] = []
        self.states: list[FSDPState] = []
        self.state_names: dict[FSDPState, str] = {}
        self.group_states: dict[FSDPParamGroup, FSDPState] = {}
        self.group_shard_sizes: dict[FSDPParamGroup, int] = {}
        self.edges: dict[str, dict[str, Any]] = {}
        self.post_forward_sequence: list[FSDPState] = []
        self.graph_final = False
        self.graph_dirty = False
        self._local = threading.local()
        self._unknown_source_reported = False
        self.plan_store: Any = None  # the job's c10d store, once this rank posted its plan hash
        self.world_size = 1
        self._digest_key: tuple[str, int] | None = None
        self._digest_params: list[tuple[str, Any]] = []
        self._digest_names: list[str] = []
        self._digest_batch: GradientBatch | None = None

    # -- prefetch sources -------------------------------------------------------------
    def sources(self) -> list[FSDPState]:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def group_name(self, group: FSDPParamGroup) -> str:
        return self.name_of(self.group_states.get(group))

    def name_of(self, state: FSDPState | None) -> str:
        if state is None:
            return UNKNOWN_NAME
        return self.state_names.get(state, UNKNOWN_NAME)

    # -- discovery --------------------------------------------------------------------
    def discover(self, root: FSDPState) -> None:
        """Name the root's states and read their explicit prefetch lists."""
        self.roots.append(root)
        root_module = root._modules[0]
        fqns: dict[torch.nn.Module, str] = {}
        for fqn, module in root_module.named_modules():
            fqns.setdefault(module, fqn)
        for state in root._state_ctx.all_states:
            if state in self.state_names:
                continue
            names = [fqns.get(module, UNKNOWN_NAME) or ROOT_NAME for module in state._modules]
            self.state_names[state] = "+".join(names)
            self.states.append(state)
            for group in state._fsdp_param_groups:
                self.group_states[group] = state
                self.group_shard_sizes[group] = _group_shard_size(group)
        for state in root._state_ctx.all_states:
            for phase, targets in (
                (vocab.FWD, state._states_to_forward_prefetch),
                (vocab.BWD, state._states_to_backward_prefetch),
            ):
                for target in targets:
                    self.add_edge(phase, self.name_of(state), self.name_of(target), implicit=False)
        self.publish_plan_hash(root)

    def publish_plan_hash(self, root: FSDPState) -> None:
        """Post this rank's plan hash in the job's key-value store and check all ranks'.

        Different masks on different ranks would issue collectives in different
        orders and hang, so the check must come before the first all-gather. When
        the root's mesh spans every rank, all ranks reach this point before their
        first all-gather, and waiting here for the others' hashes is safe. Otherwise
        (pipeline stages, other meshes) a wait could deadlock: the hashes are then
        looked at, without waiting, at each step end.
        """
        plan = self.session.plan
        if plan is None or self.plan_store is not None:
            return
        if not (dist.is_available() and dist.is_initialized()):
            return
        self.plan_store = dist.distributed_c10d._get_default_store()
        self.world_size = dist.get_world_size()
        self.plan_store.set(_PLAN_HASH_KEY.format(rank=dist.get_rank()), plan.hash)
        meshes = [
            g.mesh_info.mesh for s in root._state_ctx.all_states for g in s._fsdp_param_groups
        ]
        if meshes and meshes[0].size() == self.world_size:
            keys = [_PLAN_HASH_KEY.format(rank=r) for r in range(self.world_size)]
            try:
                self.plan_store.wait(keys, datetime.timedelta(seconds=_PLAN_HASH_WAIT_S))
            except RuntimeError as e:
                self.session.note_error(f"not every rank posted its plan hash: {e}")
        self.check_plan_agreement()

    def check_plan_agreement(self) -> None:
        """Once every rank has posted its hash: record them all; different plans are an error.

        Ranks with different masks would issue collectives in different orders.
        """
        store = self.plan_store
        if store is None or "plan_hashes" in self.session.probe_extra:
            return
        keys = [_PLAN_HASH_KEY.format(rank=r) for r in range(self.world_size)]
        if not store.check(keys):
            return  # not every rank is there yet: look again at the next step end
        hashes = [store.get(key).decode() for key in keys]
        self.session.probe_extra["plan_hashes"] = hashes
        if len(set(hashes)) > 1:
            self.session.note_error(f"ranks run with different plans: {hashes}")
            self.session.write_probe()
            raise RuntimeError(f"bisect-prefetch: ranks run with different plans: {hashes}")

    def add_edge(self, phase: str, src: str, dst: str, *, implicit: bool) -> str:
        edge_id = vocab.edge_id(phase, src, dst)
        if edge_id not in self.edges:
            self.edges[edge_id] = {
                "id": edge_id,
                "phase": phase,
                "src": src,
                "dst": dst,
                "implicit": implicit,
            }
            self.graph_dirty = True
        return edge_id

    def finalize_graph(self) -> None:
        """After the first forward: node order and the implicit backward edges it implies."""
        if self.graph_final:
            return
        self.graph_final = True
        sequence = self.post_forward_sequence
        for k, state in enumerate(sequence):
            if state._states_to_backward_prefetch:
                continue  # an explicit list replaces the implicit default
            j = k - 1
            while j >= 0 and sequence[j] is state:  # a state's own groups are not an edge
                j -= 1
            if j >= 0:
                self.add_edge(vocab.BWD, self.name_of(state), self.name_of(sequence[j]), implicit=True)
        self.write_graph()

    def graph_nodes(self) -> list[dict[str, Any]]:
        order: dict[FSDPState, int] = {}
        for state in self.post_forward_sequence:
            order.setdefault(state, len(order))
        names = [self.name_of(state) for state in self.states]
        layer_orders = [
            order[s]
            for s in self.states
            if s in order and is_layer(self.name_of(s))
        ]
        first_layer = min(layer_orders, default=None)
        nodes = []
        for state in self.states:
            name = self.name_of(state)
            sizes = [self.group_shard_sizes[g] for g in state._fsdp_param_groups]
            nodes.append(
                {
                    "name": name,
                    "kind": node_kind(name, order.get(state), names, first_layer),
                    "order": order.get(state),
                    "shard_size": max(sizes, default=1),
                }
            )
        nodes.sort(key=lambda n: (n["order"] is None, n["order"] or 0))
        return nodes

    def write_graph(self) -> None:
        self.graph_dirty = False
        record_graph(self.session, nodes=self.graph_nodes(), edges=self.edges)

    # -- the prefetch choke point -----------------------------------------------------
    def prefetch(self, original, target: FSDPParamGroup, pass_type: str) -> None:
        sources = self.sources()
        source = sources[-1] if sources else None
        if source is None and not self._unknown_source_reported:
            self._unknown_source_reported = True
            self.session.note_error(
                "prefetch from an unknown FSDP state: was the adapter installed after fully_shard?"
            )
        phase = vocab.FWD if pass_type == "forward" else vocab.BWD
        target_state = self.group_states.get(target)
        edge_id = vocab.edge_id(phase, self.name_of(source), self.name_of(target_state))
        if edge_id not in self.edges:
            implicit = (
                phase == vocab.BWD and source is not None and not source._states_to_backward_prefetch
            )
            self.add_edge(
                phase, self.name_of(source), self.name_of(target_state), implicit=implicit
            )

        def run() -> bool:
            # Issued: this call started the unshard (FSDP2 returns early when the target is
            # already unsharded or its all-gather is pending).
            pending_before = target._all_gather_result
            unsharded_before = target.is_unsharded
            original(target, pass_type)
            return (
                not unsharded_before
                and pending_before is None
                and target._all_gather_result is not None
            )

        self.session.prefetch(
            edge_id,
            target_shard_size=self.group_shard_sizes.get(target, _group_shard_size(target)),
            target_module=target_state._modules[0] if target_state is not None else None,
            run=run,
        )

    # -- step end and exit ------------------------------------------------------------
    def on_step_end(self, step: int) -> None:
        if not self.roots:
            return
        self.check_plan_agreement()
        self.finalize_graph()
        if self.graph_dirty:
            self.write_graph()
        plan = self.session.plan
        if plan is not None and plan.digest_glob and step % plan.digest_every == 0:
            self.write_digests(step, plan.digest_glob)

    def on_exit(self) -> None:
        if self.roots:
            self.finalize_graph()
            if self.graph_dirty:
                self.write_graph()

    def digest_params(self, glob: str) -> list[tuple[str, Any]]:
        """(name, FSDPParam) of the parameters whose gradients are digested (cached)."""
        key = (glob, len(self.states))  # a second root adds states: look again
        if self._digest_key != key:
            self._digest_key = key
            self._digest_params = [
                (fsdp_param._param_fqn, fsdp_param)
                for state in self.states
                for group in state._fsdp_param_groups
                for fsdp_param in group.fsdp_params
                if fnmatch.fnmatchcase(fsdp_param._param_fqn, glob)
            ]
            self._digest_names = [name for name, _ in self._digest_params]
        return self._digest_params

    def write_digests(self, step: int, glob: str) -> None:
        """Digest, norm and max abs of each matching parameter's local gradient shard.

        What a digest covers: adapters/digest.py. The work is batched (GradientBatch: a few
        tensor ops for all gradients, one write), because with many small parameters the
        cost is per parameter and per op, not per byte.
        """
        recorder = self.session.recorder
        if recorder is None:
            return
        params = self.digest_params(glob)
        grads = [fsdp_param.sharded_param.grad for _, fsdp_param in params]
        if any(grad is None for grad in grads):  # some parameter got no gradient this step
            names = [name for (name, _), grad in zip(params, grads, strict=True)
                     if grad is not None]
            grads = [grad for grad in grads if grad is not None]
        else:
            names = self._digest_names
        grads = [getattr(grad, "_local_tensor", grad) for grad in grads]  # a DTensor's local shard
        batch = self._digest_batch
        if batch is None or batch.names != names:  # a parameter's shard keeps its shape
            batch = self._digest_batch = GradientBatch(names, grads)
        recorder.digest_columns(step, *batch.measure(grads))


# Gradients of up to BATCHED_MAX_BYTES are copied into one flat buffer per dtype and measured
# together; larger ones are measured where they lie, so no step copies a large gradient.
BATCHED_MAX_BYTES = 1 << 16


class GradientBatch:
    """How to measure the gradients of one list of parameters in a few tensor ops.

    With many small gradients the cost is per tensor op, not per byte. Small gradients are
    copied into one flat buffer per dtype, ordered so that gradients of the same size lie
    side by side: each run of equal sizes is a (count, numel) view, whose per-row norm and
    max abs are one op each. Large gradients get two foreach ops for all of them. The bytes
    a digest covers are read in place on the CPU; elsewhere they are gathered on the
    device and copied to the host at once.
    """

    def __init__(self, names: list[str], grads: list[torch.Tensor]) -> None:
        self.names = names  # the parameters, in the order write_digests lists them
        # An uneven split can leave a rank an empty shard: nothing to measure or hash.
        self.kept = [k for k, g in enumerate(grads) if g.numel()]
        self.kept_names = [names[k] for k in self.kept]
        grads = [grads[k] for k in self.kept]
        self.device = grads[0].device if grads else None
        self.sizes = [g.numel() * g.element_size() for g in grads]  # bytes, per gradient
        by_dtype: dict[torch.dtype, list[int]] = {}
        self.large: list[int] = []
        for k, g in enumerate(grads):
            if self.sizes[k] > BATCHED_MAX_BYTES:
                self.large.append(k)
            else:
                by_dtype.setdefault(g.dtype, []).append(k)
        # Per flat buffer: the gradients in it, and its runs of equal size (offset, count, numel).
        self.flats: list[tuple[list[int], list[tuple[int, int, int]]]] = []
        self.where: dict[int, tuple[int, int]] = {}  # small gradient -> (flat, byte offset)
        stat_order: list[int] = []  # gradient index of each row of the stats, in op order
        for members in by_dtype.values():
            members.sort(key=lambda k: grads[k].numel())
            runs: list[tuple[int, int, int]] = []
            offset = 0
            for k in members:
                numel = grads[k].numel()
                if runs and runs[-1][2] == numel:
                    start, count, _ = runs[-1]
                    runs[-1] = (start, count + 1, numel)
                else:
                    runs.append((offset, 1, numel))
                self.where[k] = (len(self.flats), offset * grads[k].element_size())
                offset += numel
            self.flats.append((members, runs))
            stat_order += members
        stat_order += self.large
        count = len(grads)
        self.norm_row = [0] * count
        for row, k in enumerate(stat_order):
            self.norm_row[k] = row
        self.max_row = [row + count for row in self.norm_row]
        self._gather_index: list[torch.Tensor] | None = None

    def measure(
        self, grads: list[torch.Tensor], *, gather: bool | None = None
    ) -> tuple[list[str], list[str], list[float], list[float]]:
        """(names, digests, norms, max abs) of the non-empty gradients, in the order of ``names``.

        grads: one per name, of the shapes this batch was built for. gather: read the
        bytes as on an accelerator would (default: where the gradients lie).
        """
        if len(self.kept) < len(grads):
            grads = [grads[k] for k in self.kept]
        if not grads:
            return [], [], [], []
        flats, norm_parts, max_parts = [], [], []
        for members, runs in self.flats:
            flat = _flatten_dense_tensors([grads[k] for k in members])
            flats.append(flat)
            # |x| in float64: exact for every float dtype, and one op for the whole buffer.
            magnitudes = flat.to(torch.float64, copy=True).abs_()
            for part, (_, count, numel) in zip(
                magnitudes.split([count * numel for _, count, numel in runs]), runs, strict=True
            ):
                rows = part.view(count, numel)
                norm_parts.append(torch.linalg.vector_norm(rows, dim=1))
                max_parts.append(rows.amax(dim=1))
        # Contiguous, and held here: their bytes are read in place below.
        large = [grads[k].contiguous() for k in self.large]
        if large:
            norm_parts.append(torch.stack(torch._foreach_norm(large, 2, dtype=torch.float64)))
            max_parts.append(torch.stack(torch._foreach_norm(large, float("inf"))))
        stats = torch.cat(norm_parts + max_parts).tolist()  # float64; one sync on an accelerator
        norms = [stats[row] for row in self.norm_row]
        max_abs = [stats[row] for row in self.max_row]
        if gather is None:
            gather = self.device.type != "cpu"
        # In place: views of the memory, hashed below while flats and large still hold it.
        data = self.bytes_gathered(flats, large) if gather else self.bytes_in_place(flats, large)
        return self.kept_names, gradient_digests(data, max_abs, self.sizes), norms, max_abs

    def bytes_in_place(self, flats: list[torch.Tensor], large: list[torch.Tensor]) -> list[Any]:
        """Each gradient's bytes, as views of the memory they lie in (CPU only, no copy)."""
        data: list[Any] = [None] * len(self.sizes)
        views = [_memory(f) for f in flats]
        for k, (flat, start) in self.where.items():
            data[k] = views[flat][start : start + self.sizes[k]]
        for k, grad in zip(self.large, large, strict=True):
            data[k] = _memory(grad)  # contiguous (measure made it so)
        return data

    def bytes_gathered(self, flats: list[torch.Tensor], large: list[torch.Tensor]) -> list[bytes]:
        """Only the bytes each digest covers, gathered on the device, copied to the host at once."""
        if self._gather_index is None:
            self._gather_index = [
                torch.tensor(self._covered_positions(members), dtype=torch.long, device=f.device)
                for (members, _), f in zip(self.flats, flats, strict=True)
            ]
        parts = [f.view(torch.uint8)[index] for f, index in zip(flats, self._gather_index,
                                                                  strict=True)]
        parts += [_sampled_chunks(grad) for grad in large]
        packed = torch.cat(parts).cpu()  # one copy to the host, one sync
        host = ctypes.string_at(packed.data_ptr(), packed.numel())
        data: list[bytes] = [b""] * len(self.sizes)
        offset = 0
        for k in [k for members, _ in self.flats for k in members] + self.large:
            covered = digest.covered_bytes(self.sizes[k])
            data[k] = host[offset : offset + covered]
            offset += covered
        return data

    def _covered_positions(self, members: list[int]) -> list[int]:
        """Byte positions, in one flat buffer, of its gradients' covered bytes (in order)."""
        positions: list[int] = []
        for k in members:
            start, size = self.where[k][1], self.sizes[k]
            if digest.is_sampled(size):
                for chunk in digest.chunk_starts(size):
                    positions += range(start + chunk, start + chunk + digest.CHUNK_BYTES)
            else:
                positions += range(start, start + size)
        return positions


def _memory(tensor: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, without a copy (valid while the tensor lives)."""
    size = tensor.numel() * tensor.element_size()
    return memoryview((ctypes.c_char * size).from_address(tensor.data_ptr())).cast("B")


def _sampled_chunks(grad: torch.Tensor) -> torch.Tensor:
    """The chunks a large gradient's digest covers (adapters/digest.py), where it lies."""
    raw = grad.reshape(-1).view(torch.uint8)
    row = raw.numel() // digest.CHUNKS
    return raw[: row * digest.CHUNKS].view(digest.CHUNKS, row)[:, : digest.CHUNK_BYTES].reshape(-1)


def _patch_torch() -> None:
    """Wrap the FSDP2 internals listed in the module docstring (once per process)."""
    # Imported here, not at the top: importing this module must not import
    # torch.distributed.fsdp, whose import hook would activate it half-imported.
    from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState, _dynamo_disable
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

    if getattr(FSDPState, "_bisect_prefetch_patched", False):
        return
    FSDPState._bisect_prefetch_patched = True

    original_lazy_init = FSDPState._lazy_init
    original_pre_forward = FSDPState._pre_forward
    original_pre_backward = FSDPState._pre_backward
    original_record_post_forward = FSDPParamGroup._record_post_forward
    original_prefetch_unshard = FSDPParamGroup._prefetch_unshard
    original_unshard = FSDPParamGroup.unshard
    original_group_pre_forward = FSDPParamGroup.pre_forward
    original_group_pre_backward = FSDPParamGroup.pre_backward
    original_to_sharded = FSDPParamGroup._to_sharded
    original_to_sharded_post_forward = FSDPParamGroup._to_sharded_post_forward

    def _lazy_init(self: FSDPState) -> None:
        original_lazy_init(self)
        adapter = _adapter
        if adapter is not None and self._is_root and self not in adapter.roots:
            adapter.discover(self)

    @_dynamo_disable
    def _pre_forward(self: FSDPState, module, args, kwargs):
        adapter = _adapter
        if adapter is None:
            return original_pre_forward(self, module, args, kwargs)
        sources = adapter.sources()
        sources.append(self)
        try:
            return original_pre_forward(self, module, args, kwargs)
        finally:
            sources.pop()

    @_dynamo_disable
    def _pre_backward(self: FSDPState, grad: torch.Tensor) -> torch.Tensor:
        adapter = _adapter
        if adapter is None:
            return original_pre_backward(self, grad)
        if not adapter.graph_final and adapter.roots:
            adapter.finalize_graph()  # the first forward is complete: its order is known
        sources = adapter.sources()
        sources.append(self)
        try:
            return original_pre_backward(self, grad)
        finally:
            sources.pop()

    def _record_post_forward(self: FSDPParamGroup) -> None:
        original_record_post_forward(self)
        adapter = _adapter
        if adapter is not None and not adapter.graph_final:
            state = adapter.group_states.get(self)
            if state is not None:
                adapter.post_forward_sequence.append(state)

    def _prefetch_unshard(target: FSDPParamGroup, pass_type: str) -> None:
        adapter = _adapter
        if adapter is None:
            original_prefetch_unshard(target, pass_type)
        else:
            adapter.prefetch(original_prefetch_unshard, target, pass_type)

    # The order record (first steps only): who unsharded each group, its uses, its reshards.
    def unshard(self: FSDPParamGroup, async_op: bool = False) -> None:
        order = _recording_order()
        if order is None:
            return original_unshard(self, async_op)
        starts = self._all_gather_result is None and not self.is_unsharded
        original_unshard(self, async_op)
        if starts and self._all_gather_result is not None:
            order.unshard(_adapter.group_name(self))

    def group_pre_forward(self: FSDPParamGroup, module, args, kwargs):
        result = original_group_pre_forward(self, module, args, kwargs)
        order = _recording_order()
        if order is not None:
            order.use(_adapter.group_name(self), "fwd")
        return result

    @_dynamo_disable
    def group_pre_backward(self: FSDPParamGroup, default_prefetch: bool, *unused: Any):
        order = _recording_order()
        first = order is not None and self._training_state != TrainingState.PRE_BACKWARD
        result = original_group_pre_backward(self, default_prefetch, *unused)
        if first:
            order.use(_adapter.group_name(self), "bwd")
        return result

    def resharding(original):
        def to_sharded(self: FSDPParamGroup) -> None:
            order = _recording_order()
            was_unsharded = order is not None and self.is_unsharded
            original(self)
            if was_unsharded and not self.is_unsharded:
                order.reshard(_adapter.group_name(self))

        return to_sharded

    FSDPParamGroup.unshard = unshard
    FSDPParamGroup.pre_forward = group_pre_forward
    FSDPParamGroup.pre_backward = group_pre_backward
    FSDPParamGroup._to_sharded = resharding(original_to_sharded)
    FSDPParamGroup._to_sharded_post_forward = resharding(original_to_sharded_post_forward)
    FSDPState._lazy_init = _lazy_init
    FSDPState._pre_forward = _pre_forward
    FSDPState._pre_backward = _pre_backward
    FSDPParamGroup._record_post_forward = _record_post_forward
    FSDPParamGroup._prefetch_unshard = staticmethod(_prefetch_unshard)


def _recording_order() -> Any:
    """The session's order log while it still records, else None."""
    adapter = _adapter
    if adapter is None:
        return None
    order = adapter.session.order
    return order if order is not None and order.steps_left > 0 else None


def activate(session: Any) -> None:
    """Hook FSDP2 for this session (called by install() when torch.distributed.fsdp is imported)."""
    global _adapter
    if _adapter is not None:
        return
    _patch_torch()
    _adapter = _Fsdp2Adapter(session)
    session.add_step_end_listener(_adapter.on_step_end)
    session.add_exit_listener(_adapter.on_exit)


def adapter() -> _Fsdp2Adapter | None:
    """The active adapter, or None."""
    return _adapter


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Inside, the patched FSDP2 methods pass straight through (to measure the adapter's cost)."""
    global _adapter
    saved, _adapter = _adapter, None
    try:
        yield
    finally:
        _adapter = saved
