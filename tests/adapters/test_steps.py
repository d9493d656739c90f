"""The step clock (adapters/steps.py) and the order record's bounds, in one process.

The clock is fed the events the framework adapters report, in the orders real jobs make
them (the real-job tests are in test_zero_touch.py and test_adapter_hyper_parallel.py).
"""

from __future__ import annotations

import json
import tracemalloc

from bisect_prefetch.adapters import Session
from bisect_prefetch.adapters.order import MAX_EVENTS_PER_STEP, OrderLog
from bisect_prefetch.adapters.plan import parse_plan
from bisect_prefetch.adapters.steps import StepClock


class Trace:
    def __init__(self) -> None:
        self.events: list[tuple] = []
        self.notes: list[str] = []
        self.clock = StepClock(on_update=lambda s: self.events.append(("update", s)),
                               on_end=lambda s, _: self.events.append(("end", s)),
                               note=self.notes.append)


def iteration(clock: StepClock, *, micro: int = 1, optimizers: tuple = (1,)) -> None:
    clock.forward_begins()
    for _ in range(micro):
        clock.backward_ends()
    for optimizer in optimizers:
        clock.optimizer_begins(optimizer)
        clock.optimizer_ends()


def test_gradient_accumulation_and_several_optimizers_make_one_step_each_iteration():
    t = Trace()
    t.clock.optimizer_built = True
    for _ in range(3):
        iteration(t.clock, micro=2, optimizers=(1, 2))
    t.clock.close()
    assert t.events == [("update", 1), ("end", 1), ("update", 2), ("end", 2),
                        ("update", 3), ("end", 3)]
    assert t.clock.source == "optimizer" and t.notes == []


def test_an_optimizer_stepped_twice_between_forwards_is_one_step_said_once():
    t = Trace()
    t.clock.optimizer_built = True
    for _ in range(2):
        iteration(t.clock, optimizers=(1, 1))
    t.clock.close()
    assert [e for e in t.events if e[0] == "end"] == [("end", 1), ("end", 2)]
    assert len(t.notes) == 1 and "stepped twice" in t.notes[0]


def test_without_an_optimizer_a_step_is_a_forward_and_backward_said_once():
    t = Trace()
    for _ in range(3):
        iteration(t.clock, optimizers=())
    assert t.events == [("update", 1), ("end", 1), ("update", 2), ("end", 2),
                        ("update", 3), ("end", 3)]
    assert t.clock.source == "backward" and len(t.notes) == 1


def test_report_step_ends_steps_only_where_nothing_else_does_and_disagreement_is_said():
    t = Trace()  # no framework adapter: only the job's own calls
    for step in (1, 2, 3):
        assert t.clock.reported(step) is True
    assert t.clock.source == "report" and t.clock.steps == 3
    u = Trace()
    u.clock.optimizer_built = True
    for step in (0, 1, 2):  # the job numbers its steps from 0
        iteration(u.clock)
        assert u.clock.reported(step) is False
    u.clock.close()
    assert u.clock.steps == 3 and len(u.notes) == 1
    assert "report_step(0) came at training step 1" in u.notes[0]


def _session(tmp_path, order_steps: int = 3) -> Session:
    plan = parse_plan({"version": 1, "out_dir": str(tmp_path), "mask": None, "guard": "none",
                       "record": {"order_steps": order_steps}})
    return Session(plan, rank=0)


def test_the_order_record_of_a_10000_step_job_stays_bounded(tmp_path):
    session = _session(tmp_path)
    session.clock.optimizer_built = True
    tracemalloc.start()
    for step in range(10_000):
        for unit in ("layers.0", "layers.1"):
            session.order.use(unit, "fwd")
            session.order.unshard(unit)
            session.order.reshard(unit)
        iteration(session.clock)
        if step == 100:
            baseline = tracemalloc.get_traced_memory()[0]
    grown = tracemalloc.get_traced_memory()[0] - baseline
    tracemalloc.stop()
    session.close()
    lines = (tmp_path / "order.rank0.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3]
    assert session.clock.steps == 10_000
    # step_seconds keeps a pair a step (by design, up to 10,000); nothing else may grow.
    assert grown < 4_000_000, grown


def test_a_step_that_never_ends_keeps_at_most_the_cap(tmp_path):
    lines: list[str] = []
    order = OrderLog(rank=0, steps=3, write=lines.append)
    for _ in range(MAX_EVENTS_PER_STEP + 5000):
        order.use("layers.0", "fwd")
    assert len(order._events) == MAX_EVENTS_PER_STEP
    order.end_step(1)
    record = json.loads(lines[0])
    assert len(record["events"]) == MAX_EVENTS_PER_STEP and record["events_dropped"] == 5000
