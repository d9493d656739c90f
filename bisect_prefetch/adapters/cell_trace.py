"""The op tracer's MindSpore counterpart, at Cell granularity (MindSpore has no op-level hook
a job can install from outside: torch's dispatch modes have no equivalent).

Activated when the job imports mindspore and the plan's ``record.trace`` names a window of
steps (adapters/plan.py); writes ``optrace.rank{R}.jsonl`` lines in op_trace's format
(adapters/op_trace.py), so ``explain`` compares them the same way. Python 3.9; imports
nothing of MindSpore until the job has.

For every Cell call of the traced steps (``Cell.__call__``, wrapped for the window only; in
PyNative mode, where Python runs each call): the Cell's class as the op (``cell:Dense``),
its name under the outermost Cell called as the module, the phase (``optimizer`` for an
optimizer Cell, else ``forward``), and the fingerprints of its tensor inputs (at the call)
and outputs (at its return), with adapters/digest.py's math in numpy on the host copies
(``asnumpy``). A call is recorded when it returns, so an inner Cell comes before the Cell
that called it: the first differing record is the innermost Cell that computed
differently. Backward runs inside MindSpore's autodiff, not through Cell calls: a Cell
backward hook (``register_backward_hook``, put on every Cell of the job at the window's
first call and taken off at its end) records each Cell's backward as it finishes: the op
``cell:Dense`` again, phase ``backward``, the gradient it received (with respect to its
output) as its input and the gradients it computed (with respect to its inputs) as its
outputs; Cells in backward order, so the first differing record is the first Cell whose
backward computed differently. Granularity: the probe's ``op_trace`` says
``"granularity": "cell"``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from bisect_prefetch.adapters.numpy_digest import array_digest, local_array
from bisect_prefetch.vocab import op_trace_file

_tracer: CellTracer | None = None
_own_dirs: tuple[str, ...] = (os.path.dirname(__file__),)  # and mindspore's, once imported


class CellTracer:
    """One rank's Cell-level trace of the window's steps (see the module docstring)."""

    def __init__(self, session: Any, first_step: int, last_step: int) -> None:
        self.session = session
        self.first_step = first_step
        self.last_step = last_step
        self.path = os.path.join(session.plan.out_dir, op_trace_file(session.rank))
        self.names: dict[int, str] = {}  # id(cell) -> name under the outermost cell
        self.depth = 0
        self.lines: list[str] = []
        self.step = 0
        self.seq = 0
        self.counts: dict[str, int] = {}
        self.original: Any = None
        self.cell_class: Any = None
        self.optimizer_class: Any = None
        self.ops_traced = 0
        self.bytes_written = 0
        self.seconds_flushing = 0.0
        self.hooked: dict[int, Any] = {}  # id(cell) -> its backward hook's handle
        self.hooks_refused: dict[str, int] = {}  # why a Cell took no backward hook -> how many
        self.backward_records = 0

    def wrap(self) -> None:
        """Wrap Cell.__call__ for the window (class-level: every Cell, the job's own too)."""
        import mindspore
        import mindspore.nn as nn

        global _own_dirs
        if self.original is not None:
            return
        _own_dirs = (os.path.dirname(__file__), os.path.dirname(mindspore.__file__))
        self.cell_class, self.optimizer_class = nn.Cell, getattr(nn, "Optimizer", ())
        self.original = original = nn.Cell.__call__
        tracer = self

        def __call__(cell: Any, *args: Any, **kwargs: Any) -> Any:
            return tracer.call(original, cell, args, kwargs)

        nn.Cell.__call__ = __call__

    def unwrap(self) -> None:
        if self.original is not None:
            self.cell_class.__call__ = self.original
            self.original = None
        for handle in self.hooked.values():
            try:
                handle.remove()
            except Exception:  # a handle already gone: nothing left to take off
                pass
        self.hooked = {}

    def call(self, original: Any, cell: Any, args: tuple, kwargs: dict) -> Any:
        if not self.depth and id(cell) not in self.names:
            cells = list(cell.cells_and_names())
            self.names.update({id(c): name for name, c in cells})
            self._hook_backward([c for _, c in cells])
        ins = [_fingerprint(t) for t in _tensors((args, kwargs))]
        self.depth += 1
        try:
            out = original(cell, *args, **kwargs)
        finally:
            self.depth -= 1
        phase = ("optimizer" if self.optimizer_class and isinstance(cell, self.optimizer_class)
                 else "forward")
        self._record(cell, phase, ins, [_fingerprint(t) for t in _tensors(out)], _where())
        return out

    def _hook_backward(self, cells: list[Any]) -> None:
        """A backward hook on each Cell not hooked yet (not the optimizer: it has no
        backward). A Cell that refuses one is counted, never the job's end."""
        for cell in cells:
            if id(cell) in self.hooked or (
                    self.optimizer_class and isinstance(cell, self.optimizer_class)):
                continue
            try:
                self.hooked[id(cell)] = cell.register_backward_hook(self._backward)
            except Exception as e:
                why = f"{type(cell).__name__}: {type(e).__name__}"
                self.hooks_refused[why] = self.hooks_refused.get(why, 0) + 1

    def _backward(self, cell: Any, grad_input: Any, grad_output: Any) -> None:
        """A Cell's backward finished: what it received (the gradient with respect to its
        output) in, what it computed (with respect to its inputs) out. Returns None: the
        gradients pass on unchanged."""
        if self.original is None:
            return None  # outside the window
        self._record(cell, "backward", [_fingerprint(t) for t in _tensors(grad_output)],
                     [_fingerprint(t) for t in _tensors(grad_input)], None)
        self.backward_records += 1
        return None

    def _record(self, cell: Any, phase: str, ins: list[Any], outs: list[Any],
                where: str | None) -> None:
        step = self.session.clock.steps + 1
        if step != self.step:
            self.step, self.seq, self.counts = step, 0, {}
        name = f"cell:{type(cell).__name__}"
        n = self.counts.get(name, 0)
        self.counts[name] = n + 1
        self.lines.append(json.dumps({
            "step": step, "seq": self.seq, "op": name, "n": n, "phase": phase,
            "module": self.names.get(id(cell)) or type(cell).__name__, "in": ins,
            "out": outs, "src": [None] * len(ins), "chg": [], "at": where},
            separators=(",", ":")))
        self.seq += 1
        self.ops_traced += 1

    # -- the step clock's boundaries -----------------------------------------------------
    def on_update(self, step: int) -> None:
        self.flush()

    def on_step_end(self, step: int) -> None:
        if step + 1 == self.first_step:
            self.wrap()
        if step >= self.last_step:
            self.unwrap()
        self.flush()

    def on_exit(self) -> None:
        self.unwrap()
        if self.session.last_step is not None:
            self.flush()
        self.session.probe_extra["op_trace"] = {
            "steps": [self.first_step, self.last_step], "ops": self.ops_traced,
            "bytes": self.bytes_written, "flush_s": round(self.seconds_flushing, 6),
            "granularity": "cell", "backward_records": self.backward_records,
            **({"backward_hooks_refused": self.hooks_refused} if self.hooks_refused else {})}

    def flush(self) -> None:
        """The records so far to the file (one write); never the job's end."""
        if not self.lines:
            return
        start = time.perf_counter()
        data = ("\n".join(self.lines) + "\n").encode("utf-8")
        self.lines = []
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        except OSError as e:
            self.session.note_error(f"cell trace not written: {e!r}")
            return
        self.bytes_written += len(data)
        self.seconds_flushing += time.perf_counter() - start


def _tensors(tree: Any) -> list[Any]:
    """The tensors (anything with ``asnumpy``) in a call's arguments or result, in order."""
    if hasattr(tree, "asnumpy"):
        return [tree]
    found: list[Any] = []
    if isinstance(tree, (tuple, list)):
        for item in tree:
            found += _tensors(item)
    elif isinstance(tree, dict):
        found += _tensors(list(tree.values()))
    return found


def _fingerprint(tensor: Any) -> str | None:
    try:
        array = local_array(tensor)
        return array_digest(array) if array.size else "0" * 32
    except Exception:  # a tensor numpy cannot hold: no fingerprint, never the job's end
        return None


def _where() -> str | None:
    """The first frame of the job's own code (outside mindspore and this package)."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if not (name.startswith(_own_dirs) or name.startswith("<")):
            return f"{name}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def activate(session: Any) -> None:
    """Trace the plan's window at Cell granularity (install() calls it when the job imports
    mindspore)."""
    global _tracer
    plan = session.plan if session is not None else None
    window = plan.trace if plan is not None else None
    if _tracer is not None or window is None or not plan.out_dir:
        return
    _tracer = CellTracer(session, *window)
    session.add_update_listener(_tracer.on_update)
    session.add_step_end_listener(_tracer.on_step_end)
    session.add_exit_listener(_tracer.on_exit)
    if _tracer.first_step == 1:
        _tracer.wrap()


def tracer() -> CellTracer | None:
    """The active tracer, or None."""
    return _tracer
