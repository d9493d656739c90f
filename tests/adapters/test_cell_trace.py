"""explain's trace on MindSpore, at Cell granularity: every Cell call of the traced steps
with its inputs' and outputs' fingerprints (digest math in numpy), inner Cells before the
Cell that called them, the optimizer's call apart, and each Cell's backward (a Cell backward
hook: the gradient it received in, those it computed out); two runs compare clean, a Cell
that draws from a clock-seeded generator is the origin, and so is a Cell whose own
backward does."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from bisect_prefetch.metrics.op_compare import compare_traces

ms = pytest.importorskip("mindspore")
np = pytest.importorskip("numpy")

from bisect_prefetch.adapters import cell_trace  # noqa: E402


class Session(SimpleNamespace):
    def __init__(self, out_dir: Path) -> None:
        super().__init__(plan=SimpleNamespace(out_dir=str(out_dir), trace=(1, 2)), rank=0,
                         clock=SimpleNamespace(steps=0), last_step=None, probe_extra={},
                         errors=[])

    def note_error(self, message: str) -> None:
        self.errors.append(message)


def train(out_dir: Path, *, clock: bool = False, clock_in_backward: bool = False) -> list[dict]:
    from mindspore import Tensor, nn, ops

    class Noisy(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.dense = nn.Dense(4, 4)

        def construct(self, x):
            y = self.dense(x)
            if clock:
                noise = np.random.default_rng(time.time_ns()).normal(size=(3, 4))
                y = y + Tensor(noise.astype(np.float32))
            if clock_in_backward:  # adds exactly 0 in forward, the noise to x's gradient
                noise = Tensor(np.random.default_rng(time.time_ns()).normal(size=(3, 4))
                               .astype(np.float32))
                y = y + (x * noise - ops.stop_gradient(x * noise))
            return y

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_seed(0)
    out_dir.mkdir(parents=True, exist_ok=True)
    net = nn.SequentialCell([nn.Dense(4, 4), Noisy()])
    optimizer = nn.SGD(net.trainable_params(), learning_rate=0.1)
    grad = ms.value_and_grad(lambda x: net(x).sum(), None, optimizer.parameters)
    session = Session(out_dir)
    tracer = cell_trace.CellTracer(session, 1, 2)
    tracer.wrap()
    x = Tensor(np.ones((3, 4), np.float32))
    for step in (1, 2):
        _, grads = grad(x)
        tracer.on_update(step)
        optimizer(grads)
        session.clock.steps = session.last_step = step
        tracer.on_step_end(step)
    assert tracer.original is None  # unwrapped after the window
    tracer.on_exit()
    assert session.probe_extra["op_trace"]["granularity"] == "cell" and not session.errors
    return [json.loads(line) for line in (out_dir / "optrace.rank0.jsonl").read_text().splitlines()]


def test_every_cell_call_is_recorded_inner_first_with_fingerprints(tmp_path):
    ops = train(tmp_path)
    first = [(op["op"], op["module"], op["phase"]) for op in ops if op["step"] == 1]
    assert first[:4] == [("cell:Dense", "0", "forward"), ("cell:Dense", "1.dense", "forward"),
                         ("cell:Noisy", "1", "forward"),
                         ("cell:SequentialCell", "SequentialCell", "forward")]
    assert ("cell:SGD", "SGD", "optimizer") in first
    dense = ops[0]
    assert all(len(fp) == 32 for fp in dense["in"] + dense["out"])
    assert dense["at"].endswith(".py:" + dense["at"].rsplit(":", 1)[1])


def test_two_runs_agree_and_a_clock_seeded_draw_is_the_origin(tmp_path):
    train(tmp_path / "a")
    train(tmp_path / "b")
    assert compare_traces(tmp_path / "a", tmp_path / "b").verdict == "no-op-differs"
    train(tmp_path / "c", clock=True)
    train(tmp_path / "d", clock=True)
    first = compare_traces(tmp_path / "c", tmp_path / "d").first
    assert (first.kind, first.op, first.module, first.step) == ("origin", "cell:Noisy", "1", 1)


def test_each_cell_s_backward_is_recorded_and_a_noisy_backward_is_its_origin(tmp_path):
    ops = train(tmp_path / "a")
    backward = [(op["op"], op["module"]) for op in ops if op["step"] == 1
                and op["phase"] == "backward"]
    assert ("cell:Noisy", "1") in backward and ("cell:Dense", "0") in backward
    assert backward.index(("cell:Noisy", "1")) < backward.index(("cell:Dense", "0"))
    train(tmp_path / "b")
    assert compare_traces(tmp_path / "a", tmp_path / "b").verdict == "no-op-differs"
    train(tmp_path / "c", clock_in_backward=True)
    train(tmp_path / "d", clock_in_backward=True)
    first = compare_traces(tmp_path / "c", tmp_path / "d").first
    assert (first.kind, first.op, first.module, first.phase, first.step) == (
        "origin", "cell:Noisy", "1", "backward", 1)
