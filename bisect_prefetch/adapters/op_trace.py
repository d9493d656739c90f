"""The op tracer: every op of the traced steps, with a fingerprint of each input and output.

Activated (torch jobs only) when the plan's ``record.trace`` names a window of steps
(adapters/plan.py); ``bisect-prefetch explain`` sets it. Imported only inside a torch job
(torch is the job's own). Python 3.9.

What it records, per rank and op of the traced steps (a TorchDispatchMode: every op that
goes through torch's dispatcher, in the order this rank ran them):

- the op's name and its occurrence (how many ops of that name ran before it in the step),
  its position in the step (``seq``), the phase (``forward``, ``backward``, ``optimizer``,
  ``other``: between the optimizer and the next forward, where a job loads data) and the
  module it ran in: the innermost module whose forward was running (global module hooks);
  in backward, the module whose forward created the autograd node being run (autograd's
  sequence numbers tie the two);
- a fingerprint of each tensor input, taken just before the op ran, and of each output
  (returned tensors and arguments the op writes), taken just after: the two sums of a
  gradient digest (adapters/digest.py: every element, position-sensitive), computed on the
  tensor's device. Nothing waits for the host inside forward or backward: every
  fingerprint of a step leaves the device in one transfer, when the optimizer is about to
  apply the step's gradients (before that step's digests are written, so that a run the
  orchestrator stops at its first differing digest has the step's ops on disk);
- for each input, which traced op last wrote that tensor (its step and seq) and whether
  its fingerprint at this use differs from the one that op left: a buffer written outside
  the traced ops (a race, a copy the dispatcher never saw) shows there. Unsharded
  parameters are written by FSDP's copy-out, a traced op, so this is their fingerprint
  after the unshard against the one at each use;
- collectives (ops of the ``c10d`` namespaces): their outputs are fingerprinted when they
  are waited on (the first traced op that reads them, or after a ``wait_tensor``), never
  at launch, when an asynchronous one has not filled them yet;
- the first frame of the op's Python stack outside torch and this package (file:line).

File: ``optrace.rank{R}.jsonl`` in the run dir, one line per op::

    {"step", "seq", "op", "n", "phase", "module", "in": [fp|null], "out": [fp|null],
     "src": [[step, seq]|null per input], "chg": [input indices], "at": "file:line"|null,
     "par": [[input index, parameter name], ...],   # only where an input is a parameter
     "rd": [step, seq]}   # a collective's: the op that first read its output (or its wait)

fp: 32 hex digits as a digest's, null where a tensor could not be read (sparse, meta).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from bisect_prefetch.adapters import digest
from bisect_prefetch.adapters.torch_digest import Weights, lanes, local, xor_rows
from bisect_prefetch.vocab import op_trace_file

_COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional", "_dtensor")
# Frames that are not the job's own code: torch's, and the in-job adapter's (a built-in
# reference workload's training code is the job's).
_OWN_DIRS = (os.path.dirname(torch.__file__), os.path.dirname(__file__))
# Ops the tool runs itself (its digests at the step boundary) are not the job's: not traced.
_TOOL_FILES = (os.path.join(os.path.dirname(__file__), "torch_digest.py"),)
_SKIP = object()
# In-place ops that overwrite their first argument without reading it.
_OVERWRITE = {"copy_", "zero_", "fill_", "normal_", "uniform_", "random_", "exponential_",
              "bernoulli_", "geometric_", "cauchy_", "log_normal_", "set_", "resize_"}
# Ops whose output holds whatever memory it got: no fingerprint (its writer comes later).
_UNINITIALIZED = {torch.ops.aten.empty.memory_format, torch.ops.aten.empty_like.default,
                  torch.ops.aten.empty_strided.default, torch.ops.aten.new_empty.default,
                  torch.ops.aten.new_empty_strided.default}
_tracer: OpTracer | None = None


def _key(t: torch.Tensor) -> tuple[Any, ...]:
    """Which memory a tensor's elements are, in which order (same key: same fingerprint)."""
    storage = t.untyped_storage().data_ptr()
    if t.is_contiguous():
        return (storage, t.storage_offset(), t.numel(), t.dtype)
    return (storage, t.storage_offset(), t.numel(), t.dtype, tuple(t.shape), t.stride())


class _Mode(TorchDispatchMode):
    def __init__(self, tracer: OpTracer) -> None:
        super().__init__()
        self.tracer = tracer

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.tracer.dispatch(func, args, kwargs or {})


class OpTracer:
    """One rank's trace of the window's steps (see the module docstring)."""

    def __init__(self, session: Any, first_step: int, last_step: int) -> None:
        self.session = session
        self.first_step = first_step
        self.last_step = last_step
        self.path = os.path.join(session.plan.out_dir, op_trace_file(session.rank))
        self.weights = Weights()
        self.mode = _Mode(self)
        self.active = False
        self.paused = False  # paused(): the mode is out for a while (the benchmark's)
        self.done = False
        self.hooks: list[Any] = []
        self.module_names: dict[Any, str] = {}
        self.param_names: dict[tuple[Any, ...], str] = {}  # a local shard's key -> its name
        self.module_stack: list[str] = []
        self.seq_module: dict[int, str] = {}  # autograd sequence number -> forward's module
        self.in_optimizer = False
        self.ops: list[list[Any]] = []  # a step's records, fingerprints as indices
        # Per fingerprint: the xor (uint64) and the weighted sum (int64), 0-d, on the device
        self.xors: list[torch.Tensor] = []
        self.sums: list[torch.Tensor] = []
        # key -> (step, seq, fingerprint: an index this step, its text once flushed)
        self.written: dict[tuple[Any, ...], tuple[int, int, Any]] = {}
        self.pending: dict[int, list[Any]] = {}  # storage -> [record, out index, tensor]
        # storage -> (step, seq) of the collective that filled it: the writer of its views
        self.collective_storage: dict[int, tuple[int, int]] = {}
        self.counts: dict[str, int] = {}
        self.step = 0
        self.seq = 0
        self.frames: dict[Any, bool] = {}  # code object -> whether it is the job's own
        self.ops_traced = 0
        self.bytes_written = 0
        self.seconds_flushing = 0.0

    # -- the window ---------------------------------------------------------------------
    def arm(self, *, now: bool = False) -> None:
        """Install the module hooks; the mode starts at the next outermost forward (now:
        at once, from a step end, which FSDP2's root forward pre-hook reports)."""
        hooks = torch.nn.modules.module
        self.hooks = [hooks.register_module_forward_pre_hook(self._pre_forward),
                      hooks.register_module_forward_hook(self._post_forward, always_call=True)]
        if now:
            self._start()

    def _start(self) -> None:
        if not self.active and not self.done and not self.paused:
            self.active = True
            self.mode.__enter__()

    def stop(self) -> None:
        if self.active:
            self.active = False
            self.mode.__exit__(None, None, None)
        for handle in self.hooks:
            handle.remove()
        self.hooks = []
        self.done = True

    def _pre_forward(self, module: Any, args: Any) -> None:
        if not self.module_names:
            self.module_names = _module_names(module)
            self.param_names = _param_names(self.module_names)
        if not self.module_stack:
            self._start()
        name = self.module_names.get(module)
        if name is None:
            name = type(module).__name__
        self.module_stack.append(name or "root")

    def _post_forward(self, module: Any, args: Any, output: Any) -> None:
        if self.module_stack:
            self.module_stack.pop()

    # -- the step clock's boundaries -----------------------------------------------------
    def on_update(self, step: int) -> None:
        self.in_optimizer = True
        if self.ops:
            self.flush()

    def on_step_end(self, step: int) -> None:
        self.in_optimizer = False
        self.seq_module.clear()
        if step + 1 == self.first_step:
            self.arm(now=True)
        if step >= self.last_step and not self.done:
            self.stop()
            self.flush()

    def on_exit(self) -> None:
        self.stop()
        if self.ops and self.session.last_step is not None:
            self.flush()
        self.session.probe_extra["op_trace"] = {
            "steps": [self.first_step, self.last_step], "ops": self.ops_traced,
            "bytes": self.bytes_written, "flush_s": round(self.seconds_flushing, 6)}

    # -- one op ---------------------------------------------------------------------------
    def dispatch(self, func: Any, args: tuple, kwargs: dict) -> Any:
        where = self._where()
        if where is _SKIP or getattr(func, "namespace", "") == "profiler":
            return func(*args, **kwargs)  # the tool's own ops; profiler markers (no data)
        step = self.session.clock.steps + 1
        if step != self.step:
            self.step, self.seq, self.counts = step, 0, {}
        name = str(func.overloadpacket) if hasattr(func, "overloadpacket") else str(func)
        schema = getattr(func, "_schema", None)
        view, write_only = _shape_of(func, schema)
        inputs = _tensors((args, kwargs))
        skipped = write_only and _tensors([_argument(schema, args, kwargs, k) for k in write_only])
        in_fps, sources, changed, params = self._read_inputs(
            inputs, {id(t) for t in skipped or ()}, view=view, step=step)
        out = func(*args, **kwargs)
        outputs = _tensors(out) + _written_arguments(schema, args, kwargs, write_only)
        record = [step, self.seq, name, self.counts.get(name, 0), self._phase(),
                  self._module(), in_fps, [], sources, changed, where, params]
        if view and inputs:  # a view's elements were written by its base's writer
            self._written_by_base(local(inputs[0]), outputs)
        collective = (getattr(func, "namespace", "") in _COLLECTIVE_NAMESPACES
                      and "wait" not in name)
        self._write_outputs(record, outputs, func, view=view, collective=collective, step=step)
        if "wait" in name:
            for t in outputs:
                self._settle(local(t), step, after=True)
        self.counts[name] = record[3] + 1
        self.seq += 1
        self.ops.append(record)
        self.ops_traced += 1
        return out

    def _read_inputs(self, inputs: list[Any], skipped_ids: set[int], *, view: bool,
                     step: int) -> tuple[list[Any], list[Any], list[Any], list[Any]]:
        """The op's inputs: their fingerprints, who wrote each (step, seq), those changed
        since their writer wrote them (index, then, now), and the parameters among them."""
        in_fps, sources, changed, params = [], [], [], []
        for k, t in enumerate(inputs):
            t = local(t)
            self._settle(t, step)
            # A view computes nothing; a buffer the op only writes holds whatever was there.
            fp = None if view or id(t) in skipped_ids else self._fingerprint(t)
            in_fps.append(fp)
            key = _key(t)
            source = self.written.get(key)
            if source is None and self.collective_storage:
                filled = self.collective_storage.get(t.untyped_storage().data_ptr())
                source = None if filled is None else (filled[0], filled[1], None)
            sources.append(None if source is None else [source[0], source[1]])
            param = self.param_names.get(key)
            if param is not None:
                params.append([k, param])
            if source is not None and fp is not None:
                if source[2] is not None:
                    changed.append((k, source[2], fp))
                elif t._base is not None:  # a view (views are not fingerprinted): its base
                    base = self.written.get(_key(t._base))
                    if base is not None and base[2] is not None:
                        base_fp = self._fingerprint(t._base)
                        if base_fp is not None:
                            changed.append((k, base[2], base_fp))
        return in_fps, sources, changed, params

    def _written_by_base(self, base_tensor: torch.Tensor, outputs: list[Any]) -> None:
        """A view's outputs: written by whoever wrote its base."""
        base = self.written.get(_key(base_tensor))
        if base is not None:
            for t in outputs:
                key = _key(local(t))
                if self.written.get(key) is not base:
                    self.written[key] = (base[0], base[1], None)

    def _write_outputs(self, record: list[Any], outputs: list[Any], func: Any, *, view: bool,
                       collective: bool, step: int) -> None:
        """The op's outputs fingerprinted into the record (a collective's when first read),
        and each remembered as written by this op."""
        seen, out_fps = set(), record[7]
        for t in outputs:
            t = local(t)
            key = _key(t)
            if key in seen:
                continue
            seen.add(key)
            if collective:  # filled when waited on: fingerprinted at its first reader
                self.pending[t.untyped_storage().data_ptr()] = [record, len(out_fps), t]
                out_fps.append(None)
                continue
            if self.collective_storage and not view:  # the memory is another tensor's now
                self.collective_storage.pop(t.untyped_storage().data_ptr(), None)
            fp = None if view or func in _UNINITIALIZED else self._fingerprint(t)
            out_fps.append(fp)
            if fp is not None:
                self.written[key] = (step, self.seq, fp)
            elif not view:  # new memory where another tensor was: that writer is gone
                self.written.pop(key, None)

    def _settle(self, t: torch.Tensor, step: int, *, after: bool = False) -> None:
        """A collective's output, read now: fingerprint it as the collective's output, and
        say which op read it (its step and seq: the op now dispatched, or after a wait the
        wait itself)."""
        if not self.pending:
            return
        storage = t.untyped_storage().data_ptr()
        entry = self.pending.pop(storage, None)
        if entry is not None:
            record, index, output = entry
            fp = self._fingerprint(output)
            record[7][index] = fp
            record.append([step, self.seq])  # the reader (the wait: this same op)
            self.collective_storage[storage] = (record[0], record[1])
            if fp is not None:
                self.written[_key(output)] = (record[0], record[1], fp)

    def _fingerprint(self, t: torch.Tensor) -> int | None:
        """Index of the tensor's two sums, computed on its device; None if it has none.

        Called inside the dispatch mode's handler (below autograd: nothing is recorded for
        backward) or with the modes off. A few tensor ops a tensor: the cost is per op."""
        try:
            if t.layout != torch.strided or t.device.type == "meta" or t.is_quantized:
                return None
            flat = t.view(-1) if t.is_contiguous() else t.reshape(-1)
            if flat.dtype == torch.bool:
                flat = flat.view(torch.int8)
            n = flat.numel()
            if n == 0:
                xor = torch.zeros((), dtype=torch.int64, device=t.device)
                weighted = torch.zeros((), dtype=torch.int64, device=t.device)
            else:
                xor = xor_rows(flat).reshape(())  # torch.hash_tensor where torch has it
                lane = lanes(flat)
                weighted = torch.mul(lane, self.weights.first(n, lane.dtype, lane.device)).sum(
                    dtype=lane.dtype)
                if weighted.dtype != torch.int64:
                    weighted = weighted.to(torch.int64)
        except (RuntimeError, TypeError, NotImplementedError):
            return None
        self.xors.append(xor)
        self.sums.append(weighted)
        return len(self.xors) - 1

    def _phase(self) -> str:
        if torch._C._current_autograd_node() is not None:
            return "backward"
        if self.module_stack:
            return "forward"
        return "optimizer" if self.in_optimizer else "other"

    def _module(self) -> str:
        node = torch._C._current_autograd_node()
        if node is not None:
            return self.seq_module.get(node._sequence_nr(), "")
        if not self.module_stack:
            return ""
        module = self.module_stack[-1]
        # The node this op may have created has the sequence number just below the counter.
        self.seq_module.setdefault(torch._C._autograd._get_sequence_nr() - 1, module)
        return module

    def _where(self) -> Any:
        """The first frame of the job's own code (file:line), None, or _SKIP for the tool's
        own ops."""
        frame = sys._getframe(2)
        frames = self.frames
        while frame is not None:
            code = frame.f_code
            kind = frames.get(code)
            if kind is None:
                name = code.co_filename
                kind = frames[code] = ("tool" if name in _TOOL_FILES else "lib" if (
                    name.startswith(_OWN_DIRS) or name.startswith("<")) else "job")
            if kind == "job":
                return f"{code.co_filename}:{frame.f_lineno}"
            if kind == "tool":
                return _SKIP
            frame = frame.f_back
        return None

    # -- to disk --------------------------------------------------------------------------
    def flush(self) -> None:
        """The step's fingerprints to the host in one transfer, its records to the file.

        A trace that cannot be written is said (the probe's errors), never the job's end."""
        try:
            with _disable_current_modes():  # its own ops are not the job's
                self._flush()
        except Exception as e:
            self.session.note_error(f"op trace not written: {e!r}")

    def _flush(self) -> None:
        import json
        import time

        start = time.perf_counter()
        if self.pending:  # never read in this step: fingerprint them as they are now
            for record, index, output in self.pending.values():
                record[7][index] = self._fingerprint(output)
            self.pending = {}
        self.collective_storage = {}
        ops, xors, sums = self.ops, self.xors, self.sums
        self.ops, self.xors, self.sums = [], [], []
        text = []
        spelled: list[str] = []
        if xors:
            n = len(xors)
            packed = torch.cat([torch.stack(xors).view(torch.int64), torch.stack(sums)])
            host = packed.cpu().tolist()  # the one transfer (and sync) of the step
            mask = digest.MASK64
            spelled = [f"{x & mask:016x}{w & mask:016x}" for x, w in zip(host[:n], host[n:])]
        for record in ops:
            step, seq, name, n, phase, module, ins, outs, sources, changed, where, params = (
                record[:12])
            reader = record[12] if len(record) > 12 else None
            ins_text = [None if i is None else spelled[i] for i in ins]
            chg = [k for k, written, used in changed
                   if (written if isinstance(written, str) else spelled[written]) != spelled[used]]
            text.append(json.dumps({
                "step": step, "seq": seq, "op": name, "n": n, "phase": phase,
                "module": module, "in": ins_text,
                "out": [None if i is None else spelled[i] for i in outs],
                "src": sources, "chg": chg, "at": where, **({"par": params} if params else {}),
                **({"rd": reader} if reader else {})},
                separators=(",", ":")))
        # Fingerprint indices restart with the next step: what was written is kept as text.
        self.written = {key: (st, sq, fp if fp is None or isinstance(fp, str) else spelled[fp])
                        for key, (st, sq, fp) in self.written.items()}
        data = ("\n".join(text) + "\n").encode("utf-8") if text else b""
        if data:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        self.bytes_written += len(data)
        self.seconds_flushing += time.perf_counter() - start


def _tensors(tree: Any) -> list[torch.Tensor]:
    """The tensors in an op's arguments or results (tuples, lists, dicts), in order."""
    if isinstance(tree, torch.Tensor):
        return [tree]
    found: list[torch.Tensor] = []
    if isinstance(tree, (tuple, list)):
        for item in tree:
            if isinstance(item, torch.Tensor):
                found.append(item)
            elif isinstance(item, (tuple, list, dict)):
                found += _tensors(item)
    elif isinstance(tree, dict):
        found += _tensors(list(tree.values()))
    return found



def _written_arguments(schema: Any, args: tuple, kwargs: dict, write_only: Any) -> list[Any]:
    """The tensors of the arguments an op writes: out=, in-place, a collective's buffers."""
    found: list[Any] = []
    if schema is None:
        return found
    for argument, value in zip(schema.arguments, args):
        info = argument.alias_info
        if info is not None and info.is_write:
            found += _tensors(value)
    for argument_name in write_only:  # out=, and a collective's output buffers
        found += _tensors(_argument(schema, args, kwargs, argument_name))
    return found

def _argument(schema: Any, args: tuple, kwargs: dict, name: str) -> Any:
    if name in kwargs:
        return kwargs[name]
    for k, argument in enumerate(schema.arguments):
        if argument.name == name:
            return args[k] if k < len(args) else None
    return None


_shapes: dict[Any, tuple[bool, tuple[str, ...]]] = {}


def _shape_of(func: Any, schema: Any) -> tuple[bool, tuple[str, ...]]:
    """(whether the op is a pure view, the names of the arguments it only writes), cached."""
    shape = _shapes.get(func)
    if shape is None:
        view, write_only = False, []
        if schema is not None:
            view = not schema.is_mutable and any(
                r.alias_info is not None for r in schema.returns)
            overwrites = str(getattr(func, "overloadpacket", "")).rsplit(".", 1)[-1] in _OVERWRITE
            for argument in schema.arguments:
                info = argument.alias_info
                writes = info is not None and info.is_write
                if (argument.is_out or (writes and overwrites)
                        or (getattr(func, "namespace", "") in _COLLECTIVE_NAMESPACES
                            and "output" in argument.name)):
                    write_only.append(argument.name)
        shape = _shapes[func] = (view, tuple(write_only))
    return shape


def _module_names(outermost: Any) -> dict[Any, str]:
    """Module -> fully qualified name: from the FSDP2 adapter's roots where it found them,
    else from the outermost module seen running."""
    roots = [outermost]
    fsdp2 = sys.modules.get("bisect_prefetch.adapters.fsdp2")
    found = fsdp2.adapter() if fsdp2 is not None else None
    if found is not None and found.roots:
        roots = [state._modules[0] for state in found.roots]
    names: dict[Any, str] = {}
    for root in roots:
        for name, module in root.named_modules():
            names.setdefault(module, name)
    return names


def _param_names(module_names: dict[Any, str]) -> dict[tuple[Any, ...], str]:
    """Each parameter's local tensor (a DTensor's shard) -> its name, from the roots."""
    names: dict[tuple[Any, ...], str] = {}
    for module, prefix in module_names.items():
        for name, param in module.named_parameters(recurse=False):
            try:
                names.setdefault(_key(local(param.data)), f"{prefix}.{name}" if prefix else name)
            except RuntimeError:
                continue
    return names


def activate(session: Any) -> None:
    """Trace the plan's window (called by install() when the job imports torch)."""
    global _tracer
    plan = session.plan if session is not None else None
    window = plan.trace if plan is not None else None
    if _tracer is not None or window is None or not plan.out_dir:
        return
    _tracer = OpTracer(session, *window)
    # Registered before the framework adapter's: the step's ops reach the file before its
    # digests, which the orchestrator may stop the run at.
    session.add_update_listener(_tracer.on_update)
    session.add_step_end_listener(_tracer.on_step_end)
    session.add_exit_listener(_tracer.on_exit)
    if _tracer.first_step == 1:
        _tracer.arm()


def tracer() -> OpTracer | None:
    """The active tracer, or None."""
    return _tracer


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Inside, no op is traced (to measure the tracer's cost side by side in one job)."""
    t = _tracer
    if t is None:
        yield
        return
    was_active, t.paused = t.active, True
    if was_active:
        t.active = False
        t.mode.__exit__(None, None, None)
    try:
        yield
    finally:
        t.paused = False
        if was_active:
            t._start()
