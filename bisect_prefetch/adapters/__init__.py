"""The in-process adapter: the part of bisect-prefetch that runs inside a training job.

Importing this package imports only the standard library; a framework adapter
is loaded only when the job itself imports that framework (see import_hook).

For a job (a workload or a user's training script):

- ``install(plan_path=None) -> Session``: read the plan (default: path in
  $BISECT_PREFETCH_PLAN; none = record nothing, change nothing), start
  recording, and arrange for the framework adapters to hook in when the job
  imports their framework. Idempotent. The launcher's sitecustomize calls it.
- ``report_step(step, **metrics)``: writes a metrics.jsonl line. The job needs
  no call of ours for anything else: step boundaries are found by the session's
  clock (adapters/steps.py: the optimizer's steps, else the root's backward
  passes); only where neither shows does a ``report_step`` call end a step. A
  no-op when nothing is installed.
- ``add_prefetch_listener(fn)``: ``fn(edge_id: str, target_module, issued: bool)``
  is called after every enabled prefetch has really run (not for masked or
  guarded ones). Reference workloads use it for planted faults.
- ``current_plan() -> dict | None``: the raw plan, for reference workloads.

For framework adapters (fsdp2, hyper_parallel, ...), through ``session()``:

- ``Session.prefetch(edge_id, *, target_shard_size, target_module, run)``: the
  gate every prefetch goes through. It applies the mask and the size-one guard,
  calls ``run() -> bool`` (True when a real unshard was issued) only if the
  edge may fire, tallies the outcome for the probe and notifies listeners.
  Returns the outcome name (vocab.PROBE_OUTCOMES). ``Session.guard_skips(size)``
  is the guard alone, for a prefetch that is no edge.
- ``Session.clock`` (adapters/steps.py): the framework adapters tell it where the
  optimizer steps and where the root's forward begins and backward ends.
- ``Session.add_watcher(w)`` (explain's tracer, adapters/op_trace.py): ``w`` is told where
  each enabled prefetch begins and ends, and, by the framework adapter through
  ``Session.unit_hook(module, phase, hook, begins)``, where each unit's own hooks run.
- ``Session.add_update_listener(fn(step))``: the optimizer is about to apply step
  ``step``'s gradients (digests now); ``add_step_end_listener(fn(step))``: the
  step ended (graph rewrite); ``add_exit_listener(fn())``: last words at exit.
- ``Session.order`` (adapters/order.py; None when the plan records no order):
  the framework adapters report each unit's unshards, uses and reshards to it;
  the gate itself records each prefetch and which edge the unshards inside it
  belong to. It records the plan's first ``record.order_steps`` steps.
- ``Session.step_seconds``: ``[step, seconds]`` per step (time since the previous
  step ended; step 1: since install), written to the probe as ``step_seconds``:
  each run's step time comes from it (judge/step_time.py). The probe also says
  ``step_source`` (optimizer, backward, report or null), ``steps_counted`` and
  the clock's ``step_notes``.
- ``Session.stress`` (adapters/stress.py; None unless the plan's ``stress`` is set):
  the gate delays each enabled prefetch before it issues; the framework adapters
  report each unit's use (``stress.used``) while it measures the issue-to-use gaps,
  and prefetches that left no window (``stress.no_window``). Its record is the
  probe's ``stress``.
- ``Session.gate`` (adapters/gate.py): the mask and the size-one guard. With the plan's
  ``schedule`` (adapters/plan.py) its mask starts as step 1's; when the clock ends step s
  (``_end_step``), step s+1's mask becomes the gate's, before any
  prefetch of step s+1 (where each clock source puts that boundary: adapters/steps.py;
  ``report``: wherever the job calls ``report_step``, numbered as the job numbers its
  steps, and the probe's ``step_notes`` say so). The probe says ``schedule_followed``:
  ``[[segment index, step it held from], ...]``, one entry per segment this rank ran
  under, listed once a prefetch went through the gate under it or a step ended under
  it (a segment whose first step never began, the job having exited, is absent). A job
  whose clock found no step boundary keeps segment 0's mask throughout, and the probe's
  ``step_notes`` say so. ``Session.refuse_schedule(reason)``: a framework adapter whose
  engine fixes the prefetch decisions once (compiled) keeps segment 0's mask; the probe
  says ``schedule_refused``: the reason.
- ``Session.recorder`` (None when the plan records nothing), ``Session.plan``,
  ``Session.probe_extra`` (a dict merged into probe.rank{R}.json),
  ``Session.write_environment()`` (env.rank{R}.json, adapters/environment.py: written at
  the first step's end, or at exit by a process that saw a prefetch) and
  ``Session.note_error(msg)`` (reported on stderr and listed in the probe).
- A framework adapter that cannot hook the job's engine (a torch outside the range it
  supports, a name it needs missing: adapters/fsdp2_support.py) raises ``NotActive`` with
  one line, "adapter not active: torch 2.7.1 is outside the supported range 2.8-2.15";
  any other failure to activate is said the same way. ``Session.not_active(line)`` writes
  the line to stderr and the probe (vocab.NOT_ACTIVE_KEY) and, under a plan, ends the job
  (SystemExit, status 1) at the import that activated the adapter: no run goes on
  without its adapter, and the orchestrator makes the line the run's error.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from bisect_prefetch.vocab import ADAPTER_NOT_ACTIVE, ISSUED, NOOP, NOT_ACTIVE_KEY, parse_edge_id

from . import environment, manifest
from .gate import Gate
from .import_hook import when_imported
from .order import OrderLog
from .plan import Plan, load_plan
from .recorder import ProbeTally, Recorder
from .steps import REPORT, StepClock
from .stress import Stress

PrefetchListener = Callable[[str, Any, bool], None]

# Frameworks with an adapter: module whose import activates it -> adapter module, which
# defines ``activate(session)``. An adapter module that is not there is skipped. An
# adapter module may import its framework's base package at its top (fsdp2.py imports
# torch, which does not import torch.distributed.fsdp), but never the module whose import
# activates it: if the job imported the adapter module first, the hook would otherwise fire
# while the adapter module is half-imported (fsdp2.py imports torch.distributed.fsdp's
# internals inside activate()).
FRAMEWORK_ADAPTERS = {
    "torch": "bisect_prefetch.adapters.op_trace",  # first: its step listeners before fsdp2's
    "mindspore": "bisect_prefetch.adapters.cell_trace",  # explain's trace, Cell granularity
    "torch.distributed.fsdp": "bisect_prefetch.adapters.fsdp2",
    # MindFormers 2.x shards through hyper-parallel, so this entry covers its jobs too.
    "hyper_parallel": "bisect_prefetch.adapters.hyper_parallel",
}

# After this many steps the probe file is rewritten at most once per interval:
# its size grows with the step count, and long jobs must not pay for it each step.
_PROBE_EVERY_STEP_UNTIL = 100
_PROBE_MIN_INTERVAL_S = 2.0
# Seconds per step are kept for this many steps (enough for a median after warm-up).
_STEP_TIMES_KEPT = 10_000


def rank_from_env() -> int:
    """The job's global rank as launchers export it (torchrun: RANK; msrun: RANK_ID)."""
    for name in ("RANK", "RANK_ID", "OMPI_COMM_WORLD_RANK"):
        value = os.environ.get(name)
        if value and value.isdigit():
            return int(value)
    return 0


class Session:
    """One job process under a plan: the prefetch gate, the probe and the recorder."""

    def __init__(self, plan: Plan | None, rank: int) -> None:
        self.plan = plan
        self.rank = rank
        self.pid = os.getpid()  # a forked child (a DataLoader worker) is not this process
        self.recorder = Recorder(plan.out_dir, rank) if plan and plan.out_dir else None
        self.tally = ProbeTally()
        self.probe_extra: dict[str, Any] = {}
        self.errors: list[str] = []
        self.last_step: int | None = None
        self._prefetch_listeners: list[PrefetchListener] = []
        self._update_listeners: list[Callable[[int], None]] = []
        self._step_end_listeners: list[Callable[[int], None]] = []
        self._exit_listeners: list[Callable[[], None]] = []
        # Those told where each prefetch begins and ends and where units run (explain's
        # tracer, adapters/op_trace.py): ``prefetch_begins(edge_id, target_module)``,
        # ``prefetch_ends(edge_id, target_module, issued)``, and from the framework adapter
        # ``unit_hook(module, phase, hook, begins)`` (see add_watcher).
        self.watchers: list[Any] = []
        self.gate = Gate(plan)  # the mask (by step, with a schedule) and the size-one guard
        self._last_probe_write = 0.0
        self._environment_written = False
        self._lock = threading.Lock()
        # The unit order of the first steps (None: not recorded); the framework adapters feed it.
        self.order: OrderLog | None = None
        if self.recorder is not None and plan.order_steps > 0:
            self.order = OrderLog(rank=rank, steps=plan.order_steps, write=self.recorder.order)
        # Delays before each prefetch is issued (None: no stress in the plan).
        self.stress: Stress | None = None
        if plan is not None and plan.stress is not None:
            self.stress = Stress(**plan.stress)
        # [step, seconds since the previous step ended (step 1: since install)]
        self.step_seconds: list[list[float]] = []
        self.forwards = 0  # root forward passes seen (a job with none shows no step anyway)
        self.clock = StepClock(on_update=self._update, on_end=self._end_step, note=self.note)

    # -- the prefetch gate ------------------------------------------------------------
    def prefetch(
        self,
        edge_id: str,
        *,
        target_shard_size: int,
        target_module: Any,
        run: Callable[[], bool],
    ) -> str:
        order = self.order
        event = order.begin_prefetch(edge_id) if order is not None else None
        outcome = self.gate.decide(edge_id, target_shard_size)
        if outcome is None:
            watchers = self.watchers
            for watcher in watchers:  # from here to the listeners' end: the edge's work
                watcher.prefetch_begins(edge_id, target_module)
            issued = False
            try:
                issued = self._issue(edge_id, target_module, run)
            finally:
                for watcher in watchers:
                    watcher.prefetch_ends(edge_id, target_module, issued)
            outcome = ISSUED if issued else NOOP
        with self._lock:
            self.tally.count(edge_id, outcome)
        if event is not None:
            event[2] = outcome
        return outcome

    def _issue(self, edge_id: str, target_module: Any, run: Callable[[], bool]) -> bool:
        """An enabled prefetch: stress's delay, the prefetch itself, its listeners."""
        order, stress = self.order, self.stress
        if stress is not None:  # the issuing side waits, never the consumer
            stress.before_issue(edge_id)
        if order is not None:
            order.set_running_edge(edge_id)  # unshards inside are this edge's
        try:
            issued = run()
        finally:
            if order is not None:
                order.set_running_edge(None)
        if issued and stress is not None and stress.measuring:
            try:
                phase, _, target = parse_edge_id(edge_id)
            except ValueError:
                pass  # no unit to wait for: the edge gets the default gap
            else:
                stress.issued(edge_id, target, phase)
        for listener in self._prefetch_listeners:
            listener(edge_id, target_module, issued)
        return issued

    def guard_skips(self, target_shard_size: int) -> bool:
        """The guard alone: whether a prefetch into a unit of this shard size is skipped."""
        return self.gate.guard_skips(target_shard_size)

    # -- listeners ----------------------------------------------------------------------
    def add_prefetch_listener(self, fn: PrefetchListener) -> None:
        self._prefetch_listeners.append(fn)

    def add_watcher(self, watcher: Any) -> None:
        """Tell ``watcher`` where each enabled prefetch begins and ends (its listeners'
        work included: a fault a listener plants is the prefetch's), and, through the
        framework adapter's ``unit_hook``, where each unit's own hooks run: ``hook`` is
        ``pre`` (its forward or backward pre-hook), ``post`` (its post-forward or
        post-backward) or ``wait`` (where it waits on its unshard, which a prefetch may
        have issued), ``begins`` True at the hook's start and False at its end."""
        self.watchers.append(watcher)

    def unit_hook(self, module: Any, phase: str, hook: str, begins: bool) -> None:
        for watcher in self.watchers:
            watcher.unit_hook(module, phase, hook, begins)

    def add_update_listener(self, fn: Callable[[int], None]) -> None:
        self._update_listeners.append(fn)

    def add_step_end_listener(self, fn: Callable[[int], None]) -> None:
        self._step_end_listeners.append(fn)

    def add_exit_listener(self, fn: Callable[[], None]) -> None:
        self._exit_listeners.append(fn)

    def note_error(self, message: str) -> None:
        self.errors.append(message)
        print(f"bisect-prefetch: {message}", file=sys.stderr, flush=True)

    def not_active(self, line: str) -> None:
        """A framework adapter could not hook the job's engine (``line``: why, one line).

        Under a plan the job stops here, with exit status 1: a run without its adapter
        would apply no mask and record nothing, and must never be taken for one that did.
        The line goes to stderr and into the probe (NOT_ACTIVE_KEY), which exit writes.
        Without a plan (nothing asked of the adapter) the job runs on, the line said."""
        self.note_error(line)
        if self.plan is None:
            return
        self.probe_extra[NOT_ACTIVE_KEY] = line
        raise SystemExit(1)  # past the job's `except Exception`: no run goes on without it

    def refuse_schedule(self, reason: str) -> None:
        """The engine cannot switch masks inside a run (``reason``, one line): segment 0's
        mask stays for the whole run, and the probe says ``schedule_refused``. A framework
        adapter calls it before the first step ends."""
        if self.gate.refuse(reason):
            self.note(f"the plan's schedule of masks is not followed: {reason}; segment 0's "
                      "mask stays for the whole run")

    def note(self, message: str) -> None:
        """Something about the job the run's record must say (not an error), on stderr; the
        clock keeps its own notes for the probe's ``step_notes``."""
        print(f"bisect-prefetch: {message}", file=sys.stderr, flush=True)

    # -- steps and files ----------------------------------------------------------------
    def report_step(self, step: int, metrics: dict[str, Any]) -> None:
        """The job's explicit call: its metrics line; a step boundary only as a last resort."""
        if self.recorder is not None:
            self.recorder.metrics(step, metrics)
        self.clock.reported(step)

    def _update(self, step: int) -> None:
        for listener in self._update_listeners:
            listener(step)

    def _end_step(self, step: int, seconds: float) -> None:
        if len(self.step_seconds) < _STEP_TIMES_KEPT:
            self.step_seconds.append([step, round(seconds, 6)])
        if self.order is not None:
            self.order.end_step(step)
        if self.stress is not None:
            self.stress.end_step(step)
        with self._lock:
            self.tally.end_step(step)
        self.last_step = step
        # Step step+1's mask, before its first prefetch (the clock ends a step before the
        # next one's first forward begins).
        if self.gate.step_ended(step) and self.clock.source == REPORT:
            self.clock.say_once("schedule-report", (
                "the schedule of masks switches at the job's report_step calls (no "
                "optimizer or backward boundary seen): a call inside a step moves the "
                "rest of that step to the next segment's mask"))
        if not self._environment_written:
            self.write_environment()
        for listener in self._step_end_listeners:
            listener(step)
        if step <= _PROBE_EVERY_STEP_UNTIL or self.gate.followed_unwritten or (
            time.monotonic() - self._last_probe_write >= _PROBE_MIN_INTERVAL_S
        ):
            self.write_probe()

    def write_probe(self) -> None:
        if self.recorder is None or not self.plan.record_probe:
            return
        clock = self.clock
        head = {"plan_hash": self.plan.hash, **self.probe_extra,
                "step_source": clock.source, "steps_counted": clock.steps,
                "step_notes": clock.notes, "step_seconds": self.step_seconds}
        if self.stress is not None:
            head["stress"] = self.stress.record()
        gate = self.gate
        if gate.refused is not None:
            head["schedule_refused"] = gate.refused
        if self.errors:
            head["errors"] = list(self.errors)
        with self._lock:
            if gate.schedule is not None:
                head["schedule_followed"] = gate.followed_for_probe()
            self.recorder.probe(head, self.tally)
        self._last_probe_write = time.monotonic()

    def write_environment(self) -> None:
        """env.rank{R}.json, once: the job's environment as this process sees it."""
        self._environment_written = True
        if self.recorder is None:
            return
        try:
            self.recorder.environment(environment.render(self.rank))
        except Exception as e:  # a fingerprint must never stop the job
            self.note_error(f"environment fingerprint not written: {e!r}")

    def close(self) -> None:
        if os.getpid() != self.pid:
            # A forked child inherits this exit handler: the rank's files are its parent's
            # (every writer owns its file); the child's manifest closes itself.
            return
        self.clock.close()
        if self.clock.source is None and self.forwards:
            self.clock.notes.append(
                "no step boundary found (no optimizer step of a hooked framework, no "
                "backward of a root unit, no report_step): digests, unit order and step "
                "times are off")
        schedule = self.gate.schedule
        if (schedule is not None and len(schedule) > 1 and self.clock.source is None
                and self.gate.refused is None and (self.forwards or self.tally.edges)):
            self.clock.say_once("schedule-no-steps", (
                "no step boundary found: the plan's schedule of masks was not followed; "
                "segment 0's mask held for the whole run"))
        for listener in self._exit_listeners:
            try:
                listener()
            except Exception as e:  # last words must not hide the job's own exit status
                self.note_error(f"exit listener failed: {e!r}")
        # A process that saw no step and no prefetch writes nothing: launcher processes
        # (torchrun's agent, msrun) inherit the plan too and must not clobber rank 0's files.
        if self.tally.edges or self.last_step is not None or self.errors:
            if not self._environment_written:
                self.write_environment()
            self.write_probe()
        if self.recorder is not None:
            self.recorder.close()


_session: Session | None = None
_install_lock = threading.Lock()


class NotActive(Exception):
    """A framework adapter refuses the job's engine; the message is the one line saying why
    (vocab.ADAPTER_NOT_ACTIVE: the version, what it lacks)."""


def _activate(adapter_name: str) -> Callable[[Any], None]:
    def activate(_module: Any) -> None:
        import importlib
        import importlib.util

        if importlib.util.find_spec(adapter_name) is None:
            return
        try:
            importlib.import_module(adapter_name).activate(session())
        except NotActive as e:
            session().not_active(str(e))
        except Exception as e:
            session().not_active(f"{ADAPTER_NOT_ACTIVE}: cannot activate {adapter_name}: {e!r}")

    return activate


def install(plan_path: str | None = None) -> Session:
    """Start the adapter in this process (idempotent); see the module docstring."""
    global _session
    with _install_lock:
        if _session is not None:
            return _session
        _session = Session(load_plan(plan_path), rank_from_env())
        manifest.attach(_session)  # what the job reads, for reuse (adapters/manifest.py)
        atexit.register(_session.close)
    for framework, adapter_name in FRAMEWORK_ADAPTERS.items():
        when_imported(framework, _activate(adapter_name))
    return _session


def session() -> Session | None:
    """The installed session, or None."""
    return _session


def current_plan() -> dict[str, Any] | None:
    """The raw plan dict of the installed session, or None."""
    return _session.plan.raw if _session is not None and _session.plan is not None else None


def report_step(step: int, **metrics: Any) -> None:
    """Record one finished optimizer step (no-op when the adapter is not installed)."""
    if _session is not None:
        _session.report_step(step, metrics)


def add_prefetch_listener(fn: PrefetchListener) -> None:
    """Call ``fn(edge_id, target_module, issued)`` after each enabled prefetch ran.

    Installs the adapter (without a plan, if none is set) when it is not yet installed.
    """
    install().add_prefetch_listener(fn)
