"""Gradient digests on real MindSpore tensors: the MindSpore reference model trained for three
steps under hyper-parallel's double, in this process, in both lineages: the lines the
orchestrator reads, reproducible and moved by a one-ulp change, and the older lineage's
size-one units. The adapter over a toy scheduler: tests/adapters/test_hyper_parallel.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bisect_prefetch.adapters import Session
from bisect_prefetch.adapters import hyper_parallel as hp
from bisect_prefetch.adapters.plan import parse_plan
from bisect_prefetch.judge.audit import audit_run_dir
from bisect_prefetch.metrics.digests import compare_digest_files
from tests.conftest import rank_lines

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
