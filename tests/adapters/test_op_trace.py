"""The op tracer inside a torch job, in one process: what one traced step records (phases,
modules, occurrences, the job's own frame, views and write-only buffers left unfingerprinted,
the tool's own digests left out), a buffer changed below the dispatcher said at its next
use, the window's ends, and the plan's record.trace. Two traced runs of the same steps
compare clean; a clock-seeded draw is the origin."""

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
    assert all(len(fp) == 32 for fp in addmm[0]["in"] + addmm[0]["out"])
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


def test_the_plan_says_which_steps_to_trace():
    base = {"version": 1, "record": {}}
    assert parse_plan(base).trace is None
    plan = parse_plan({**base, "record": {"trace": {"first_step": 2, "last_step": 4}}})
    assert plan.trace == (2, 4)
    for bad in ({"first_step": 0, "last_step": 2}, {"first_step": 3, "last_step": 2},
                {"first_step": 1}, "1-2"):
        with pytest.raises(PlanError, match="record.trace"):
            parse_plan({**base, "record": {"trace": bad}})
