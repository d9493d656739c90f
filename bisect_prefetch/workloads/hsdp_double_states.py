"""The FSDP states of hyper-parallel's test double, one per lineage, with no framework of
their own: the parameters they hold do the gathering (MindSpore in workloads/hsdp_double.py,
torch in workloads/hsdp_double_torch.py). What each follows in hyper-parallel's source is
said in those modules' docstrings.
"""

from __future__ import annotations

from typing import Any

# The build's own prefetch guard: none (the reported bug) or the upstream fix,
# which skips a prefetch when no parameter has `shard_size > 1`.
BUILD_GUARDS = ("none", "shard-size")


class _StateCommon:
    """What both lineages' states share: the parameters, is_shard and shard()."""

    def __init__(self, params: list[Any], sharded: list[Any]) -> None:
        self.hsdp_params = params
        self.sharded_hsdp_params = sharded
        self.is_shard = True

    def shard(self) -> None:
        if not self.is_shard:
            for param in self.sharded_hsdp_params:
                param.to_sharded()
            self.is_shard = True


class HSDPStateDouble(_StateCommon):
    """The newer lineage's state (core/fully_shard/hsdp_state.py): its shard/unshard cycle."""

    def __init__(self, params: list[Any], *, build_guard: str = "none") -> None:
        if build_guard not in BUILD_GUARDS:
            raise ValueError(f"build_guard must be one of {BUILD_GUARDS}")
        super().__init__(params, list(params))
        self.build_guard = build_guard
        self.module_name: str | None = None

    def unshard(self, async_op: bool = False, unshard_replicate: bool = True) -> None:
        if not self.is_shard:
            return
        for param in self.sharded_hsdp_params:
            param.unshard(async_op)
        if not async_op:
            self.wait_for_unshard()

    def wait_for_unshard(self) -> None:
        if not self.is_shard:
            return
        for param in self.sharded_hsdp_params:
            param.wait_for_unshard()
        self.is_shard = False

    def prefetch(self, unshard_replicate: bool = True) -> None:
        if self.build_guard == "shard-size" and not any(
            getattr(param, "shard_size", 1) > 1 for param in self.sharded_hsdp_params
        ):
            return  # the upstream fix, as written against the older parameter line
        self.unshard(async_op=True, unshard_replicate=unshard_replicate)


class HSDPStateV1Double(_StateCommon):
    """The older lineage's state (core/hsdp/hsdp_state.py): only sharded parameters are
    unsharded or prefetched; ``unshard()`` takes no async_op, ``prefetch()`` calls each
    sharded parameter's ``prefetch_unsharded()``, and there is no ``wait_for_unshard``."""

    def __init__(self, params: list[Any]) -> None:
        super().__init__(params, [p for p in params if p.sharded])

    def unshard(self) -> None:
        if not self.is_shard:
            return
        for param in self.sharded_hsdp_params:
            param.to_unsharded()
        self.is_shard = False

    def prefetch(self) -> None:
        if not self.is_shard:
            return
        for param in self.sharded_hsdp_params:
            param.prefetch_unsharded()
