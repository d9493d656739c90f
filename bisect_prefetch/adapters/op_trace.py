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
- a fingerprint of each tensor input, taken just before the op ran (the xor of a
  digest), and of each output (returned tensors and arguments the op writes), taken just
  after: the two sums of a gradient digest (adapters/digest.py: every element,
  position-sensitive), computed on the tensor's device. Nothing waits for the host inside forward or backward: every
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

Targeted (the plan's ``record.trace.units``): only the ops of those units are recorded
(adapters/trace_scope.py says which unit an op runs for), and the dispatch mode is on only
while they run: entered and left by their hooks in forward (their FSDP2 pre- and
post-forward) and in backward (pre-backward, post-backward), and by each autograd node
their forward made, around its backward (autograd's engine restores, at every node, the
dispatch modes active when backward began: a mode entered in one node does not last into
the next). The other units run without it. Without units every op of the window is
recorded, the mode on from the window's first forward to its end.

Tied to the edges (the session's watchers, adapters/__init__.py): an op run inside a
prefetch (issued by it, or its listeners' work) or while a prefetched unit waits on its
unshard and copies it out carries the edge (``pf``: [edge, "issued"|"copy-out"]). Each
prefetch of the window whose source or target is traced opens a window: its target's
local parameter shards are fingerprinted when it is issued and again when the target
waits on the unshard (its use), in a record of its own (op ``prefetch-window``, ``pf``:
[edge, "window"]): a parameter changed behind the ops in that window shows there.

Never the job's end: a tensor it cannot read (a tensor subclass without memory of its own,
storage it cannot reach: adapters/trace_tensors.py) is not fingerprinted and named (``nf``,
and the probe's ``not_fingerprinted``); an error inside the tracer stops the trace, not the
job, and the probe's ``op_trace.failed`` says where (``explain`` then says the tool failed).

File: ``optrace.rank{R}.jsonl`` in the run dir, one line per op::

    {"step", "seq", "op", "n", "phase", "module", "in": [fp|null], "out": [fp|null],
     "src": [[step, seq]|null per input], "chg": [input indices], "at": "file:line"|null,
     "par": [[input index, parameter name], ...],   # only where an input is a parameter
     "rd": [step, seq],   # a collective's: the op that first read its output (or its wait)
     "pf": [edge id, "issued"|"copy-out"|"window"],  # the prefetch whose work it is
     "open": [step, seq],   # a window's: where the prefetch was issued
     "nf": [reason, ...]}   # what of its tensors could not be fingerprinted, and why

fp: an output's (and a unit's shard's) is 32 hex digits as a digest's; an input's is the
xor alone, 16 hex digits (one tensor op: any element that changed since its writer left it,
or between the runs, changes it); null where a tensor could not be read (sparse, meta).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from bisect_prefetch.adapters import digest
from bisect_prefetch.adapters.torch_digest import Weights, lanes, xor_rows
from bisect_prefetch.adapters.trace_scope import COPY_OUT, ISSUED, WINDOW, Scopes
from bisect_prefetch.adapters.trace_tensors import (
    key,
    readable,
    storage_of,
    storage_ref,
    unreadable,
    unwaited,
)
from bisect_prefetch.vocab import FWD, op_trace_file, parse_edge_id

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
# Ops that hand their input on without reading it (a functional collective's result
# wrapped for autograd before anyone waits on it): like a view, nothing to fingerprint.
_PASS_ON = {"_c10d_functional._wrap_tensor_autograd"}
_FUNCTIONAL = "_c10d_functional."  # its results are filled once waited on, never before
WINDOW_OP = "prefetch-window"  # a prefetch's window: its target's shards at issue and at use
_tracer: OpTracer | None = None


class _Mode(TorchDispatchMode):
    def __init__(self, tracer: OpTracer) -> None:
        super().__init__()
        self.tracer = tracer

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.tracer.dispatch(func, args, kwargs or {})


class OpTracer:
    """One rank's trace of the window's steps (see the module docstring).

    units: the units whose ops are recorded (targeted); None: every op."""

    def __init__(self, session: Any, first_step: int, last_step: int,
                 units: tuple[str, ...] | None = None) -> None:
        self.session = session
        self.first_step = first_step
        self.last_step = last_step
        self.units = None if units is None else frozenset(units)
        self.path = os.path.join(session.plan.out_dir, op_trace_file(session.rank))
        self.weights = Weights()
        self.mode = _Mode(self)
        self.active = False  # the mode is entered
        self.armed = False  # the window's steps: the module hooks are in
        self.paused = False  # paused(): the mode is out for a while (the benchmark's)
        self.done = False
        self.hooks: list[Any] = []
        self.scopes = Scopes()
        self.entered_by: Any = None  # targeted: the unit's module whose pre-forward entered
        self.hook_modes: list[bool] = []  # per running unit hook: whether it entered the mode
        self.node_modes: list[bool] = []  # per running autograd node: whether it entered
        self.unit_inputs: dict[int, set[Any]] = {}  # id(traced unit's module) -> input nodes
        self.param_names: dict[tuple[Any, ...], str] = {}  # a local shard's key -> its name
        self.in_optimizer = False
        self.ops: list[list[Any]] = []  # a step's records, fingerprints as indices
        # Per fingerprint: the xor and the weighted sum (int64), 0-d, on the device
        self.xors: list[torch.Tensor] = []
        self.sums: list[torch.Tensor] = []
        # Per fingerprint: its weighted sum's lane width (0: the xor alone, an input's)
        self.full: list[int] = []
        self.zeros: dict[Any, torch.Tensor] = {}  # a 0 per device and dtype (empty tensors)
        self.weight_views: dict[Any, torch.Tensor] = {}
        # key -> (step, seq, fingerprint: an index this step, its text once flushed, a weak
        # reference to the storage it was written in: once that is gone, the memory may hold
        # another tensor that ops the tracer did not see wrote)
        self.written: dict[tuple[Any, ...], tuple[int, int, Any, Any]] = {}
        self.written_now: list[tuple[Any, ...]] = []  # keys given an index this step
        self.pending: dict[int, list[Any]] = {}  # storage -> [record, out index, tensor]
        # storage -> (step, seq) of the collective that filled it: the writer of its views
        self.collective_storage: dict[int, tuple[int, int]] = {}
        # id(target module) -> [edge, shard names, fingerprints, writers, (step, seq) issued]
        self.windows: dict[int, list[Any]] = {}
        self.prefetched: dict[int, str] = {}  # id(target module) -> the edge that issued it
        self.counts: dict[str, int] = {}
        self.step = 0
        self.seq = 0
        self.frames: dict[Any, bool] = {}  # code object -> whether it is the job's own
        self.ops_traced = 0
        self.bytes_written = 0
        self.seconds_flushing = 0.0
        self.not_fingerprinted: dict[str, int] = {}  # why -> how many tensors
        self.failed: str | None = None  # where and why the tracer stopped (never the job)
        self.units_named = 0  # the FSDP2 adapter's units this tracer has taken
        self.untargeted: str | None = None  # why every op is traced though units were asked

    # -- the window ---------------------------------------------------------------------
    def arm(self, *, now: bool = False) -> None:
        """Install the module hooks; in full tracing the mode starts at the next outermost
        forward (now: at once, from a step end, which FSDP2's root forward pre-hook
        reports); targeted, at a traced unit's forward."""
        hooks = torch.nn.modules.module
        self.hooks = [hooks.register_module_forward_pre_hook(self._pre_forward),
                      hooks.register_module_forward_hook(self._post_forward, always_call=True)]
        self.armed = True
        if now and self.units is None:
            self._start()

    def _start(self) -> None:
        if not self.active and not self.done and not self.paused:
            self.active = True
            self.mode.__enter__()

    def _leave(self) -> None:
        if self.active:
            self.active = False
            self.mode.__exit__(None, None, None)

    def stop(self) -> None:
        self._leave()
        for handle in self.hooks:
            handle.remove()
        self.hooks = []
        self.armed = False
        self.done = True

    def _pre_forward(self, module: Any, args: Any) -> None:
        scopes = self.scopes
        if not scopes.module_names:
            self._guarded(self._name_modules, module)
        if not scopes.module_stack and self.units is None and self.failed is None:
            self._start()
        scopes.module_stack.append(scopes.name(module))
        if self.units is not None and scopes.unit_of_module.get(module) in self.units:
            # Where its backward stops: the nodes that made its inputs (another unit's).
            self.unit_inputs[id(module)] = {t.grad_fn for t in _tensors(args)
                                            if t.grad_fn is not None}

    def _name_modules(self, outermost: Any) -> None:
        """Module and parameter names, at the window's first forward; the units by module."""
        scopes = self.scopes
        scopes.name_modules(_module_names(outermost))
        self.param_names = _param_names(scopes.module_names)
        self._name_units()
        fsdp2 = sys.modules.get("bisect_prefetch.adapters.fsdp2")
        if self.units is not None and (fsdp2 is None or fsdp2.adapter() is None):
            # No FSDP2 unit hooks tell where a unit's ops run: every op instead.
            self.units = None
            self.untargeted = "the job's engine reports no unit scopes: every op traced"

    def _post_forward(self, module: Any, args: Any, output: Any) -> None:
        stack = self.scopes.module_stack
        if stack:
            stack.pop()
        stops = self.unit_inputs.pop(id(module), None)
        if stops is not None and self.failed is None:
            self._guarded(self._hook_backward, output, stops)

    # -- targeted tracing in backward -----------------------------------------------------
    def _hook_backward(self, output: Any, stops: set[Any]) -> None:
        """Each autograd node a traced unit's forward made (from its outputs back to its
        inputs) enters the mode for its backward and leaves it after: autograd's engine
        restores, at every node, the dispatch modes active when backward began, so a mode
        entered anywhere else in backward would not last; the other units' backward runs
        without it."""
        seen: set[Any] = set(stops)
        todo = [t.grad_fn for t in _tensors(output) if t.grad_fn is not None]
        while todo:
            node = todo.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            if "AccumulateGrad" in node.name():
                continue  # a parameter's: it lives on past this step's backward
            node.register_prehook(self._node_begins)
            node.register_hook(self._node_ends)
            todo.extend(next_node for next_node, _ in node.next_functions)

    def _node_begins(self, grad_outputs: Any) -> None:
        entered = self.failed is None and not self.active and not self.done
        if entered:
            self._start()
        self.node_modes.append(entered)

    def _node_ends(self, grad_inputs: Any, grad_outputs: Any) -> None:
        if self.node_modes and self.node_modes.pop():
            self._leave()

    # -- the session's watcher: prefetches and units -------------------------------------
    def prefetch_begins(self, edge_id: str, target_module: Any) -> None:
        self.scopes.edges.append((edge_id, ISSUED))
        if self.armed and self.failed is None and self._watches(edge_id):
            self._guarded(self._open_window, edge_id, target_module)

    def prefetch_ends(self, edge_id: str, target_module: Any, issued: bool) -> None:
        if self.scopes.edges:
            self.scopes.edges.pop()
        if issued and target_module is not None:
            self.prefetched[id(target_module)] = edge_id

    def unit_hook(self, module: Any, phase: str, hook: str, begins: bool) -> None:
        """A unit's own hook begins or ends (adapters/fsdp2.py says which)."""
        if self.failed is not None:
            return
        if hook == "wait":
            self._guarded(self._wait, module, begins)
            return
        scopes = self.scopes
        if begins:
            self._guarded(self._name_units)
            unit = scopes.unit_of_module.get(module)
            scopes.hook_units.append(unit)
            enter = (self.units is not None and self.armed and unit in self.units
                     and not self.active)
            if enter:
                self._start()  # a traced unit's hook: its work is the unit's
            if phase == FWD and hook == "pre":
                if enter:  # the mode stays through the unit's forward, to its post-hook
                    self.entered_by = module
                enter = False
            self.hook_modes.append(enter)
            return
        if scopes.hook_units:
            scopes.hook_units.pop()
        if self.hook_modes and self.hook_modes.pop():
            self._leave()
        if phase == FWD and hook == "post" and module is self.entered_by:
            self.entered_by = None
            self._leave()

    def _wait(self, module: Any, begins: bool) -> None:
        """A unit waits on its unshard: a prefetch's window closes; the copy-out that
        follows is the prefetch's work."""
        if not begins:
            if self.scopes.edges:
                self.scopes.edges.pop()
            return
        window = self.windows.pop(id(module), None)
        if window is not None:
            self._close_window(window, module)
        edge = self.prefetched.pop(id(module), None)
        self.scopes.edges.append(None if edge is None else (edge, COPY_OUT))

    def _watches(self, edge_id: str) -> bool:
        if self.units is None:
            return True
        try:
            _, src, dst = parse_edge_id(edge_id)
        except ValueError:
            return False
        return src in self.units or dst in self.units

    def _open_window(self, edge_id: str, target_module: Any) -> None:
        if target_module is None:
            return
        self._name_units()
        with _disable_current_modes():  # its own ops are not the job's
            names, fps, sources = self._shards_now(target_module)
        step, seq = self._place_peek()
        self.windows[id(target_module)] = [edge_id, names, fps, sources, (step, seq)]

    def _close_window(self, window: list[Any], module: Any) -> None:
        edge_id, names, opened, sources, where = window
        with _disable_current_modes():
            _, closed, _ = self._shards_now(module)
        step, seq, n = self._place(WINDOW_OP)
        unit = self.scopes.unit_of_module.get(module) or self.scopes.name(module)
        record = [step, seq, WINDOW_OP, n, self._phase(), unit, opened, closed, sources, [],
                  None, [[k, name] for k, name in enumerate(names)],
                  {"pf": [edge_id, WINDOW], "open": list(where)}]
        self.ops.append(record)
        self.ops_traced += 1

    def _shards_now(self, module: Any) -> tuple[list[str], list[Any], list[Any]]:
        """The unit's local parameter shards: names, fingerprints, who last wrote each."""
        names, fps, sources = [], [], []
        for name, shard in _shards(module):
            plain, why = readable(shard, wait=False)
            names.append(name)
            fps.append(None if plain is None else self._fingerprint(plain))
            source = self._writer(key(plain)) if plain is not None else None
            sources.append(None if source is None else [source[0], source[1]])
            if why is not None:
                self._not_fingerprinted(why)
        return names, fps, sources

    def _name_units(self) -> None:
        """The FSDP2 adapter's units by module (they are named at the root's lazy init)."""
        fsdp2 = sys.modules.get("bisect_prefetch.adapters.fsdp2")
        found = fsdp2.adapter() if fsdp2 is not None else None
        if found is None or len(found.units) == self.units_named or not self.scopes.module_names:
            return  # (before the window's first forward the modules have no names yet)
        self.units_named = len(found.units)
        units = {}
        for state in found.units:
            name = found.name_of(state)
            for module in getattr(state, "_modules", ()):
                units[module] = name
        self.scopes.name_units(units)

    # -- the step clock's boundaries -----------------------------------------------------
    def on_update(self, step: int) -> None:
        self.in_optimizer = True
        if self.ops:
            self.flush()

    def on_step_end(self, step: int) -> None:
        self.in_optimizer = False
        self.scopes.step_ended()
        if step + 1 == self.first_step:
            self.arm(now=True)
        if step >= self.last_step and not self.done:
            self.stop()
            self.flush()

    def on_exit(self) -> None:
        self.stop()
        if self.ops and self.session.last_step is not None:
            self.flush()
        record: dict[str, Any] = {
            "steps": [self.first_step, self.last_step], "ops": self.ops_traced,
            "bytes": self.bytes_written, "flush_s": round(self.seconds_flushing, 6)}
        if self.units is not None:
            record["units"] = sorted(self.units)
        if self.untargeted:
            record["untargeted"] = self.untargeted
        if self.not_fingerprinted:
            record["not_fingerprinted"] = dict(sorted(self.not_fingerprinted.items()))
        if self.failed is not None:
            record["failed"] = self.failed
        self.session.probe_extra["op_trace"] = record

    # -- failures: the trace stops, never the job ----------------------------------------
    def _guarded(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as e:  # the tool's own failure: said, and the job runs on
            self._fail(getattr(fn, "__name__", "tracer"), e)
            return None

    def _fail(self, where: str, error: BaseException) -> None:
        if self.failed is not None:
            return
        self.failed = f"step {self.step}, op {self.seq}, in {where}: {error!r}"
        self.session.note_error(f"op trace stopped, the job runs on untraced: the tracer "
                                f"failed at {self.failed}")

    # -- one op ---------------------------------------------------------------------------
    def dispatch(self, func: Any, args: tuple, kwargs: dict) -> Any:
        begun = None
        if self.failed is None and getattr(func, "namespace", "") != "profiler":
            try:
                begun = self._begin(func, args, kwargs)
            except Exception as e:  # the tool's failure: the op still runs, as the job's
                self._fail(f"{func} (its inputs)", e)
        if begun is None:
            return func(*args, **kwargs)  # not traced: the tool's own op, another unit's
        out = func(*args, **kwargs)  # the job's own error is the job's
        try:
            self._end(begun, func, args, kwargs, out)
        except Exception as e:
            self._fail(f"{func} (its outputs)", e)
        return out

    def _begin(self, func: Any, args: tuple, kwargs: dict) -> list[Any] | None:
        """The op's record with its inputs read, or None where it is not traced."""
        node = torch._C._current_autograd_node()
        if self.units is not None and self.scopes.unit(node) not in self.units:
            return None
        where = self._where()
        if where is _SKIP:
            return None
        shape = _shape_of(func)
        name, view = shape.name, shape.view
        inputs = _tensors((args, kwargs))
        skipped = shape.write_only and _tensors(
            [_value(args, kwargs, at) for at in shape.write_only])
        step, seq, n = self._place(name)
        extra: dict[str, Any] = {}
        in_fps, sources, changed, params = self._read_inputs(
            name, inputs, {id(t) for t in skipped or ()}, view=view, step=step, extra=extra)
        module = self.scopes.hook_units[-1] if self.scopes.hook_units else None
        if module is None:
            module = self.scopes.module(node, torch._C._autograd._get_sequence_nr())
        edge = self.scopes.edge()
        if edge is not None:
            extra["pf"] = list(edge)
        return [step, seq, name, n, self._phase(node), module or "", in_fps, [], sources,
                changed, where, params, extra, shape, inputs]

    def _end(self, begun: list[Any], func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        shape, inputs = begun[13:]
        record = begun[:13]
        step, view = record[0], shape.view
        outputs = _tensors(out)
        for at in shape.writes:  # the arguments it wrote: in place, out=, a buffer
            outputs += _tensors(_value(args, kwargs, at))
        if view and inputs:  # a view's elements were written by its base's writer
            base, _ = readable(inputs[0], wait=False)
            if base is not None:
                self._written_by_base(base, outputs)
        self._write_outputs(record, outputs, func, view=view, collective=shape.collective,
                            step=step)
        if shape.waits:
            for t in outputs:
                plain, _ = readable(t, wait=False)
                if plain is not None:
                    self._settle(plain, step, waited=True, seq=record[1])
        self.ops.append(record)
        self.ops_traced += 1

    def _place(self, name: str) -> tuple[int, int, int]:
        """(step, seq, occurrence) of the next record, counted."""
        step = self.session.clock.steps + 1
        if step != self.step:
            self.step, self.seq, self.counts = step, 0, {}
        seq, n = self.seq, self.counts.get(name, 0)
        self.seq += 1
        self.counts[name] = n + 1
        return step, seq, n

    def _place_peek(self) -> tuple[int, int]:
        """(step, seq) where the next record would go (a window's opening)."""
        step = self.session.clock.steps + 1
        return (step, self.seq if step == self.step else 0)

    def _read_inputs(self, name: str, inputs: list[Any], skipped_ids: set[int], *, view: bool,
                     step: int, extra: dict[str, Any]
                     ) -> tuple[list[Any], list[Any], list[Any], list[Any]]:
        """The op's inputs: their fingerprints, who wrote each (step, seq), those changed
        since their writer wrote them (index, then, now), and the parameters among them."""
        in_fps, sources, changed, params = [], [], [], []
        for k, arg in enumerate(inputs):
            # A view computes nothing (and does not wait); a buffer the op only writes
            # holds whatever was there: neither is fingerprinted.
            reads = not view and id(arg) not in skipped_ids
            t, why = readable(arg, wait=reads)
            if t is None:
                self._not_fingerprinted(why, extra)
                in_fps.append(None)
                sources.append(None)
                continue
            if name not in _PASS_ON and (reads or not unwaited(arg)):
                # (a functional collective's result is filled once waited on: here where
                # reading it waited, as an AsyncCollectiveTensor does for every op but a view)
                self._settle(t, step, waited=reads and callable(getattr(arg, "trigger_wait",
                                                                         None)))
            fp = self._fingerprint(t, extra, full=False) if reads else None
            in_fps.append(fp)
            memory = key(t)
            source = self._writer(memory)
            if source is None and (self.collective_storage or self.pending):
                storage = storage_of(t)
                filled = self.collective_storage.get(storage)
                if filled is None and storage in self.pending:  # a collective's, still in flight
                    filled = self.pending[storage][0][:2]
                source = None if filled is None else (filled[0], filled[1], None)
            sources.append(None if source is None else [source[0], source[1]])
            param = None if memory is None else self.param_names.get(memory)
            if param is not None:
                params.append([k, param])
            if source is not None and fp is not None:
                if source[2] is not None:
                    changed.append((k, source[2], fp))
                elif t._base is not None:  # a view (views are not fingerprinted): its base
                    base = self._writer(key(t._base))
                    if base is not None and base[2] is not None:
                        base_fp = self._fingerprint(t._base, full=False)
                        if base_fp is not None:
                            changed.append((k, base[2], base_fp))
        return in_fps, sources, changed, params

    def _writer(self, memory: tuple[Any, ...] | None) -> tuple[int, int, Any, Any] | None:
        """The traced op that last wrote this memory, while the storage it wrote is alive
        (a storage gone: the memory is another tensor's now, written unseen)."""
        if memory is None:
            return None
        entry = self.written.get(memory)
        if entry is not None and entry[3] is not None and entry[3].expired():
            del self.written[memory]
            return None
        return entry

    def _written_by_base(self, base_tensor: torch.Tensor, outputs: list[Any]) -> None:
        """A view's outputs: written by whoever wrote its base."""
        base = self._writer(key(base_tensor))
        if base is None:
            return
        for t in outputs:
            plain, _ = readable(t, wait=False)
            memory = None if plain is None else key(plain)
            if memory is not None and self.written.get(memory) is not base:
                self.written[memory] = (base[0], base[1], None, base[3])

    def _write_outputs(self, record: list[Any], outputs: list[Any], func: Any, *, view: bool,
                       collective: bool, step: int) -> None:
        """The op's outputs fingerprinted into the record (a collective's when first read),
        and each remembered as written by this op."""
        seen, out_fps, extra = set(), record[7], record[12]
        for arg in outputs:
            t, why = readable(arg, wait=False)
            memory = None if t is None else key(t)
            if memory is None:
                if why is None and t is not None:
                    why = unreadable(t) or "storage cannot be read"
                self._not_fingerprinted(why, extra)
                out_fps.append(None)
                continue
            if memory in seen:
                continue
            seen.add(memory)
            if collective:  # filled when waited on: fingerprinted at its first reader
                self.pending[storage_of(t)] = [record, len(out_fps), t]
                out_fps.append(None)
                continue
            if self.collective_storage and not view:  # the memory is another tensor's now
                self.collective_storage.pop(storage_of(t), None)
            fp = None if view or func in _UNINITIALIZED else self._fingerprint(t, extra)
            out_fps.append(fp)
            if fp is not None:
                self.written[memory] = (step, record[1], fp, storage_ref(t))
                self.written_now.append(memory)
            elif not view:  # new memory where another tensor was: that writer is gone
                self.written.pop(memory, None)

    def _settle(self, t: torch.Tensor, step: int, *, waited: bool = False,
                seq: int | None = None) -> None:
        """A collective's output, read now: fingerprint it as the collective's output, and
        say which op read it (its step and seq: the op now dispatched, or after a wait the
        wait itself). A functional collective's only once waited on."""
        if not self.pending:
            return
        storage = storage_of(t)
        entry = self.pending.get(storage)
        if entry is not None and (waited or not entry[0][2].startswith(_FUNCTIONAL)):
            del self.pending[storage]
            record, index, output = entry
            fp = self._fingerprint(output)
            record[7][index] = fp
            record[12]["rd"] = [step, self.seq - 1 if seq is None else seq]
            self.collective_storage[storage] = (record[0], record[1])
            memory = key(output)
            if fp is not None and memory is not None:
                self.written[memory] = (record[0], record[1], fp, storage_ref(output))
                self.written_now.append(memory)

    def _not_fingerprinted(self, why: str | None, extra: dict[str, Any] | None = None) -> None:
        why = why or "unreadable tensor"
        self.not_fingerprinted[why] = self.not_fingerprinted.get(why, 0) + 1
        if extra is not None:
            reasons = extra.setdefault("nf", [])
            if why not in reasons:
                reasons.append(why)

    def _fingerprint(self, t: torch.Tensor, extra: dict[str, Any] | None = None, *,
                     full: bool = True) -> int | None:
        """Index of the tensor's fingerprint, computed on its device; None if it has none
        (named in extra's ``nf``). full: both sums of a digest (an op's outputs, a unit's
        shards); else the xor alone (an op's inputs: one tensor op, and enough to see any
        element that changed since its writer left it, or between runs).

        Called inside the dispatch mode's handler (below autograd: nothing is recorded for
        backward) or with the modes off. A few tensor ops a tensor: the cost is per op."""
        why = unreadable(t)
        if why is not None:
            self._not_fingerprinted(why, extra)
            return None
        bits = 0  # the weighted sum's lane width (0: no weighted sum, the xor alone)
        try:
            flat = t.view(-1) if t.is_contiguous() else t.reshape(-1)
            if flat.dtype == torch.bool:
                flat = flat.view(torch.int8)
            n = flat.numel()
            device = flat.device
            if n == 0:
                xor = self._zero(device, torch.int64)
            else:
                xor = xor_rows(flat).reshape(())  # torch.hash_tensor where torch has it
            weighted = self._zero(device, torch.int64)
            if full and n:
                lane = lanes(flat)
                bits = digest.lane_bits(flat.element_size())
                # Summed in 64 bits and wrapped to the lane's width on the host (_spell):
                # the same sum modulo 2^L, one op fewer a tensor.
                weighted = torch.mul(lane, self._weights(n, lane.dtype, device)).sum(
                    dtype=torch.int64)
            elif full:
                bits = 64
        except (RuntimeError, TypeError, NotImplementedError) as e:
            self._not_fingerprinted(f"{t.dtype} ({type(e).__name__})", extra)
            return None
        self.xors.append(xor)
        self.sums.append(weighted)
        self.full.append(bits)
        return len(self.xors) - 1

    def _zero(self, device: Any, dtype: torch.dtype) -> torch.Tensor:
        zero = self.zeros.get((device, dtype))
        if zero is None:
            zero = self.zeros[(device, dtype)] = torch.zeros((), dtype=dtype, device=device)
        return zero

    def _weights(self, n: int, dtype: torch.dtype, device: Any) -> torch.Tensor:
        """The first n weights of adapters/digest.py, cached by size (sizes repeat)."""
        found = self.weight_views.get((n, dtype, device))
        if found is None:
            found = self.weight_views[(n, dtype, device)] = self.weights.first(n, dtype, device)
        return found

    def _phase(self, node: Any = None) -> str:
        if node is not None or torch._C._current_autograd_node() is not None:
            return "backward"
        if self.scopes.module_stack:
            return "forward"
        return "optimizer" if self.in_optimizer else "other"

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
            self._fail("flush", e)

    def _flush(self) -> None:
        import json
        import time

        start = time.perf_counter()
        if self.pending:  # never read in this step: fingerprint them as they are now
            for record, index, output in self.pending.values():
                record[7][index] = self._fingerprint(output)
            self.pending = {}
        self.collective_storage = {}
        self.windows, self.prefetched = {}, {}  # a window never closed: no use this step
        ops, xors, sums, full = self.ops, self.xors, self.sums, self.full
        self.ops, self.xors, self.sums, self.full = [], [], [], []
        text = []
        spelled: list[str] = []
        if xors:
            n = len(xors)
            packed = torch.cat([torch.stack(xors), torch.stack(sums)])
            host = packed.cpu().tolist()  # the one transfer (and sync) of the step
            spelled = [_spell(x, w, bits) for x, w, bits in zip(host[:n], host[n:], full)]
        for record in ops:
            step, seq, name, n, phase, module, ins, outs, sources, changed, where, params, extra = (
                record)
            # (an input's fingerprint is the xor alone: the writer's first half)
            chg = [k for k, written, used in changed
                   if (written if isinstance(written, str) else spelled[written])[:16]
                   != spelled[used][:16]]
            text.append(json.dumps({
                "step": step, "seq": seq, "op": name, "n": n, "phase": phase,
                "module": module, "in": [None if i is None else spelled[i] for i in ins],
                "out": [None if i is None else spelled[i] for i in outs],
                "src": sources, "chg": chg, "at": where, **({"par": params} if params else {}),
                **extra}, separators=(",", ":")))
        # Fingerprint indices restart with the next step: what was written is kept as text
        # (only what this step wrote holds an index).
        written = self.written
        for memory in self.written_now:
            entry = written.get(memory)
            if entry is not None and isinstance(entry[2], int):
                written[memory] = (entry[0], entry[1], spelled[entry[2]], entry[3])
        self.written_now = []
        data = ("\n".join(text) + "\n").encode("utf-8") if text else b""
        if data:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        self.bytes_written += len(data)
        self.seconds_flushing += time.perf_counter() - start


def _spell(xor: int, weighted: int, bits: int) -> str:
    """A fingerprint's text: the xor, then (bits > 0) the weighted sum wrapped to its lane
    width and sign-extended, as a digest spells it (adapters/digest.py)."""
    mask = digest.MASK64
    if not bits:
        return f"{xor & mask:016x}"
    if bits == 32:
        weighted = ((weighted & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000
    return f"{xor & mask:016x}{weighted & mask:016x}"


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


class _Shape(NamedTuple):
    """What the tracer needs to know of an op, once (cached per op)."""

    name: str
    view: bool  # computes nothing from its inputs' values: a view, a wait, a hand-on
    collective: bool  # its outputs are filled later: fingerprinted when waited on or read
    waits: bool  # a wait: its outputs are a collective's, filled now
    writes: tuple[tuple[int, str], ...]  # (position, name) of each argument it writes
    write_only: tuple[tuple[int, str], ...]  # those it writes without reading them


def _value(args: tuple, kwargs: dict, at: tuple[int, str]) -> Any:
    position, name = at
    if name in kwargs:
        return kwargs[name]
    return args[position] if position < len(args) else None


_shapes: dict[Any, _Shape] = {}


def _shape_of(func: Any) -> _Shape:
    """The op's _Shape, cached."""
    shape = _shapes.get(func)
    if shape is not None:
        return shape
    name = str(func.overloadpacket) if hasattr(func, "overloadpacket") else str(func)
    namespace = getattr(func, "namespace", "")
    schema = getattr(func, "_schema", None)
    view, writes, write_only = False, [], []
    waits = "wait" in name
    if schema is not None:
        view = not schema.is_mutable and any(r.alias_info is not None for r in schema.returns)
        overwrites = name.rsplit(".", 1)[-1] in _OVERWRITE
        for position, argument in enumerate(schema.arguments):
            info = argument.alias_info
            written = info is not None and info.is_write
            at = (position, argument.name)
            buffer = namespace in _COLLECTIVE_NAMESPACES and "output" in argument.name
            if written or argument.is_out or buffer:
                writes.append(at)
            if argument.is_out or (written and overwrites) or buffer:
                write_only.append(at)
    # A wait fills its input (fingerprinted after it, as the collective's output).
    view = view or name in _PASS_ON or waits
    collective = namespace in _COLLECTIVE_NAMESPACES and not waits and name not in _PASS_ON
    shape = _shapes[func] = _Shape(name, view, collective, waits, tuple(writes),
                                   tuple(write_only))
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
            plain, _ = readable(param.data, wait=False)
            memory = None if plain is None else key(plain)
            if memory is not None:
                names.setdefault(memory, f"{prefix}.{name}" if prefix else name)
    return names


def _shards(module: Any) -> list[tuple[str, Any]]:
    """A unit's local parameter shards by name: FSDP2's sharded parameters where the
    module is an FSDP unit (its groups' own, not nested units'), else its parameters."""
    get_state = getattr(module, "_get_fsdp_state", None)
    if get_state is not None:
        state = get_state()
        groups = getattr(state, "_fsdp_param_groups", None)  # a list from torch 2.12
        if groups is None:  # before: one group or None
            groups = [g for g in (getattr(state, "_fsdp_param_group", None),) if g is not None]
        return [(p._param_fqn, p.sharded_param) for group in groups
                for p in group.fsdp_params]
    return list(module.named_parameters())


def activate(session: Any) -> None:
    """Trace the plan's window (called by install() when the job imports torch)."""
    global _tracer
    plan = session.plan if session is not None else None
    window = plan.trace if plan is not None else None
    if _tracer is not None or window is None or not plan.out_dir:
        return
    _tracer = OpTracer(session, *window, units=getattr(plan, "trace_units", None))
    # Registered before the framework adapter's: the step's ops reach the file before its
    # digests, which the orchestrator may stop the run at.
    session.add_update_listener(_tracer.on_update)
    session.add_step_end_listener(_tracer.on_step_end)
    session.add_exit_listener(_tracer.on_exit)
    session.add_watcher(_tracer)
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


@contextlib.contextmanager
def targeting(units: tuple[str, ...] | None) -> Iterator[None]:
    """Inside, only these units' ops are traced (None: every op), as a plan's
    ``record.trace.units`` asks: targeted and full tracing side by side in one job (the
    benchmark's). Entered and left between steps."""
    t = _tracer
    if t is None:
        yield
        return
    saved = t.units
    t._leave()
    t.units = None if units is None else frozenset(units)
    try:
        yield
    finally:
        t._leave()
        if t.ops:  # its records (the optimizer's ops too) written by its own step
            t.flush()
        t.units = saved
