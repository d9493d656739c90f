"""The hyper-parallel adapter: discovery, masking, probe, guard and gradient digests.

Fast tests drive the adapter in-process over a toy scheduler with hyper-parallel's
interface, and in a subprocess through a stand-in ``hyper_parallel`` package (the
import hook path). The digest tests train the MindSpore reference model under
hyper-parallel's test double in-process, on real MindSpore tensors. Slow tests run the
MindSpore reference workload through msrun: 1 rank (every unit size-one) and
2 ranks (every unit sharded over 2, real AllGathers).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bisect_prefetch.adapters import Session
from bisect_prefetch.adapters import hyper_parallel as hp
from bisect_prefetch.adapters.plan import parse_plan
from bisect_prefetch.graph import from_policy
from bisect_prefetch.judge.audit import audit_run_dir
from bisect_prefetch.metrics.digests import compare_digest_files
from bisect_prefetch.metrics.localize import compare_run_digests
from tests.conftest import rank_lines

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


# -- gradient digests, on real MindSpore tensors ---------------------------------------
DIGEST_FIELDS = {"step", "rank", "param", "digest", "norm", "max_abs"}
NUDGED_PARAM = "decoder.layers.0.attention.qkv.weight"  # 12 KiB: its digest samples it


def mindspore_digest_run(out_dir: Path, monkeypatch, *, nudge_step: int | None = None,
                         lineage: str = "fully_shard", shard_size: int = 2) -> dict:
    """Three steps of the reference GPT under hyper-parallel's double, in this process.

    lineage hsdp: the older lineage with shard size 2 asked for and every parameter under
    the threshold (so of shard size 1, with the prefetching hooks registered), as a job
    with small parameters gets on one host.

    Each step leaves every parameter's shard gradient where the lineage leaves it
    (``sharded_param.grad``; the older lineage: ``param.grad``), then calls the optimizer (the adapter digests
    the gradients and values before the update). nudge_step: at that step, one element of NUDGED_PARAM's gradient moves by
    one ulp. Returns the last step's gradients by parameter name.
    """
    ms = pytest.importorskip("mindspore")
    import numpy as np

    from bisect_prefetch.workloads import hsdp_double
    from bisect_prefetch.workloads import mindspore as workload

    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    hp.patch_scheduler_class(hsdp_double.HSDPSchedulerDouble)
    hp.patch_scheduler_class(hsdp_double.HSDPSchedulerV1Double)
    plan = {"version": 1, "out_dir": str(out_dir), "mask": None, "guard": "none",
            "record": {"digests": "*", "digest_every": 1}}
    session = Session(parse_plan(plan), rank=0)
    adapter = hp.HyperParallelAdapter(session)  # it hooks the optimizer: no step call of ours
    monkeypatch.setattr(hp, "_adapter", adapter)

    model = workload.GPT(layers=2)
    rng = np.random.RandomState(7)  # the same weights in every run of this process
    for _, param in model.parameters_and_names():
        param.set_data(ms.Tensor((0.1 * rng.standard_normal(param.shape)).astype(np.float32)))
    params = workload.shard_model(model, world_size=1, rank=0, shard_size_source="shard_size",
                                  build_guard="none", lineage=lineage, shard_size=shard_size,
                                  threshold=1 << 30)
    optimizer = ms.nn.Adam([p.trained_param for p in params], learning_rate=1e-2)
    loss_fn = ms.nn.CrossEntropyLoss()
    grad_fn = ms.value_and_grad(lambda ids, targets: loss_fn(model(ids).reshape(-1, workload.VOCAB),
                                                             targets),
                                None, [p.cell_param for p in params])
    last: dict[str, np.ndarray] = {}
    for step, (ids, targets) in enumerate(workload.fixed_batches(7, 0)[:3], start=1):
        loss, grads = grad_fn(ids, targets)
        grads = [g.asnumpy() for g in grads]
        for param, grad in zip(params, grads, strict=True):
            if step == nudge_step and param.cell_param.name == NUDGED_PARAM:
                grad.reshape(-1)[0] = np.nextafter(grad.reshape(-1)[0], np.float32(np.inf))
            param.leave_gradient(ms.Tensor(grad))
            last[param.cell_param.name] = grad
        optimizer(tuple(ms.Tensor(last[param.cell_param.name]) for param in params))
        session.report_step(step, {"loss": float(loss.asnumpy())})
    session.close()
    return last


LINEAGES = ("fully_shard", "hsdp")


@pytest.mark.mindspore
@pytest.mark.parametrize("lineage", LINEAGES)
def test_digests_of_mindspore_gradients_are_the_lines_the_orchestrator_reads(
        tmp_path, monkeypatch, lineage):
    from bisect_prefetch.adapters.numpy_digest import array_digest
    from bisect_prefetch.metrics.digests import parse_digest_line
    from bisect_prefetch.metrics.localize import unit_of, units_in_graph
    from bisect_prefetch.vocab import VALUE_SUFFIX

    grads = mindspore_digest_run(tmp_path, monkeypatch, lineage=lineage)
    lines = rank_lines(tmp_path, "digests")
    assert len(lines) == 3 * 2 * len(grads)  # each parameter's gradient and value
    assert all(set(json.loads(line)) == DIGEST_FIELDS for line in lines)
    records = [parse_digest_line(line) for line in lines]
    assert [r.step for r in records] == [s for s in (1, 2, 3) for _ in range(2 * len(grads))]
    values = {name + VALUE_SUFFIX for name in grads}
    assert {r.param for r in records} == set(grads) | values and {r.rank for r in records} == {0}
    # Every parameter lies in a unit of the graph (the names come from the same walk).
    units = units_in_graph(tmp_path / "graph.rank0.json")
    assert {unit_of(r.param, units) for r in records} == set(units) - {"root"}
    last = [r for r in records if r.step == 3 and r.param in grads]
    assert len(last) == len(grads)
    for record in last:
        assert record.digest == array_digest(grads[record.param].reshape(-1))
        grad = grads[record.param].astype("float64")
        assert record.norm == pytest.approx(float((grad**2).sum() ** 0.5), rel=1e-12)
        assert record.max_abs == float(abs(grads[record.param]).max())


@pytest.mark.mindspore
@pytest.mark.parametrize("lineage", LINEAGES)
def test_mindspore_digests_are_reproducible_and_see_a_one_ulp_change(tmp_path, monkeypatch,
                                                                     lineage):

    runs = {name: tmp_path / name for name in ("a", "b", "nudged")}
    mindspore_digest_run(runs["a"], monkeypatch, lineage=lineage)
    grads = mindspore_digest_run(runs["b"], monkeypatch, lineage=lineage)
    mindspore_digest_run(runs["nudged"], monkeypatch, nudge_step=2, lineage=lineage)
    a, b = (runs[name] / "digests.rank0.jsonl" for name in ("a", "b"))
    assert a.read_text() == b.read_text()  # same inputs, same bytes, same lines
    result = compare_digest_files(a, runs["nudged"] / "digests.rank0.jsonl")
    assert result.first_diff_step == 2
    assert result.at_first == [(0, NUDGED_PARAM)]
    assert result.spread[2] == 1  # exactly that parameter's digest at that step
    assert result.records_compared == 3 * 2 * len(grads)
    assert result.missing_in_a == result.missing_in_b == 0


@pytest.mark.mindspore
def test_older_lineage_size_one_units_are_found_digested_and_their_prefetch_is_no_guard(
        tmp_path, monkeypatch):
    grads = mindspore_digest_run(tmp_path, monkeypatch, lineage="hsdp")
    probe = json.loads((tmp_path / "probe.rank0.json").read_text())
    units = probe["hyper_parallel"]["units"]
    assert {u["lineage"] for u in units.values()} == {"hsdp"}
    assert all(u["shard_size"] == 1 and u["size_one"] for u in units.values())
    assert sum(u["params"] for u in units.values()) == len(grads)  # not 0: param, not sharded_param
    assert probe["digests"]["fewest_tensors"] == 2 * len(grads)  # gradients and values
    # Prefetches fired into size-one units and started nothing: by construction, not a guard.
    edges = probe["hyper_parallel"]["edges"]
    assert edges and all(e["async_unshards"] == 0 for e in edges.values())
    result = audit_run_dir(tmp_path)
    assert result["guard"] == "not-needed"
    assert "no-op by construction" in result["guard_note"]
    assert result["units_without_params"] == []


@pytest.mark.mindspore
def test_older_lineage_with_shard_size_one_says_no_prefetch_hooks_were_registered(
        tmp_path, monkeypatch):
    from bisect_prefetch.runs.discover import engine_says

    mindspore_digest_run(tmp_path, monkeypatch, lineage="hsdp", shard_size=1)
    probe = json.loads((tmp_path / "probe.rank0.json").read_text())
    assert probe["hyper_parallel"]["no_prefetch_hooks"] == hp.NO_HOOKS
    assert not (tmp_path / "graph.rank0.json").exists()
    assert "digests" not in probe  # no unit found: nothing digested, so no bitwise claim
    (tmp_path / "probe.json").write_text(json.dumps({"ranks": {"0": probe}}))
    assert engine_says(tmp_path).startswith("every unit has shard size 1: hyper-parallel "
                                             "registered no prefetch hooks")


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


# -- the MindSpore reference workload through msrun -------------------------------------
MSRUN = Path(sys.executable).parent / "msrun"
LAYERS, STEPS = 2, 4
FAULT_EDGE = "bwd:decoder.layers.1->decoder.layers.0"


def mindspore_run(test):
    """Marks a test that runs the MindSpore workload through msrun."""
    for mark in (
        pytest.mark.slow,
        pytest.mark.mindspore,
        pytest.mark.skipif(not MSRUN.exists(), reason="msrun (mindspore) not installed"),
    ):
        test = mark(test)
    return test


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WorkloadRun:
    """One msrun of bisect_prefetch.workloads.mindspore under a plan, and what it recorded."""

    def __init__(self, run_dir: Path, ranks: int) -> None:
        self.dir = run_dir
        self.ranks = ranks

    def metrics(self) -> dict[tuple[int, int], dict]:
        lines = rank_lines(self.dir, "metrics")
        rows = [json.loads(line) for line in lines]
        return {(row["step"], row["rank"]): row for row in rows}

    def graph(self, rank: int = 0) -> dict:
        return json.loads((self.dir / f"graph.rank{rank}.json").read_text())

    def probe(self, rank: int = 0) -> dict:
        return json.loads((self.dir / f"probe.rank{rank}.json").read_text())

    def worker_log(self, rank: int = 0) -> str:
        return (self.dir / "logs" / f"worker_{rank}.log").read_text()


def run_workload(root: Path, name: str, *, ranks: int, mask=None, guard="none", args=()):
    run_dir = root / name
    run_dir.mkdir()
    plan = {"version": 1, "experiment": "test", "run_id": name, "out_dir": str(run_dir),
            "mask": mask, "guard": guard, "seed": 7, "steps": STEPS,
            "record": {"digests": "*", "digest_every": 1}}  # on by default in the tool
    (run_dir / "plan.json").write_text(json.dumps(plan))
    env = {
        **os.environ,
        "PATH": f"{MSRUN.parent}{os.pathsep}{os.environ.get('PATH', '')}",  # msrun runs `python`
        "PYTHONPATH": f"{SITE}{os.pathsep}{REPO}",
        "BISECT_PREFETCH_PLAN": str(run_dir / "plan.json"),
        "GLOG_v": "3",
    }
    command = [
        str(MSRUN), f"--worker_num={ranks}", f"--local_worker_num={ranks}",
        f"--master_port={free_port()}", "--join=True", f"--log_dir={run_dir / 'logs'}",
        "--cluster_time_out=60", "python", "-m", "bisect_prefetch.workloads.mindspore",
        "--layers", str(LAYERS), "--steps", str(STEPS), "--seed", "7", *args,
    ]
    with open(run_dir / "msrun.log", "w") as log:
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=240)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGINT)  # msrun kills its workers on SIGINT
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            pytest.fail(f"msrun run {name} timed out")
    run = WorkloadRun(run_dir, ranks)
    assert proc.returncode == 0, (run_dir / "msrun.log").read_text()[-3000:]
    return run


FAULT = ["--fault-edge", FAULT_EDGE, "--fault-hazard", "1"]
RUN_SPECS = {  # the 2-rank runs first: they take longest
    "two-ranks-guarded": {
        "ranks": 2, "guard": "size-one", "args": ["--shard-size-source", "shard_world_size"],
    },
    "two-ranks-pitfall": {
        "ranks": 2,
        "args": ["--build-guard", "shard-size", "--shard-size-source", "shard_world_size"],
    },
    "older-two-ranks": {"ranks": 2, "args": ["--lineage", "hsdp"]},
    "reference": {"ranks": 1},
    "older-one-rank": {"ranks": 1, "args": ["--lineage", "hsdp"]},
    "size-one-copy": {"ranks": 1, "args": [*FAULT, "--fault-mode", "size-one-copy"]},
    "size-one-copy-guarded": {
        "ranks": 1, "guard": "size-one", "args": [*FAULT, "--fault-mode", "size-one-copy"],
    },
    "nudge": {"ranks": 1, "args": [*FAULT, "--fault-mode", "nudge"]},
    "nudge-masked": {
        "ranks": 1,
        "mask": sorted(set(from_policy("mindformers", LAYERS).edge_ids()) - {FAULT_EDGE}),
        "args": [*FAULT, "--fault-mode", "nudge"],
    },
}
# An msrun spends most of its time waiting on its cluster (start-up, a 5 s exit poll): overlap.
CONCURRENT_RUNS = 4


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """All RUN_SPECS, started together on first use and shared by the tests below."""
    root = tmp_path_factory.mktemp("mindspore-runs")
    with ThreadPoolExecutor(max_workers=CONCURRENT_RUNS) as pool:
        futures = {
            name: pool.submit(run_workload, root, name, **spec) for name, spec in RUN_SPECS.items()
        }
        yield lambda name: futures[name].result()


def _edge_ids(graph: dict) -> set[str]:
    return {e["id"] for e in graph["edges"]}


@mindspore_run
def test_one_rank_discovers_the_mindformers_chain_every_edge_size_one(runs):
    run = runs("reference")
    graph = run.graph()
    assert _edge_ids(graph) == set(from_policy("mindformers", LAYERS).edge_ids())
    assert {n["name"]: n["shard_size"] for n in graph["nodes"] if n["kind"] != "root"} == {
        "embedding": 1, "decoder.layers.0": 1, "decoder.layers.1": 1,
        "decoder.final_layernorm": 1, "output_layer": 1,
    }
    probe = run.probe()
    extra = probe["hyper_parallel"]["edges"]
    for edge in _edge_ids(graph):
        assert probe["edges"][edge]["issued"] == STEPS
        assert extra[edge]["async_unshards"] > 0  # the redundant local copies of the bug
    result = audit_run_dir(run.dir)
    assert (result["guard"], result["ok"]) == ("absent", False)
    assert set(result["size_one_edges_unsharding"]) == _edge_ids(graph)


@mindspore_run
def test_one_rank_guard_stops_every_async_unshard_and_the_size_one_drift(runs):
    reference = runs("reference")
    assert runs("size-one-copy").metrics() != reference.metrics()
    guarded = runs("size-one-copy-guarded")
    probe = guarded.probe()
    assert all(n == {"async_unshards": 0, "already_unsharded": 0}
               for n in probe["hyper_parallel"]["edges"].values())
    assert {c["guarded"] for c in probe["edges"].values()} == {STEPS}
    assert guarded.metrics() == reference.metrics()  # bitwise: the drift is gone
    assert "nudged 0 times" in guarded.worker_log()
    result = audit_run_dir(guarded.dir)
    assert (result["guard"], result["ok"]) == ("present", True)


@mindspore_run
def test_masking_the_faulty_backward_edge_removes_the_drift(runs):
    reference = runs("reference")
    drifting = runs("nudge")
    steps_differing = [k for k, row in reference.metrics().items() if drifting.metrics()[k] != row]
    assert steps_differing and min(steps_differing)[0] <= 2
    masked = runs("nudge-masked")  # every edge on but the faulty one
    assert masked.metrics() == reference.metrics()
    # The workload leaves each shard's gradient where hyper-parallel does, so the adapter
    # digests it: the drift shows in the digests no later than in the metrics, and the
    # masked run's digests equal the reference's.
    digests = compare_run_digests(reference.dir, drifting.dir,
                                   metric_first_diff=min(steps_differing)[0])
    assert digests.records_compared >= STEPS and not digests.problems
    assert digests.first_diff_step is not None and digests.lead_steps >= 0
    same = compare_run_digests(reference.dir, masked.dir)
    assert same.first_diff_step is None and same.records_differing == 0
    counts = masked.probe()["edges"][FAULT_EDGE]
    assert (counts["issued"], counts["masked"]) == (0, STEPS)
    assert masked.probe()["hyper_parallel"]["edges"][FAULT_EDGE]["async_unshards"] == 0


@mindspore_run
def test_older_lineage_two_ranks_prefetch_gathers_and_every_rank_digests(runs):
    """hyper_parallel.hsdp's lineage over 2 ranks: prefetch_unsharded() starts real
    AllGathers (never read as lost prefetch), and param holds the digested tensors."""
    run = runs("older-two-ranks")
    assert run.graph(0) == run.graph(1)
    assert _edge_ids(run.graph()) == set(from_policy("mindformers", LAYERS).edge_ids())
    for rank in (0, 1):
        probe = run.probe(rank)
        units = probe["hyper_parallel"]["units"]
        assert {u["lineage"] for u in units.values()} == {"hsdp"}
        assert {u["shard_size"] for u in units.values() if u["params"]} == {2}
        assert all(e["async_unshards"] > 0 for e in probe["hyper_parallel"]["edges"].values())
        assert probe["digests"]["fewest_tensors"] > 0 and probe["digests"]["gradients"] > 0
    result = audit_run_dir(run.dir)
    assert result["real_prefetch_lost"] == [] and result["size_one_edges"] == []
    assert result["guard"] != "present" and result["ok"]


@mindspore_run
def test_older_lineage_one_rank_registers_no_prefetch_hooks_and_says_why(runs):
    run = runs("older-one-rank")
    probe = run.probe()
    assert probe["hyper_parallel"]["no_prefetch_hooks"] == hp.NO_HOOKS
    assert not (run.dir / "graph.rank0.json").exists()
    assert "registered no prefetch hooks" in (run.dir / "msrun.log").read_text() + run.worker_log()


@mindspore_run
def test_two_ranks_no_unit_is_size_one_and_the_guard_keeps_all_gathers(runs):
    # The later parameter line (no shard_size): the guard must read shard_world_size.
    run = runs("two-ranks-guarded")
    assert run.graph(0) == run.graph(1)
    for rank in (0, 1):
        probe = run.probe(rank)
        units = probe["hyper_parallel"]["units"]
        assert {u["shard_size"] for name, u in units.items() if name != "root"} == {2}
        assert {u["params_with_shard_size"] for u in units.values()} == {0}
        assert {c["guarded"] for c in probe["edges"].values()} == {0}
        assert all(c["issued"] == STEPS for c in probe["edges"].values())
        assert all(n["async_unshards"] > 0 for n in probe["hyper_parallel"]["edges"].values())
        assert len(set(probe["plan_hashes"])) == 1
    metrics = run.metrics()
    assert {rank for _, rank in metrics} == {0, 1}
    assert all(metrics[(s, 0)]["loss"] == metrics[(s, 1)]["loss"] for s in range(1, STEPS + 1))
    assert audit_run_dir(run.dir)["ok"] is True


@mindspore_run
def test_audit_catches_a_build_guard_that_disables_real_prefetch(runs):
    run = runs("two-ranks-pitfall")
    result = audit_run_dir(run.dir)
    assert (result["guard"], result["ok"]) == ("disables-real-prefetch", False)
    assert set(result["real_prefetch_lost"]) == _edge_ids(run.graph())
    assert "decoder.layers.0" in result["pitfall_units"]


@mindspore_run
def test_msrun_jobs_get_every_signal_from_the_optimizer_call_alone(runs):
    """The workload calls report_step only for its metrics line: boundaries, digests, order and
    step times come from the optimizer Cell's call, on both ranks."""
    run = runs("two-ranks-guarded")
    for rank in range(2):
        probe = run.probe(rank)
        assert probe["step_source"] == "optimizer" and probe["steps_counted"] == STEPS
        assert [s for s, _ in probe["step_seconds"]] == list(range(1, STEPS + 1))
        assert probe["step_notes"] == []  # report_step agreed with the optimizer's count
        assert (run.dir / f"order.rank{rank}.jsonl").read_text().count("\n") == min(STEPS, 3)
    ranks = {json.loads(line)["rank"] for line in rank_lines(run.dir, "digests")}
    assert ranks == {0, 1}


@mindspore_run
def test_a_nudged_parameter_is_localized_to_the_target_of_its_edge(runs):
    from bisect_prefetch.metrics.localize import judge_digests, units_in_graph

    reference, nudged = runs("reference"), runs("nudge")
    verdict = judge_digests(reference.dir, nudged.dir, units=units_in_graph(
        nudged.dir / "graph.rank0.json"), ranks=1)
    where = verdict.localization
    assert where is not None and where.step == 1, verdict
    assert (where.unit, where.rule) == ("decoder.layers.0", "values")


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
