"""The op tracer inside a torch job, in one process: what one traced step records (phases,
modules, occurrences, the job's own frame, views and write-only buffers left unfingerprinted,
the tool's own digests left out), a buffer changed below the dispatcher said at its next
use, the window's ends, and the plan's record.trace (its units too). Two traced runs of the
same steps compare clean; a clock-seeded draw is the origin. A fingerprint is a digest's
sums; DTensors, functional collectives' results and tensor subclasses without memory of
their own never end the job (the last named); an error inside the tracer stops the trace,
not the job; the ops of a prefetch carry its edge, and a prefetch's window shows a shard
written behind the ops while it was in flight."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from bisect_prefetch.adapters.plan import PlanError, parse_plan
from bisect_prefetch.metrics.op_compare import compare_traces

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.utils._python_dispatch import _disable_current_modes  # noqa: E402

from bisect_prefetch.adapters import op_trace  # noqa: E402
from bisect_prefetch.adapters.torch_digest import TensorBatch  # noqa: E402


class Session(SimpleNamespace):
    """What the tracer asks of the adapter's session (adapters/__init__.py)."""

    def __init__(self, out_dir: Path) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        super().__init__(plan=SimpleNamespace(out_dir=str(out_dir), trace=(1, 2)), rank=0,
                         clock=SimpleNamespace(steps=0), last_step=None, probe_extra={},
                         errors=[], listeners=[])

    def add_update_listener(self, fn):
        self.listeners.append(("update", fn))

    def add_step_end_listener(self, fn):
        self.listeners.append(("end", fn))

    def add_exit_listener(self, fn):
        self.listeners.append(("exit", fn))

    def note_error(self, message: str) -> None:
        self.errors.append(message)


class Noisy(nn.Module):
    def __init__(self, clock: bool) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.clock = clock

    def forward(self, x):
        y = torch.tanh(self.lin(x))
        if self.clock:
            y = y + torch.randn(y.shape, generator=torch.Generator().manual_seed(time.time_ns()))
        return y


def train(out_dir: Path, *, clock: bool = False, behind: bool = False) -> list[dict]:
    """Two traced steps of a small model: forward, backward, the tool's digests, an update."""
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = nn.Sequential(Noisy(clock=False), Noisy(clock=clock))
    session = Session(out_dir)
    tracer = op_trace.OpTracer(session, 1, 2)
    tracer.arm()
    x = torch.randn(3, 4)
    for step in (1, 2):
        if step == 2 and behind:  # written below the dispatcher: no traced op saw it
            with torch.no_grad(), _disable_current_modes():
                model[0].lin.weight.add_(1e-3)
        model(x).sum().backward()
        tracer.on_update(step)
        params = list(model.parameters())
        TensorBatch(["w"] * len(params), params).measure(params)  # the tool's own ops
        with torch.no_grad():
            for p in params:
                p.sub_(0.1 * p.grad)
                p.grad = None
        session.clock.steps = step
        session.last_step = step
        tracer.on_step_end(step)
    assert tracer.done and not tracer.active and not tracer.hooks
    tracer.on_exit()
    assert session.probe_extra["op_trace"]["ops"] > 0 and not session.errors
    path = out_dir / "optrace.rank0.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_traced_step_records_each_op_with_its_phase_module_and_frame(tmp_path):
    ops = train(tmp_path)
    assert {op["step"] for op in ops} == {1, 2}
    first = [op for op in ops if op["step"] == 1]
    assert [op["seq"] for op in first] == list(range(len(first)))
    phases = [op["phase"] for op in first]
    assert phases.index("forward") < phases.index("backward") < phases.index("optimizer")
    addmm = [op for op in first if op["op"] == "aten.addmm"]
    assert [(op["module"], op["n"], op["phase"]) for op in addmm] == [
        ("0.lin", 0, "forward"), ("1.lin", 1, "forward")]
    assert all(op["at"].endswith(f"test_op_trace.py:{op['at'].rsplit(':', 1)[1]}")
               for op in first if op["phase"] in ("forward", "optimizer"))
    # In backward each op is put in the module whose forward made its autograd node.
    backward = {op["module"] for op in first if op["op"] == "aten.tanh_backward"}
    assert backward == {"0", "1"}
    views = [op for op in first if op["op"] in ("aten.t", "aten.view", "aten.detach")]
    assert views and all(fp is None for op in views for fp in op["in"] + op["out"])
    # An input's fingerprint is the xor alone; an output's both sums of a digest.
    assert [len(fp) for fp in addmm[0]["in"] + addmm[0]["out"]] == [16, 16, 16, 32]
    # The tool's own digests at the step boundary are not the job's ops.
    assert not [op for op in ops if op["op"] in ("aten.hash_tensor", "aten.amax")]
    # Parameters are named where they are read.
    assert any(name == "0.lin.weight" for op in ops for _, name in op.get("par", []))


def test_two_traced_runs_of_the_same_steps_agree_and_a_clock_seeded_draw_is_the_origin(tmp_path):
    train(tmp_path / "a")
    train(tmp_path / "b")
    assert compare_traces(tmp_path / "a", tmp_path / "b").verdict == "no-op-differs"
    train(tmp_path / "c", clock=True)
    train(tmp_path / "d", clock=True)
    result = compare_traces(tmp_path / "c", tmp_path / "d")
    first = result.first
    assert (first.kind, first.op, first.module, first.step, first.phase) == (
        "origin", "aten.randn", "1", 1, "forward")


def test_a_parameter_written_below_the_dispatcher_is_changed_behind_at_its_next_use(tmp_path):
    train(tmp_path / "a")
    train(tmp_path / "b", behind=True)
    first = compare_traces(tmp_path / "a", tmp_path / "b").first
    assert (first.kind, first.step, first.phase, first.module) == (
        "changed-behind", 2, "forward", "0.lin"), first
    assert "aten.sub_" in first.detail


def test_the_plan_says_which_steps_to_trace_and_which_units():
    base = {"version": 1, "record": {}}
    assert parse_plan(base).trace is None
    plan = parse_plan({**base, "record": {"trace": {"first_step": 2, "last_step": 4}}})
    assert plan.trace == (2, 4) and plan.trace_units is None
    plan = parse_plan({**base, "record": {"trace": {"first_step": 2, "last_step": 4,
                                                    "units": ["layers.4", "layers.5"]}}})
    assert plan.trace_units == ("layers.4", "layers.5")
    for bad in ({"first_step": 0, "last_step": 2}, {"first_step": 3, "last_step": 2},
                {"first_step": 1}, "1-2", {"first_step": 1, "last_step": 2, "units": []},
                {"first_step": 1, "last_step": 2, "units": "layers.4"},
                {"first_step": 1, "last_step": 2, "more": 1}):
        with pytest.raises(PlanError, match="record.trace"):
            parse_plan({**base, "record": {"trace": bad}})


def test_a_fingerprint_is_a_digest_s_sums_an_input_s_the_xor_alone(tmp_path):
    tracer = op_trace.OpTracer(Session(tmp_path), 1, 1)
    tensors = [torch.randn(37), torch.randn(5, 3).to(torch.bfloat16),
               torch.randn(4, dtype=torch.float64), torch.randn(3, 4).t(), torch.randn(70000)]
    full = [tracer._fingerprint(t) for t in tensors]
    xor = [tracer._fingerprint(t, full=False) for t in tensors]
    xors = torch.stack(tracer.xors).view(torch.int64).tolist()
    sums = torch.stack(tracer.sums).tolist()
    spelled = [op_trace._spell(xors[i], sums[i], tracer.full[i]) for i in full + xor]
    whole = [t.contiguous() for t in tensors]
    digests = TensorBatch([str(k) for k in range(len(whole))], whole).measure(whole)[1]
    assert spelled[:len(full)] == digests
    assert spelled[len(full):] == [d[:16] for d in digests]


class Hollow(torch.Tensor):
    """A tensor subclass whose instances hold no memory of their own (a wrapper)."""

    @staticmethod
    def __new__(cls, elem):
        return torch.Tensor._make_wrapper_subclass(cls, elem.shape, dtype=elem.dtype)

    def __init__(self, elem):
        self.elem = elem

    def __tensor_flatten__(self):
        return ["elem"], None

    @staticmethod
    def __tensor_unflatten__(inner, meta, size, stride):
        return Hollow(inner["elem"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        def unwrap(x):
            return x.elem if isinstance(x, Hollow) else x

        return func(*[unwrap(a) for a in args], **{k: unwrap(v) for k, v in
                                                    (kwargs or {}).items()})


def traced(tmp_path: Path, job) -> tuple[list[dict], Session]:
    """Run job() with every op traced, as one step; its records and the session."""
    session = Session(tmp_path)
    tracer = op_trace.OpTracer(session, 1, 1)
    tracer.armed = True
    tracer._start()
    try:
        job(tracer)
    finally:
        tracer.stop()
    session.last_step = 1
    tracer.on_exit()
    path = tmp_path / "optrace.rank0.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines], session


def test_dtensors_collectives_and_subclasses_without_memory_never_end_the_job(tmp_path):
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        weight = distribute_tensor(torch.randn(4, 4), mesh, [Replicate()])
        results = {}

        def job(tracer):
            results["mm"] = (weight @ weight).to_local()
            summed = funcol.all_reduce(torch.ones(3), "sum", mesh)  # an AsyncCollectiveTensor
            results["reduced"] = summed + 1  # the op waits on it, as it would untraced
            results["hollow"] = Hollow(torch.full((2,), 3.0)) * 2

        ops, session = traced(tmp_path, job)
    finally:
        dist.destroy_process_group()
    assert torch.equal(results["reduced"], torch.full((3,), 2.0))
    assert torch.equal(results["hollow"], torch.full((2,), 6.0))
    assert not session.errors and "failed" not in session.probe_extra["op_trace"]
    mm = next(op for op in ops if op["op"] == "aten.mm")
    assert all(fp is not None for fp in mm["in"] + mm["out"])  # the local tensors
    reduce = next(op for op in ops if op["op"] == "_c10d_functional.all_reduce")
    assert reduce["out"][0] is not None and reduce["rd"]  # fingerprinted once waited on
    hollow = next(op for op in ops if op["op"] == "aten.mul" and op.get("nf"))
    assert hollow["nf"] == ["tensor subclass Hollow"] and hollow["in"][0] is None
    assert session.probe_extra["op_trace"]["not_fingerprinted"]["tensor subclass Hollow"] >= 1


def test_an_error_inside_the_tracer_stops_the_trace_not_the_job(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("a tracer bug")

    def job(tracer):
        x = torch.ones(3) * 2
        monkeypatch.setattr(tracer, "_read_inputs", broken)
        job.result = (x + 1).sum()

    ops, session = traced(tmp_path, job)
    assert job.result.item() == 9.0  # the job's ops ran, right
    failed = session.probe_extra["op_trace"]["failed"]
    assert "a tracer bug" in failed and "aten.add" in failed
    assert any("op trace stopped" in error for error in session.errors)
    assert [op["op"] for op in ops] == ["aten.ones", "aten.mul"]  # traced until it failed


def test_a_prefetch_s_ops_carry_its_edge_and_its_window_sees_a_shard_written_behind(tmp_path):
    edge = "bwd:b->a"

    def run(out_dir: Path, behind: bool) -> None:
        torch.manual_seed(0)
        unit = nn.Linear(2, 2)

        def job(tracer):
            tracer.scopes.name_modules({unit: "a"})
            tracer.prefetch_begins(edge, unit)
            copy = unit.weight.detach().clone()  # the prefetch's own work: issued by it
            tracer.prefetch_ends(edge, unit, True)
            if behind:  # below the dispatcher, while the prefetch is in flight
                with torch.no_grad(), _disable_current_modes():
                    unit.weight.view(-1)[0] += 1e-3
            tracer.unit_hook(unit, "bwd", "wait", True)  # the target's use: the window ends
            copy.copy_(unit.weight.detach())  # its copy-out
            tracer.unit_hook(unit, "bwd", "wait", False)
            (copy * 2).sum()

        traced(out_dir, job)

    run(tmp_path / "a", behind=False)
    run(tmp_path / "b", behind=True)
    ops = [json.loads(line) for line in (tmp_path / "a" / "optrace.rank0.jsonl").read_text()
           .splitlines()]
    tied = {(op["op"], tuple(op["pf"])) for op in ops if op.get("pf")}
    assert ("aten.clone", (edge, "issued")) in tied and ("aten.copy_", (edge, "copy-out")) in tied
    assert ("prefetch-window", (edge, "window")) in tied
    assert not [op for op in ops if op["op"] == "aten.mul" and op.get("pf")]
    first = compare_traces(tmp_path / "a", tmp_path / "b").first
    assert (first.op, first.kind, first.edge, first.edge_how, first.tensor) == (
        "prefetch-window", "changed-behind", edge, "window", "weight"), first
