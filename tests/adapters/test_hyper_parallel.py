"""The hyper-parallel adapter: discovery, masking, probe, guard and gradient digests.

Fast tests drive the adapter in-process over a toy scheduler with hyper-parallel's
interface, and in a subprocess through a stand-in ``hyper_parallel`` package (the
import hook path). The MindSpore reference model trained under hyper-parallel's double
in-process, its gradient digests on real MindSpore tensors:
tests/e2e/test_mindspore_digests_in_process.py; the MindSpore reference workload through
msrun: tests/e2e/test_mindspore_workload_under_msrun.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bisect_prefetch.adapters import Session
from bisect_prefetch.adapters import hyper_parallel as hp
from bisect_prefetch.adapters.plan import parse_plan
from bisect_prefetch.graph import from_policy
from bisect_prefetch.judge.audit import audit_run_dir

REPO = Path(__file__).resolve().parents[2]
SITE = REPO / "bisect_prefetch" / "adapters" / "site"
STANDIN = REPO / "tests" / "jobs" / "hp_standin"  # a stand-in hyper_parallel package


# -- a toy scheduler with hyper-parallel's interface -----------------------------------
class ToyParam:
    def __init__(self, shard_size: int) -> None:
        self.shard_size = shard_size
        self.async_calls = 0

    def unshard(self, async_op: bool = False) -> None:
        self.async_calls += async_op


class ToyState:
    def __init__(self, shard_size: int) -> None:
        self.hsdp_params = [ToyParam(shard_size), ToyParam(shard_size)]
        self.sharded_hsdp_params = self.hsdp_params
        self.is_shard = True

    def prefetch(self) -> None:
        for param in self.sharded_hsdp_params:
            param.unshard(True)


class ToyModule:
    def __init__(self, children: dict[str, ToyModule] | None = None) -> None:
        self.children = children or {}

    def named_modules(self):
        yield "", self
        yield from self.children.items()


class ToyScheduler:
    def __init__(self, module: ToyModule, shard_size: int) -> None:
        module.hsdp_scheduler = self
        self.cell = module
        self.hsdp_state = ToyState(shard_size)
        self.forward_prefetch_cells: list = []
        self.backward_prefetch_cells: list = []

    def set_forward_prefetch_cells(self, hsdp_cell_list) -> None:
        self.forward_prefetch_cells = hsdp_cell_list

    def set_backward_prefetch_cells(self, hsdp_cell_list) -> None:
        self.backward_prefetch_cells = hsdp_cell_list

    def _hsdp_forward_pre_hook(self, cell, args) -> None:
        for target in self.forward_prefetch_cells:
            target.hsdp_scheduler.hsdp_state.prefetch()

    def _hsdp_backward_pre_hook(self, cell, grad_outputs) -> None:
        for target in self.backward_prefetch_cells:
            target.hsdp_scheduler.hsdp_state.prefetch()


class ToyCell(ToyModule):
    """A module that walks its children as a MindSpore Cell does."""

    def cells_and_names(self):
        return self.named_modules()


def toy_model(shard_size: int = 1, module: type = ToyModule) -> tuple[ToyModule, list[ToyModule]]:
    layers = [module() for _ in range(3)]
    root = module({f"layers.{i}": layer for i, layer in enumerate(layers)})
    for module in [*layers, root]:
        ToyScheduler(module, shard_size)
    for a, b in zip(layers, layers[1:], strict=False):
        a.hsdp_scheduler.set_forward_prefetch_cells([b])
        b.hsdp_scheduler.set_backward_prefetch_cells([a])
    return root, layers


def one_step(root: ToyModule, layers: list[ToyModule]) -> None:
    """The hooks in the order a step runs them."""
    for module in [root, *layers]:
        module.hsdp_scheduler._hsdp_forward_pre_hook(module, ())
    for module in reversed(layers):
        module.hsdp_scheduler._hsdp_backward_pre_hook(module, None)


@pytest.fixture
def adapter_with(monkeypatch, tmp_path):
    hp.patch_scheduler_class(ToyScheduler)

    def make(mask=None, guard="none", **fields) -> hp.HyperParallelAdapter:
        plan = {"version": 1, "out_dir": str(tmp_path), "mask": mask, "guard": guard, **fields}
        adapter = hp.HyperParallelAdapter(Session(parse_plan(plan), rank=0))
        monkeypatch.setattr(hp, "_adapter", adapter)
        return adapter

    return make


def test_discovery_names_units_and_writes_the_graph(adapter_with, tmp_path):
    adapter = adapter_with()
    root, layers = toy_model(shard_size=4)
    one_step(root, layers)
    graph = json.loads((tmp_path / "graph.rank0.json").read_text())
    assert [(n["name"], n["kind"], n["shard_size"]) for n in graph["nodes"]] == [
        ("root", "root", 4), ("layers.0", "layer", 4), ("layers.1", "layer", 4),
        ("layers.2", "layer", 4),
    ]
    assert sorted(e["id"] for e in graph["edges"]) == sorted(
        from_policy("fsdp2-chain", 3).edge_ids()
    )
    assert adapter.session.tally.edges["bwd:layers.2->layers.1"]["issued"] == 1


def test_the_mask_is_applied_once_at_the_gate_and_the_lists_stay_as_given(adapter_with):
    adapter = adapter_with(mask=["fwd:layers.0->layers.1", "bwd:layers.1->layers.0"])
    root, layers = toy_model()
    one_step(root, layers)
    # The scheduler keeps every target; the gate decides per prefetch.
    assert layers[1].hsdp_scheduler.forward_prefetch_cells == [layers[2]]
    assert layers[2].hsdp_scheduler.backward_prefetch_cells == [layers[1]]
    assert layers[1].hsdp_scheduler.hsdp_state.hsdp_params[0].async_calls == 1  # from layers.0
    assert layers[2].hsdp_scheduler.hsdp_state.hsdp_params[0].async_calls == 0  # masked
    tally = adapter.session.tally.edges
    assert tally["bwd:layers.2->layers.1"] == {
        "fired": 1, "issued": 0, "noop": 0, "masked": 1, "guarded": 0
    }
    assert tally["fwd:layers.1->layers.2"]["masked"] == 1
    extra = adapter.session.probe_extra["hyper_parallel"]["edges"]
    assert extra["bwd:layers.2->layers.1"]["async_unshards"] == 0
    assert extra["bwd:layers.1->layers.0"]["async_unshards"] == 2


def test_a_list_set_after_discovery_is_graphed_and_gated(adapter_with, tmp_path):
    adapter = adapter_with(mask=[])
    root, layers = toy_model()
    one_step(root, layers)
    layers[0].hsdp_scheduler.set_forward_prefetch_cells([layers[2]])
    assert layers[0].hsdp_scheduler.forward_prefetch_cells == [layers[2]]
    layers[0].hsdp_scheduler._hsdp_forward_pre_hook(layers[0], ())
    assert adapter.session.tally.edges["fwd:layers.0->layers.2"]["masked"] == 1
    adapter.on_step_end(1)
    graph = json.loads((tmp_path / "graph.rank0.json").read_text())
    assert "fwd:layers.0->layers.2" in {e["id"] for e in graph["edges"]}


def test_the_production_adapter_names_no_test_double():
    assert not any("workloads" in m or "double" in m for m in hp.SCHEDULER_MODULES)
    source = Path(hp.__file__).read_text()
    assert "hsdp_double" not in source


def test_guard_skips_size_one_targets(adapter_with):
    adapter = adapter_with(guard="size-one")
    root, layers = toy_model(shard_size=1)
    one_step(root, layers)
    states = [layer.hsdp_scheduler.hsdp_state for layer in layers]
    assert all(p.async_calls == 0 for state in states for p in state.hsdp_params)
    assert {c["guarded"] for c in adapter.session.tally.edges.values()} == {1}


def test_guard_keeps_sharded_targets(adapter_with):
    adapter = adapter_with(guard="size-one")
    root, layers = toy_model(shard_size=2)
    one_step(root, layers)
    assert {c["issued"] for c in adapter.session.tally.edges.values()} == {1}


def test_prefetch_outside_a_hook_is_not_an_edge_but_is_guarded(adapter_with):
    adapter = adapter_with(guard="size-one")
    root, layers = toy_model(shard_size=1)
    one_step(root, layers)
    state = layers[0].hsdp_scheduler.hsdp_state
    state.prefetch()  # e.g. a user's unshard(async_op=True)
    assert state.hsdp_params[0].async_calls == 0
    assert all("?" not in edge for edge in adapter.session.tally.edges)


# -- a schedule of masks: switched at step boundaries, unless the engine compiles the hooks --
SCHEDULE = [{"first_step": 1, "mask": []},
            {"first_step": 2, "mask": ["fwd:layers.0->layers.1", "bwd:layers.2->layers.1"]}]


def _scheduled_steps(adapter_with, tmp_path, module: type) -> dict:
    """Three steps of the toy under SCHEDULE (steps end at report_step: it has no optimizer)."""
    adapter = adapter_with(mask=[], schedule=SCHEDULE)
    root, layers = toy_model(shard_size=2, module=module)
    for step in (1, 2, 3):
        one_step(root, layers)
        adapter.session.report_step(step, {"loss": 1.0})
    adapter.session.close()
    return json.loads((tmp_path / "probe.rank0.json").read_text())


def test_the_schedule_switches_masks_at_step_boundaries(adapter_with, tmp_path):
    probe = _scheduled_steps(adapter_with, tmp_path, ToyModule)  # torch backend: eager hooks
    assert probe["schedule_followed"] == [[0, 1], [1, 2]] and "schedule_refused" not in probe
    steps = {entry["step"]: entry for entry in probe["steps"]}
    assert steps[1]["issued"] == []
    for step in (2, 3):
        assert set(steps[step]["issued"]) == set(SCHEDULE[1]["mask"])


@pytest.mark.mindspore
@pytest.mark.parametrize("graph_mode", [True, False])
def test_under_mindspore_graph_mode_the_schedule_is_refused(adapter_with, tmp_path, graph_mode):
    """In graph mode the hooks run when the graph is compiled: the gate's decisions then are
    every step's, so the adapter keeps segment 0's mask and says why."""
    ms = pytest.importorskip("mindspore")
    before = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE if graph_mode else ms.PYNATIVE_MODE)
    try:
        probe = _scheduled_steps(adapter_with, tmp_path, ToyCell)
    finally:
        ms.set_context(mode=before)
    if graph_mode:
        assert "MindSpore graph mode" in probe["schedule_refused"]
        assert probe["schedule_followed"] == [[0, 1]]
        assert all(entry["issued"] == [] for entry in probe["steps"])  # segment 0: all off
    else:
        assert "schedule_refused" not in probe
        assert probe["schedule_followed"] == [[0, 1], [1, 2]]


FAKE_JOB = '''
import hyper_parallel  # the adapter activates here
from hyper_parallel.core.fully_shard.hsdp_scheduler import HSDPSchedulerV2
from bisect_prefetch.adapters import report_step


class Module:
    def __init__(self, children=None):
        self.children = children or {}

    def named_modules(self):
        yield "", self
        yield from self.children.items()


layers = [Module(), Module()]
root = Module({"layers.0": layers[0], "layers.1": layers[1]})
for module in [*layers, root]:
    HSDPSchedulerV2(module)
layers[1].hsdp_scheduler.set_backward_prefetch_cells([layers[0]])
for module in [root, *layers]:
    module.hsdp_scheduler._hsdp_forward_pre_hook(module, ())
layers[1].hsdp_scheduler._hsdp_backward_pre_hook(layers[1], None)
report_step(1, loss=1.0)
'''


def test_importing_hyper_parallel_activates_the_adapter(tmp_path):
    (tmp_path / "job.py").write_text(textwrap.dedent(FAKE_JOB))
    plan = {"version": 1, "out_dir": str(tmp_path), "mask": [], "guard": "none"}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SITE), str(REPO), str(STANDIN)]),
        "BISECT_PREFETCH_PLAN": str(tmp_path / "plan.json"),
    }
    done = subprocess.run(
        [sys.executable, str(tmp_path / "job.py")], env=env, capture_output=True, text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "bisect-prefetch" not in done.stderr
    graph = json.loads((tmp_path / "graph.rank0.json").read_text())
    assert [e["id"] for e in graph["edges"]] == ["bwd:layers.1->layers.0"]
    assert [(n["name"], n["shard_size"]) for n in graph["nodes"]] == [
        ("root", 2), ("layers.0", 2), ("layers.1", 2),
    ]
    probe = json.loads((tmp_path / "probe.rank0.json").read_text())
    assert probe["edges"]["bwd:layers.1->layers.0"]["masked"] == 1
    assert probe["hyper_parallel"]["units"]["layers.0"]["params_with_shard_size"] == 0


def test_older_lineage_prefetch_of_a_sharded_unit_is_counted_as_issued(adapter_with):
    """prefetch_unsharded() is the older lineage's early gather: counted, never 'lost'."""
    adapter = adapter_with()
    root, layers = toy_model(shard_size=2)
    for layer in layers:
        state = layer.hsdp_scheduler.hsdp_state
        for param in state.hsdp_params:
            param.prefetch_unsharded = lambda: None
            param.param = object()
        # The older state's prefetch: prefetch_unsharded() on each sharded parameter.
        state.prefetch = lambda state=state: [p.prefetch_unsharded()
                                              for p in state.sharded_hsdp_params]
    one_step(root, layers)
    facts = adapter.session.probe_extra["hyper_parallel"]
    assert facts["units"]["layers.1"]["lineage"] == "hsdp"
    assert facts["edges"]["fwd:layers.0->layers.1"]["async_unshards"] == 2
    assert adapter.session.tally.edges["fwd:layers.0->layers.1"]["issued"] == 1


def test_a_version_neither_lineage_fits_is_named_once(adapter_with):
    adapter = adapter_with()
    root, layers = toy_model(shard_size=2)
    for module in [root, *layers]:
        state = module.hsdp_scheduler.hsdp_state
        state.prefetch = lambda: None  # this build gathers some other way
        for param in state.hsdp_params:
            param.unshard = None  # neither unshard nor prefetch_unsharded
    one_step(root, layers)
    line = adapter.session.probe_extra["hyper_parallel"]["unrecognized"]
    assert line.startswith("hyper-parallel ") and "is not a version the adapter recognizes" in line
    assert "parameter.unshard (fully_shard), parameter.prefetch_unsharded (hsdp)" in line
    assert adapter.session.errors == [line]


def test_a_step_with_no_tensor_found_is_recorded_and_withdraws_the_bitwise_claim(
        adapter_with, tmp_path):
    from bisect_prefetch.judge.signals import describe_signals, identical_wording, run_signals

    adapter = adapter_with(record={"digests": "*", "digest_every": 1})
    root, layers = toy_model(shard_size=2)
    root.named_parameters = lambda: iter(())
    for module in [root, *layers]:  # a build whose units list no parameter the adapter reads
        state = module.hsdp_scheduler.hsdp_state
        state.hsdp_params = state.sharded_hsdp_params = []
    one_step(root, layers)
    adapter.on_update(1)
    adapter.session.clock.steps = 1
    adapter.session.write_probe()
    summary = adapter.session.probe_extra["digests"]
    assert summary["fewest_tensors"] == 0 and "hyper-parallel's units" in summary["nothing_digested"]
    signals = run_signals(tmp_path, metric_files=[], fmt="jsonl", names=["loss"])
    assert "bitwise" not in identical_wording([signals])
    assert "rank 0: 0 tensors digested: the adapter found no parameter tensors in " \
           "hyper-parallel's units" in describe_signals(signals)
    # The audit says the units' parameter counts are not the build's.
    assert audit_run_dir(tmp_path)["units_without_params"] == [
        "layers.0", "layers.1", "layers.2", "root"]
