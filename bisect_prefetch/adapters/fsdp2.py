"""The adapter for PyTorch FSDP2 (``torch.distributed.fsdp.fully_shard``), torch 2.8-2.15.

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
- In a traced job (explain's tracer watches the session): ``FSDPState._pre_forward``,
  ``_post_forward``, ``_pre_backward``, ``FSDPParamGroup.post_backward`` and
  ``wait_for_unshard`` tell the watchers where each unit's hooks begin and end
  (``Session.unit_hook``), so the tracer knows the unit an op runs for and where a
  prefetched unit takes its unshard.
- ``FSDPParamGroup.unshard``, ``pre_forward``, ``pre_backward``,
  ``_to_sharded`` and ``_to_sharded_post_forward``: while the session records
  the order (the first steps), each unshard that starts an all-gather (by the
  group's own hook, or inside a prefetch: the gate names the edge), each use
  (forward or backward pre-hook) and each reshard; afterwards they pass
  straight through. Under stress (adapters/stress.py), ``pre_forward`` and
  ``pre_backward`` also report each use while the gaps are measured, and a
  prefetch whose all-gather finished before it returned (no work handle on a
  host device: FSDP2's default synchronous unshard on CPU) is reported as
  leaving no window.

Step boundaries (adapters/steps.py): the root's ``_pre_forward`` tells the
clock a forward begins, ``_root_post_backward_final_callback`` that the root's
backward ended, and torch's global optimizer step hooks (adapters/optimizers.py)
where the update is. When the optimizer is about to apply a step's gradients,
each matching parameter's local gradient shard and local value shard are digested
(adapters/digest.py, adapters/torch_digest.py). At each step end the graph is
rewritten if a prefetch edge not yet in it was seen.

Which torch: adapters/fsdp2_support.py. Before anything is patched, a torch outside 2.8-2.15
or one lacking a name patched here is refused (``activate`` raises NotActive with the line).
Across the range two names differ, and both forms are taken: FSDP2's ``_dynamo_disable``
(2.12 and later; before, the hooks are plain functions, as FSDP2's own are there) and a
state's parameter groups (``_fsdp_param_groups``, a list, from 2.12; ``_fsdp_param_group``,
one or None, before).
"""

from __future__ import annotations

import contextlib
import datetime
import fnmatch
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from bisect_prefetch import vocab
from bisect_prefetch.adapters import NotActive, fsdp2_support
from bisect_prefetch.adapters.base import DigestColumns, FrameworkAdapter
from bisect_prefetch.adapters.torch_digest import TensorBatch, local
from bisect_prefetch.adapters.units import ROOT_NAME, UNKNOWN_NAME

if TYPE_CHECKING:
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

_PLAN_HASH_KEY = "bisect_prefetch/plan_hash/{rank}"
_PLAN_HASH_WAIT_S = 300
_adapter: _Fsdp2Adapter | None = None


def param_groups(state: FSDPState) -> list[FSDPParamGroup]:
    """A state's parameter groups: a list from torch 2.12, one group or None before."""
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is not None:
        return list(groups)
    group = getattr(state, "_fsdp_param_group", None)
    return [] if group is None else [group]


def _no_dynamo_disable(fn: Any) -> Any:
    """Where FSDP2 has no ``_dynamo_disable`` (before torch 2.12): the hook as it is."""
    return fn


def _group_shard_size(group: FSDPParamGroup) -> int:
    """Size of the mesh dimension the group's params are sharded over (1: replicated)."""
    # FSDPMeshInfo (and HSDP's) has shard_mesh_size; DDP's replicate-only mesh has none.
    return getattr(group.mesh_info, "shard_mesh_size", 1)


class _Fsdp2Adapter(FrameworkAdapter):
    """Names FSDP states, builds the graph and routes prefetches through the session."""

    def __init__(self, session: Any) -> None:
        super().__init__(session)
        self.group_states: dict[FSDPParamGroup, FSDPState] = {}
        self.group_shard_sizes: dict[FSDPParamGroup, int] = {}
        self.post_forward_sequence: list[FSDPState] = []
        self.graph_final = False
        self._unknown_source_reported = False
        self.plan_store: Any = None  # the job's c10d store, once this rank posted its plan hash
        self.world_size = 1
        self._digest_batch: TensorBatch | None = None

    def group_name(self, group: FSDPParamGroup) -> str:
        return self.name_of(self.group_states.get(group))

    # -- discovery --------------------------------------------------------------------
    def discover(self, root: FSDPState) -> None:
        """Name the root's states and read their explicit prefetch lists."""
        self.roots.append(root)
        # FSDP2 is in use (not merely imported): the audit words size-one evidence by version.
        self.session.probe_extra["fsdp2"] = {"torch": torch.__version__}
        root_module = root._modules[0]
        fqns: dict[torch.nn.Module, str] = {}
        for fqn, module in root_module.named_modules():
            fqns.setdefault(module, fqn)
        for state in root._state_ctx.all_states:
            if id(state) in self.unit_names:
                continue
            names = [fqns.get(module, UNKNOWN_NAME) or ROOT_NAME for module in state._modules]
            self.name_unit(state, "+".join(names))
            for group in param_groups(state):
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
            g.mesh_info.mesh for s in root._state_ctx.all_states for g in param_groups(s)
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
        self.check_hashes([store.get(key).decode() for key in keys])

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

    def unit_rows(self) -> list[tuple[str, int | None, int]]:
        order: dict[int, int] = {}  # id(state) -> its place in the first forward
        for state in self.post_forward_sequence:
            order.setdefault(id(state), len(order))
        return [(self.name_of(state), order.get(id(state)),
                 max((self.group_shard_sizes[g] for g in param_groups(state)), default=1))
                for state in self.units]

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
        implicit = phase == vocab.BWD and source is not None and not source._states_to_backward_prefetch
        edge_id = self.add_edge(phase, self.name_of(source), self.name_of(target_state),
                                implicit=implicit)

        def run() -> bool:
            # Issued: this call started the unshard (FSDP2 returns early when the target is
            # already unsharded or its all-gather is pending).
            pending_before = target._all_gather_result
            unsharded_before = target.is_unsharded
            original(target, pass_type)
            issued = (
                not unsharded_before
                and pending_before is None
                and target._all_gather_result is not None
            )
            stress = self.session.stress
            if issued and stress is not None and _finished_on_return(target):
                stress.no_window(edge_id)
            return issued

        self.session.prefetch(
            edge_id,
            target_shard_size=self.group_shard_sizes.get(target, _group_shard_size(target)),
            target_module=target_state._modules[0] if target_state is not None else None,
            run=run,
        )

    # -- step end and exit ------------------------------------------------------------
    def settle(self, *, at_exit: bool) -> None:
        if not at_exit:
            self.check_plan_agreement()
        self.finalize_graph()

    # -- digests ----------------------------------------------------------------------
    def find_digest_params(self, glob: str) -> list[tuple[str, Any]]:
        return [(fsdp_param._param_fqn, fsdp_param)
                for state in self.units
                for group in param_groups(state)
                for fsdp_param in group.fsdp_params
                if fnmatch.fnmatchcase(fsdp_param._param_fqn, glob)]

    def gradient(self, param: Any) -> Any:
        grad = param.sharded_param.grad
        return None if grad is None else local(grad)  # read only

    def value(self, param: Any) -> Any:
        return local(param.sharded_param)

    def measure(self, names: list[str], tensors: list[Any]) -> DigestColumns:
        """On the tensors' device, in a few ops (adapters/torch_digest.py)."""
        batch = self._digest_batch
        if batch is None or batch.names != names:  # the same names keep their shapes
            batch = self._digest_batch = TensorBatch(names, tensors)
        with torch.no_grad():
            return batch.measure(tensors)


def _patch_torch() -> None:
    """Wrap the FSDP2 internals listed in the module docstring (once per process)."""
    # Imported here, not at the top: importing this module must not import
    # torch.distributed.fsdp, whose import hook would activate it half-imported.
    from torch.distributed.fsdp._fully_shard import _fsdp_common
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

    if getattr(FSDPState, "_bisect_prefetch_patched", False):
        return
    FSDPState._bisect_prefetch_patched = True
    dynamo_disable = getattr(_fsdp_common, "_dynamo_disable", _no_dynamo_disable)
    _patch_states(FSDPState, dynamo_disable)  # discovery, prefetch sources, step boundaries
    _patch_prefetch(FSDPParamGroup)  # the post-forward order, the prefetch choke point
    _patch_order(FSDPParamGroup, _fsdp_common.TrainingState, dynamo_disable)  # order, stress
    _patch_unit_hooks(FSDPState, FSDPParamGroup, _fsdp_common.TrainingState,
                      dynamo_disable)  # explain's


def _patch_states(state_cls: Any, dynamo_disable: Any) -> None:
    """FSDPState: the root's lazy init discovers the units; the pre-hooks name the source
    of any prefetch issued inside them; the root's forward and backward mark the steps."""
    original_lazy_init = state_cls._lazy_init
    original_root_backward_done = state_cls._root_post_backward_final_callback
    original_pre_forward = state_cls._pre_forward
    original_pre_backward = state_cls._pre_backward

    def _lazy_init(self: FSDPState) -> None:
        original_lazy_init(self)
        adapter = _adapter
        if adapter is not None and self._is_root and self not in adapter.roots:
            adapter.discover(self)

    @dynamo_disable
    def _pre_forward(self: FSDPState, module, args, kwargs):
        adapter = _adapter
        if adapter is None:
            return original_pre_forward(self, module, args, kwargs)
        if getattr(self, "_is_root", False):  # before it unshards anything: a new step's
            adapter.root_forward_begins()
        with adapter.prefetching_from(self):
            return original_pre_forward(self, module, args, kwargs)

    @dynamo_disable
    def _pre_backward(self: FSDPState, grad: torch.Tensor) -> torch.Tensor:
        adapter = _adapter
        if adapter is None:
            return original_pre_backward(self, grad)
        if not adapter.graph_final and adapter.roots:
            adapter.finalize_graph()  # the first forward is complete: its order is known
        with adapter.prefetching_from(self):
            return original_pre_backward(self, grad)

    def _root_post_backward_final_callback(self: FSDPState) -> None:
        original_root_backward_done(self)
        adapter = _adapter
        if adapter is not None:
            adapter.session.clock.backward_ends()

    state_cls._lazy_init = _lazy_init
    state_cls._root_post_backward_final_callback = _root_post_backward_final_callback
    state_cls._pre_forward = _pre_forward
    state_cls._pre_backward = _pre_backward


def _patch_prefetch(group_cls: Any) -> None:
    """FSDPParamGroup: the first forward's post-forward order (the implicit backward
    prefetch), and every prefetch, explicit or implicit, through the session."""
    original_record_post_forward = group_cls._record_post_forward
    original_prefetch_unshard = group_cls._prefetch_unshard

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

    group_cls._record_post_forward = _record_post_forward
    group_cls._prefetch_unshard = staticmethod(_prefetch_unshard)


def _patch_order(group_cls: Any, training_state: Any, dynamo_disable: Any) -> None:
    """FSDPParamGroup: the order record (first steps only): who unsharded each group, its
    uses, its reshards; and each use told to the stress while it measures."""
    original_unshard = group_cls.unshard
    original_group_pre_forward = group_cls.pre_forward
    original_group_pre_backward = group_cls.pre_backward

    def unshard(self: FSDPParamGroup, async_op: bool = False) -> None:
        order = _recording_order()
        if order is None:
            return original_unshard(self, async_op)
        starts = self._all_gather_result is None and not self.is_unsharded
        original_unshard(self, async_op)
        if starts and self._all_gather_result is not None:
            order.unshard(_adapter.group_name(self))

    def group_pre_forward(self: FSDPParamGroup, module, args, kwargs):
        _stress_use(self, vocab.FWD)  # before it waits on a prefetched all-gather
        result = original_group_pre_forward(self, module, args, kwargs)
        order = _recording_order()
        if order is not None:
            order.use(_adapter.group_name(self), "fwd")
        return result

    @dynamo_disable
    def group_pre_backward(self: FSDPParamGroup, default_prefetch: bool, *unused: Any):
        order = _recording_order()
        first = order is not None and self._training_state != training_state.PRE_BACKWARD
        if self._training_state != training_state.PRE_BACKWARD:
            _stress_use(self, vocab.BWD)
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

    group_cls.unshard = unshard
    group_cls.pre_forward = group_pre_forward
    group_cls.pre_backward = group_pre_backward
    group_cls._to_sharded = resharding(group_cls._to_sharded)
    group_cls._to_sharded_post_forward = resharding(group_cls._to_sharded_post_forward)


def _patch_unit_hooks(state_cls: Any, group_cls: Any, training_state: Any,
                      dynamo_disable: Any) -> None:
    """Each unit's own hooks told to the session's watchers (explain's tracer: which unit's
    scope an op runs in, where a prefetched unit waits on its unshard): the forward pre-
    and post-hooks, the backward pre-hook and post-backward, and the wait for an unshard.
    Without a watcher they pass straight through."""

    def module_of_state(state: FSDPState) -> Any:
        return state._modules[0] if state._modules else None

    def module_of_group(group: FSDPParamGroup) -> Any:
        state = _adapter.group_states.get(group) if _adapter is not None else None
        return module_of_state(state) if state is not None else None

    def phase_of_group(group: FSDPParamGroup) -> str:
        return vocab.BWD if group._training_state == training_state.PRE_BACKWARD else vocab.FWD

    def scoped(original: Any, hook: str, module_of: Any, phase_of: Any) -> Any:
        @dynamo_disable
        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            adapter = _adapter
            if adapter is None or not adapter.session.watchers:
                return original(self, *args, **kwargs)
            session, module, phase = adapter.session, module_of(self), phase_of(self)
            session.unit_hook(module, phase, hook, True)
            try:
                return original(self, *args, **kwargs)
            finally:
                session.unit_hook(module, phase, hook, False)

        return method

    forward, backward = (lambda _: vocab.FWD), (lambda _: vocab.BWD)
    state_cls._pre_forward = scoped(state_cls._pre_forward, "pre", module_of_state, forward)
    state_cls._post_forward = scoped(state_cls._post_forward, "post", module_of_state, forward)
    state_cls._pre_backward = scoped(state_cls._pre_backward, "pre", module_of_state, backward)
    group_cls.post_backward = scoped(group_cls.post_backward, "post", module_of_group, backward)
    group_cls.wait_for_unshard = scoped(group_cls.wait_for_unshard, "wait", module_of_group,
                                        phase_of_group)


def _finished_on_return(group: FSDPParamGroup) -> bool:
    """Whether the group's pending all-gather was already complete when its unshard returned.

    A synchronous collective (no work handle) on a host device: nothing overlaps it.
    On an accelerator a synchronous one still runs on its own stream.
    """
    result = group._all_gather_result
    return (result is not None and result.all_gather_work is None
            and getattr(group.device, "type", "cpu") == "cpu")


def _stress_use(group: FSDPParamGroup, phase: str) -> None:
    """Report a use to the stress while it measures the issue-to-use gaps."""
    adapter = _adapter
    stress = adapter.session.stress if adapter is not None else None
    if stress is not None and stress.measuring:
        stress.used(adapter.group_name(group), phase)


def _recording_order() -> Any:
    """The session's order log while it still records, else None."""
    adapter = _adapter
    return adapter.recording_order() if adapter is not None else None


def activate(session: Any) -> None:
    """Hook FSDP2 for this session (called by install() when torch.distributed.fsdp is imported).

    Raises NotActive with the one line refusing a torch the adapter does not support."""
    global _adapter
    if _adapter is not None:
        return
    refused = fsdp2_support.refusal(torch.__version__,
                                    fsdp2_support.lacking(fsdp2_support.NEEDED))
    if refused is not None:
        raise NotActive(refused)
    try:
        _patch_torch()
    except Exception as e:  # a name that resolves but is not what the adapter expects
        raise NotActive(f"{vocab.ADAPTER_NOT_ACTIVE}: torch {torch.__version__}: cannot hook "
                        f"FSDP2: {e!r}") from e
    _adapter = _Fsdp2Adapter(session)  # it listens to the session's steps and exit


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
