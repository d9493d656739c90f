"""The in-process adapter: plan, recorder, prefetch gate, import hook, sitecustomize, FSDP2
(on real ranks: tests/e2e/test_fsdp2_adapter_on_real_ranks.py)."""

from __future__ import annotations

import importlib
import json
import multiprocessing
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bisect_prefetch.adapters import Session
from bisect_prefetch.adapters.gate import Gate
from bisect_prefetch.adapters.import_hook import when_imported
from bisect_prefetch.adapters.plan import PlanError, load_plan, parse_plan, plan_hash
from bisect_prefetch.adapters.recorder import ProbeTally, Recorder
from tests.conftest import rank_lines

REPO = Path(__file__).resolve().parents[2]
SITE = REPO / "bisect_prefetch" / "adapters" / "site"


def plan_dict(out_dir: Path | None = None, **fields) -> dict:
    plan = {"version": 1, "experiment": "t", "run_id": "r", "mask": None, "guard": "none"}
    if out_dir is not None:
        plan["out_dir"] = str(out_dir)
    plan.update(fields)
    return plan


def run_python(code: str, *, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


# -- plan ------------------------------------------------------------------------------
def test_plan_hash_is_canonical_and_sees_the_mask():
    a = {"version": 1, "mask": ["bwd:b->a", "fwd:a->b"], "guard": "none"}
    b = {"guard": "none", "mask": ["bwd:b->a", "fwd:a->b"], "version": 1}
    assert plan_hash(a) == plan_hash(b)
    assert len(plan_hash(a)) == 64
    assert plan_hash(a) != plan_hash({**a, "mask": ["fwd:a->b"]})


def test_parse_plan_reads_fields_and_rejects_bad_ones(tmp_path):
    plan = parse_plan(plan_dict(tmp_path, mask=["fwd:a->b"], guard="size-one"))
    gate = Gate(plan)
    assert gate.decide("fwd:a->b", 2) is None and gate.decide("bwd:b->a", 2) == "masked"
    assert gate.decide("fwd:a->b", 1) == "guarded"
    assert plan.guard == "size-one" and plan.out_dir == str(tmp_path)
    assert Gate(parse_plan(plan_dict(tmp_path))).decide("anything", 1) is None
    for bad in (
        {**plan_dict(tmp_path), "version": 2},
        {**plan_dict(tmp_path), "mask": "fwd:a->b"},
        {**plan_dict(tmp_path), "guard": "always"},
        {**plan_dict(tmp_path), "record": {"digest_every": 0}},
        [],
    ):
        with pytest.raises(PlanError):
            parse_plan(bad)


def test_load_plan_uses_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("BISECT_PREFETCH_PLAN", raising=False)
    assert load_plan() is None
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan_dict(tmp_path)))
    monkeypatch.setenv("BISECT_PREFETCH_PLAN", str(path))
    assert load_plan().hash == plan_hash(plan_dict(tmp_path))
    path.write_text("{not json")
    with pytest.raises(PlanError, match="cannot read plan"):
        load_plan()


# -- recorder and gate -----------------------------------------------------------------
def _append_lines(out_dir: str, rank: int, count: int) -> None:
    recorder = Recorder(out_dir, rank)
    for step in range(count):
        recorder.metrics(step, {"loss": step / 3, "pad": "x" * 9000})  # > PIPE_BUF
    recorder.close()


def test_recorder_lines_from_concurrent_ranks_are_never_torn(tmp_path):
    context = multiprocessing.get_context("spawn")
    workers = [
        context.Process(target=_append_lines, args=(str(tmp_path), r, 200)) for r in range(4)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    lines = rank_lines(tmp_path, "metrics")  # each rank its own file
    records = [json.loads(line) for line in lines]  # raises on a torn line
    assert sorted((r["rank"], r["step"]) for r in records) == [
        (rank, step) for rank in range(4) for step in range(200)
    ]
    assert all(r["loss"] == r["step"] / 3 for r in records)


def test_recorder_keeps_full_floats_and_nan(tmp_path):
    recorder = Recorder(str(tmp_path), 3)
    recorder.metrics(1, {"loss": 0.1 + 0.2, "grad_norm": float("nan")})
    line = (tmp_path / "metrics.rank3.jsonl").read_text()
    assert '"loss": 0.30000000000000004' in line and "NaN" in line
    with pytest.raises(ValueError):
        recorder.metrics(2, {"rank": 1})


def test_probe_tally_counts_per_edge_and_per_step():
    tally = ProbeTally()
    for outcome in ("issued", "issued", "noop"):
        tally.count("bwd:b->a", outcome)
    tally.count("fwd:a->b", "masked")
    tally.end_step(1)
    tally.count("fwd:a->b", "guarded")
    probe = tally.to_json()
    assert probe["edges"]["bwd:b->a"] == {
        "fired": 3, "issued": 2, "noop": 1, "masked": 0, "guarded": 0,
    }  # fmt: skip
    assert probe["steps"][0] == {
        "step": 1, "issued": ["bwd:b->a"], "noop": ["bwd:b->a"],
        "masked": ["fwd:a->b"], "guarded": [],
    }  # fmt: skip
    assert probe["steps"][1]["partial"] and probe["steps"][1]["guarded"] == ["fwd:a->b"]


def test_session_gate_masks_guards_and_notifies(tmp_path):
    session = Session(parse_plan(plan_dict(tmp_path, mask=["fwd:a->b"], guard="size-one")), 0)
    ran, heard = [], []
    session.add_prefetch_listener(lambda edge, module, issued: heard.append((edge, module, issued)))

    def run():
        ran.append(1)
        return True

    assert session.prefetch("bwd:b->a", target_shard_size=2, target_module="A", run=run) == "masked"
    assert (
        session.prefetch("fwd:a->b", target_shard_size=1, target_module="B", run=run) == "guarded"
    )
    assert ran == [] and heard == []
    assert session.prefetch("fwd:a->b", target_shard_size=2, target_module="B", run=run) == "issued"
    assert heard == [("fwd:a->b", "B", True)]
    session.report_step(1, {"loss": 1.0})
    probe = json.loads((tmp_path / "probe.rank0.json").read_text())
    session.close()
    assert probe["plan_hash"] == session.plan.hash
    assert probe["edges"]["fwd:a->b"] == {
        "fired": 2, "issued": 1, "noop": 0, "masked": 0, "guarded": 1,
    }  # fmt: skip


# -- import hook and sitecustomize -----------------------------------------------------
def test_import_hook_runs_after_the_module_executed(tmp_path, monkeypatch):
    (tmp_path / "watched_pkg").mkdir()
    (tmp_path / "watched_pkg" / "__init__.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    when_imported("watched_pkg", lambda module: seen.append(module.VALUE))
    assert seen == []
    module = importlib.import_module("watched_pkg")
    assert seen == [42]
    assert type(module.__loader__).__name__ == "SourceFileLoader"  # real loader put back
    when_imported("watched_pkg", lambda module: seen.append(-module.VALUE))  # already imported
    assert seen == [42, -42]
    monkeypatch.delitem(sys.modules, "watched_pkg")


def test_adapter_imports_only_the_standard_library_and_never_torch(tmp_path):
    (tmp_path / "plan.json").write_text(json.dumps(plan_dict(tmp_path)))
    env = dict(os.environ, PYTHONPATH=str(REPO), BISECT_PREFETCH_PLAN=str(tmp_path / "plan.json"))
    result = run_python(
        """
        import json, sys
        before = set(sys.modules)
        import bisect_prefetch.adapters as adapters
        adapters.install()
        adapters.report_step(1, loss=2.5)
        new = set(sys.modules) - before
        # _sysconfigdata_*: the standard library's sysconfig data (the manifest asks
        # sysconfig where installed packages live), generated per platform, unlisted.
        foreign = [m for m in new if m.split(".")[0] not in sys.stdlib_module_names
                   and m.split(".")[0] != "bisect_prefetch"
                   and not m.startswith("_sysconfigdata")]
        print(json.dumps({"foreign": foreign, "torch": "torch" in sys.modules}))
        """,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"foreign": [], "torch": False}
    assert json.loads((tmp_path / "metrics.rank0.jsonl").read_text()) == {
        "step": 1,
        "rank": 0,
        "loss": 2.5,
    }
    assert json.loads((tmp_path / "probe.rank0.json").read_text())["edges"] == {}


def test_sitecustomize_installs_and_chains_to_the_shadowed_one(tmp_path):
    user_site = tmp_path / "user_site"
    user_site.mkdir()
    (user_site / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = '1'\n")
    (tmp_path / "plan.json").write_text(json.dumps(plan_dict(tmp_path)))
    code = """
        import os, sys
        adapters = sys.modules.get("bisect_prefetch.adapters")
        installed = adapters is not None and adapters.session() is not None
        print(os.environ.get("USER_SITE_RAN"), installed)
        """
    path = os.pathsep.join([str(SITE), str(user_site), str(REPO)])
    env = dict(os.environ, PYTHONPATH=path, BISECT_PREFETCH_PLAN=str(tmp_path / "plan.json"))
    result = run_python(code, env=env, cwd=tmp_path)
    assert (result.returncode, result.stdout.strip()) == (0, "1 True"), result.stderr

    env["BISECT_PREFETCH_PLAN"] = str(tmp_path / "missing.json")  # the job must survive it
    result = run_python(code, env=env, cwd=tmp_path)
    assert (result.returncode, result.stdout.strip()) == (0, "1 False")
    assert "bisect-prefetch: adapter not installed" in result.stderr

    env.pop("BISECT_PREFETCH_PLAN")  # no plan: nothing installed, user site still runs
    result = run_python(code, env=env, cwd=tmp_path)
    assert (result.returncode, result.stdout.strip(), result.stderr) == (0, "1 False", "")


def test_fsdp2_adapter_activates_on_import_even_when_the_job_imports_it_first(tmp_path):
    pytest.importorskip("torch")
    (tmp_path / "plan.json").write_text(json.dumps(plan_dict(tmp_path)))
    path = os.pathsep.join([str(SITE), str(REPO)])
    env = dict(os.environ, PYTHONPATH=path, BISECT_PREFETCH_PLAN=str(tmp_path / "plan.json"))
    code = """
        import sys
        import bisect_prefetch.adapters.fsdp2 as fsdp2_adapter
        before = fsdp2_adapter.adapter() is not None
        import torch.distributed.fsdp
        print(before, fsdp2_adapter.adapter() is not None)
        """
    result = run_python(code, env=env, cwd=tmp_path)
    assert (result.returncode, result.stdout.strip()) == (0, "False True"), result.stderr


# -- gradient digests of torch gradients ------------------------------------------------
def _reference_digest(values) -> str:
    """adapters/digest.py's digest, computed element by element in plain Python."""
    import numpy as np

    from bisect_prefetch.adapters import digest

    array = np.ascontiguousarray(values).reshape(-1)
    bits = digest.lane_bits(array.itemsize)
    patterns = array.view(f"u{array.itemsize}").tolist()
    wide = (array.astype(np.float64) if array.dtype.kind == "f" else array).view(np.uint64)
    xor = 0
    for pattern in wide.tolist():
        xor ^= pattern
    weighted = sum(pattern * digest.weight(i, bits) for i, pattern in enumerate(patterns))
    weighted %= 1 << bits
    if weighted >> (bits - 1):  # as a signed L-bit integer
        weighted -= 1 << bits
    return digest.spell(xor, weighted)


def test_tensor_batch_digests_every_element_as_the_format_says():
    torch = pytest.importorskip("torch")
    from bisect_prefetch.adapters.numpy_digest import array_digest
    from bisect_prefetch.adapters.torch_digest import BATCHED_MAX_BYTES, TensorBatch

    torch.manual_seed(0)
    grads = [
        torch.randn(10_000),  # batched
        torch.randn(7),
        torch.randn(300, 40).t(),  # strided
        torch.randn(7),  # a second of the same size
        torch.randn(2000, dtype=torch.float64),  # another dtype, 64-bit lanes
        torch.randn(40_000),  # measured where it lies, not batched
        torch.randn(400, 100).t(),  # the same, strided
        torch.randn(33, dtype=torch.bfloat16),  # 16-bit patterns widened
    ]
    grads[1][3] = float("nan")
    assert grads[5].numel() * 4 > BATCHED_MAX_BYTES
    names = [f"p{k}" for k in range(len(grads))]
    batch = TensorBatch([*names, "empty"], [*grads, torch.zeros(0)])
    measured, digests, norms, peaks = batch.measure([*grads, torch.zeros(0)])
    assert measured == names  # an empty shard has nothing to digest
    for grad, digest, norm, max_abs in zip(grads, digests, norms, peaks, strict=True):
        flat = grad.contiguous().reshape(-1)
        if flat.dtype != torch.bfloat16:  # numpy has no bfloat16
            assert digest == _reference_digest(flat.numpy())
            assert digest == array_digest(flat.numpy())  # MindSpore's numpy path agrees
        peak = float(grad.double().abs().max())
        if peak == peak:
            assert max_abs == peak and norm == pytest.approx(float(grad.double().norm()), rel=1e-5)
        else:  # NaN stays NaN
            assert max_abs != max_abs and norm != norm
    assert len(set(digests)) == len(grads)


def test_a_one_ulp_change_anywhere_changes_exactly_that_tensors_digest():
    torch = pytest.importorskip("torch")
    hypothesis = pytest.importorskip("hypothesis")
    from hypothesis import strategies as st

    from bisect_prefetch.adapters.torch_digest import TensorBatch

    torch.manual_seed(1)
    grads = [torch.randn(50_000), torch.randn(16), torch.randn(16), torch.randn(3000),
             torch.randn(20_000, dtype=torch.float64)]
    batch = TensorBatch([f"g{k}" for k in range(len(grads))], grads)
    before = batch.measure(grads)[1]

    @hypothesis.settings(max_examples=60, deadline=None)
    @hypothesis.given(st.data())
    def one_ulp(data):
        k = data.draw(st.integers(0, len(grads) - 1))
        i = data.draw(st.integers(0, grads[k].numel() - 1))  # the unsampled middle included
        up = data.draw(st.booleans())
        changed = [g.clone() for g in grads]
        flat = changed[k].view(-1)
        flat[i] = torch.nextafter(flat[i], torch.tensor(float("inf") if up else float("-inf"),
                                                        dtype=flat.dtype))
        after = batch.measure(changed)[1]
        assert [a != b for a, b in zip(before, after, strict=True)] == [j == k for j in range(len(grads))]

    one_ulp()
    # Two elements swapped: xor cannot see it, the weighted sum does.
    swapped = [g.clone() for g in grads]
    swapped[3][[0, 1]] = swapped[3][[1, 0]]
    assert batch.measure(swapped)[1][3] != before[3]
