"""Contract tests for size-one prefetch, in the style of hyper-parallel's own unit tests.

States are built without devices: the test double's HSDPStateDouble over mock
parameters, with the state's ``unshard`` mocked, so each test sees exactly
which ``unshard(async_op=True)`` calls a prefetch makes. The guard under test
is the adapter's (plan ``guard: size-one``); the double's ``build_guard`` is
the upstream fix as written, to show the refactor pitfall it has.
"""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")

from bisect_prefetch.adapters import Session  # noqa: E402
from bisect_prefetch.adapters import hyper_parallel as hp  # noqa: E402
from bisect_prefetch.adapters.plan import parse_plan  # noqa: E402
from bisect_prefetch.workloads.hsdp_double import HSDPParamDouble, HSDPStateDouble  # noqa: E402

EDGE = "bwd:decoder.layers.1->decoder.layers.0"


def older_param(shard_size: int) -> mock.Mock:
    """A parameter of the older line: shard_size from _init_group_infos()."""
    param = mock.Mock(spec=["unshard", "shard_size", "shard_world_size", "is_sharded"])
    param.shard_size = shard_size
    param.shard_world_size = shard_size
    param.is_sharded = shard_size > 1
    return param


def refactored_param(shard_world_size: int, *, is_sharded: bool) -> mock.Mock:
    """A parameter of the later refactor: no shard_size attribute at all."""
    param = mock.Mock(spec=["unshard", "shard_world_size", "is_sharded"])
    param.shard_world_size = shard_world_size
    param.is_sharded = is_sharded
    return param


def state_of(params, *, build_guard: str = "none") -> HSDPStateDouble:
    state = HSDPStateDouble(list(params), build_guard=build_guard)
    state.unshard = mock.Mock(name="unshard")
    return state


class FakeCell:
    """Just enough of a module tree for discovery: named_modules() over flat fqns."""

    def __init__(self, children: dict[str, FakeCell] | None = None) -> None:
        self.children = children or {}

    def named_modules(self):
        yield "", self
        yield from self.children.items()


class FakeScheduler:
    """A scheduler's attributes the adapter reads; no hooks (the test plays them)."""

    def __init__(self, cell: FakeCell, state: HSDPStateDouble | None) -> None:
        self.cell = cell
        self.hsdp_state = state
        self.forward_prefetch_cells: list = []
        self.backward_prefetch_cells: list = []
        cell.hsdp_scheduler = self

    def set_forward_prefetch_cells(self, cells: list) -> None:
        self.forward_prefetch_cells = cells

    def set_backward_prefetch_cells(self, cells: list) -> None:
        self.backward_prefetch_cells = cells


def guarded_prefetch(state: HSDPStateDouble, *, guard: str = "size-one", **kwargs) -> Session:
    """Prefetch ``state`` (decoder.layers.0) from layer 1's backward hook under ``guard``."""
    session = Session(parse_plan({"version": 1, "guard": guard, "mask": None}), rank=0)
    adapter = hp.HyperParallelAdapter(session)
    target, source = FakeCell(), FakeCell()
    root = FakeCell({"decoder.layers.0": target, "decoder.layers.1": source})
    FakeScheduler(target, state)
    FakeScheduler(source, None)
    adapter.discover(FakeScheduler(root, None))
    with adapter.running_hook(source.hsdp_scheduler, "bwd"):
        state.prefetch(**kwargs)
    return session


def test_unguarded_size_one_prefetch_issues_an_async_unshard():
    # The reported bug, as the double reproduces it: nothing stops a size-one prefetch.
    state = state_of([older_param(1)])
    session = guarded_prefetch(state, guard="none")
    state.unshard.assert_called_once_with(async_op=True, unshard_replicate=True)
    assert session.tally.edges[EDGE]["guarded"] == 0


def test_size_one_state_prefetch_does_not_unshard_async():
    state = state_of([older_param(1), older_param(1)])
    session = guarded_prefetch(state)
    state.unshard.assert_not_called()
    assert session.tally.edges[EDGE] == {
        "fired": 1, "issued": 0, "noop": 0, "masked": 0, "guarded": 1
    }


def test_sharded_state_still_prefetches_once_with_the_same_arguments():
    state = state_of([older_param(4)])
    guarded_prefetch(state, unshard_replicate=False)
    state.unshard.assert_called_once_with(async_op=True, unshard_replicate=False)


def test_mixed_state_still_prefetches():
    state = state_of([older_param(1), older_param(4), older_param(1)])
    guarded_prefetch(state)
    state.unshard.assert_called_once_with(async_op=True, unshard_replicate=True)


def test_param_without_shard_size_uses_shard_world_size_when_sharded():
    state = state_of([refactored_param(4, is_sharded=True)])
    guarded_prefetch(state)
    state.unshard.assert_called_once_with(async_op=True, unshard_replicate=True)


def test_param_without_shard_size_that_is_not_sharded_is_size_one():
    state = state_of([refactored_param(4, is_sharded=False)])
    guarded_prefetch(state)
    state.unshard.assert_not_called()


def test_shard_size_wins_over_shard_world_size():
    # shard_world_size can carry tensor-parallel sharding; the FSDP group is shard_size.
    param = older_param(1)
    param.shard_world_size = 2
    param.is_sharded = True
    assert hp.param_shard_size(param) == 1
    state = state_of([param])
    guarded_prefetch(state)
    state.unshard.assert_not_called()


def test_state_shard_size_reads_sharded_params_where_present():
    state = SimpleNamespace(sharded_hsdp_params=[older_param(1)], hsdp_params=[older_param(8)])
    assert hp.state_shard_size(state) == 1
    state = SimpleNamespace(hsdp_params=[older_param(8)])
    assert hp.state_shard_size(state) == 8
    assert hp.state_shard_size(SimpleNamespace()) == 1


@pytest.mark.parametrize(
    ("params", "prefetches"),
    [
        ([older_param(1)], False),
        ([older_param(4)], True),
        ([older_param(1), older_param(4)], True),
        # The refactor pitfall: getattr(param, "shard_size", 1) is 1 for real FSDP params.
        ([refactored_param(4, is_sharded=True)], False),
    ],
)
def test_upstream_fix_as_written_and_its_refactor_pitfall(params, prefetches):
    state = state_of(params, build_guard="shard-size")
    state.prefetch()
    assert state.unshard.called is prefetches


def test_probe_counts_param_level_async_unshards():
    # Real state.unshard this time: each of its params gets unshard(async_op=True) once.
    params = [older_param(1), older_param(1), older_param(1)]
    unshards = [param.unshard for param in params]  # the adapter wraps them
    state = HSDPStateDouble(params)
    session = guarded_prefetch(state, guard="none")
    for unshard in unshards:
        unshard.assert_called_once_with(True)
    extra = session.probe_extra["hyper_parallel"]
    assert extra["edges"][EDGE] == {"async_unshards": 3, "already_unsharded": 0}
    assert extra["units"]["decoder.layers.0"]["size_one"] is True
    assert session.tally.edges[EDGE]["issued"] == 1


def test_prefetch_into_an_unsharded_state_is_a_noop():
    param = older_param(1)
    unshard = param.unshard
    state = HSDPStateDouble([param])
    state.is_shard = False  # already unsharded by its own pre-hook
    session = guarded_prefetch(state, guard="none")
    unshard.assert_not_called()
    assert session.tally.edges[EDGE]["noop"] == 1
    assert session.probe_extra["hyper_parallel"]["edges"][EDGE]["already_unsharded"] == 1


def test_double_size_one_prefetch_is_a_local_copy_that_the_own_unshard_repeats():
    # The mechanism of the report, on real MindSpore tensors (one process, no collective).
    full = ms.Parameter(ms.Tensor(np.arange(6, dtype=np.float32).reshape(2, 3)), name="w")
    param = HSDPParamDouble(full, shard_world_size=1, shard_rank=0)
    state = HSDPStateDouble([param])
    copies = []
    get_data = param._get_unsharded_param_data

    def counted(async_op):
        copies.append(async_op)
        return get_data(async_op)

    param._get_unsharded_param_data = counted
    state.prefetch()
    assert (copies, param.prefetch_handle, state.is_shard) == ([True], None, True)
    state.unshard()  # the unit's own pre-hook: no handle pending, so it copies again
    assert copies == [True, False]
    assert state.is_shard is False
    np.testing.assert_array_equal(full.asnumpy(), param.sharded_param.asnumpy())
    assert (param.shard_size, param.is_sharded) == (1, False)


def test_double_parameter_lines():
    def make(source):
        full = ms.Parameter(ms.Tensor(np.zeros((4, 2), dtype=np.float32)), name="w")
        return HSDPParamDouble(full, shard_world_size=1, shard_rank=0, shard_size_source=source)

    assert make("shard_size").shard_size == 1
    refactored = make("shard_world_size")
    assert not hasattr(refactored, "shard_size")
    assert (refactored.shard_world_size, refactored.is_sharded) == (1, False)
