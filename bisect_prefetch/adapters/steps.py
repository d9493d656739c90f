"""Step boundaries inside a job that calls nothing of ours: where a training step ends.

The per-step work of the adapter (digests, the order record, step times, the probe's
per-step tally, segment switches) needs to know when a step ends. A user's job calls no
function of ours, so the clock finds the boundaries itself, from the first of these
sources that the job shows:

1. ``optimizer``: the framework's optimizer steps (torch: the global optimizer step pre-
   and post-hooks; MindSpore: the optimizer Cell's call). The first optimizer call after a
   backward opens the update: the gradients it is about to apply are digested then (the
   "pre-update gradient" snapshot). Every optimizer call until the next forward pass
   belongs to the same update, so gradient accumulation (several backward passes, one
   update) and several optimizers (one per parameter group) each make one step. The step
   ends when the next forward pass begins, or at exit.
2. ``backward``: a job with no optimizer of its framework (a hand-written update): a step
   is one forward and backward of the root unit, and ends when the root's backward ends
   (gradients are digested then, before the job's own update). Said once in the record.
3. ``report``: ``report_step`` calls, where the job makes them and neither of the above
   is seen (no framework adapter is active).

Where a step ends relative to the prefetches (what a plan's schedule of masks relies on:
the session switches masks when a step ends, adapters/__init__.py):

- ``optimizer``: at the root's forward pre-hook of the next step, before it unshards or
  prefetches anything (FSDP2: before ``FSDPState._pre_forward`` of the root; hyper-parallel:
  before the root's forward pre-hook): every prefetch of step s+1 sees step s+1's mask.
- ``backward``: when the root's backward ends, after the step's last backward prefetch and
  before the next forward. (hyper-parallel's adapter reports no backward end: its jobs
  count steps by the optimizer or ``report_step``.)
- ``report``: where the job calls ``report_step``, numbered as the job numbers its steps.
  A call between the optimizer and the next forward is a clean boundary; a call inside a
  step (after the forward, before the backward) moves the rest of that step to the next
  step's mask, and the clock cannot tell: the record says a schedule followed such
  boundaries.

``report_step`` stays the explicit way to write metrics. When the clock counts steps from
another source, each call is checked against it: a different step number is said once
(which count the signals use, and why), never silently mixed.

The clock only counts and says; the session does the work (listeners). Standard library
only, Python 3.9.
"""

from __future__ import annotations

import time
from collections.abc import Callable

OPTIMIZER = "optimizer"
BACKWARD = "backward"
REPORT = "report"


class StepClock:
    """Counts training steps from the boundaries a job shows (see the module docstring).

    ``on_update(step)`` runs when the optimizer is about to apply step ``step``'s gradients
    (the backward source: when the root's backward ended); ``on_end(step, seconds)`` when
    the step ended, with the seconds since the previous step ended (step 1: since the clock
    started). ``note(message)`` is said once per kind of surprise.
    """

    def __init__(
        self,
        *,
        on_update: Callable[[int], None],
        on_end: Callable[[int, float], None],
        note: Callable[[str], None],
    ) -> None:
        self._on_update = on_update
        self._on_end = on_end
        self._note = note
        self.source: str | None = None
        self.steps = 0  # steps ended
        self.optimizer_built = False  # an optimizer of the job's framework exists
        self._updating = False  # between the first optimizer call of a step and its end
        self._update_ids: list[int] = []  # optimizers that stepped in the open update
        self._backward_seen = False  # a backward ended since the last step end
        self._last_update_end = time.perf_counter()
        self._last_end = self._last_update_end
        self._noted: set = set()
        self.notes: list[str] = []

    # -- what the framework adapters call -----------------------------------------------
    def optimizer_begins(self, optimizer_id: int) -> None:
        """An optimizer is about to step (torch: its step pre-hook)."""
        if self.source == BACKWARD:
            self._say_once("late-optimizer", "an optimizer stepped after steps were counted "
                           "by backward passes: they stay counted that way")
            return
        if self.source == REPORT:
            return
        self.source = OPTIMIZER
        if not self._updating:
            self._updating = True
            self._update_ids = []
            self._on_update(self.steps + 1)
        elif optimizer_id in self._update_ids:
            self._say_once("twice", "an optimizer stepped twice between two forward passes: "
                           "counted as one training step")
        self._update_ids.append(optimizer_id)

    def optimizer_ends(self) -> None:
        """An optimizer finished its step (torch: its step post-hook)."""
        if self.source == OPTIMIZER and self._updating:
            self._last_update_end = time.perf_counter()

    def forward_begins(self) -> None:
        """The root unit's forward pre-hook: a step whose update is done ends here."""
        if self._updating:
            self._end(self._last_update_end)

    def backward_ends(self) -> None:
        """The root unit's backward finished (all gradients of this backward are in)."""
        self._backward_seen = True
        if self.source is None and not self.optimizer_built:
            self.source = BACKWARD
            self._say_once("fallback", "no optimizer step seen: a training step is one "
                           "forward and backward of the root unit")
        if self.source == BACKWARD:
            self._on_update(self.steps + 1)
            self._end(time.perf_counter())

    def reported(self, step: int) -> bool:
        """A ``report_step(step)`` call. True when it is the boundary (source ``report``)."""
        if self.source is None and not self.optimizer_built and not self._backward_seen:
            self.source = REPORT
        if self.source == REPORT:
            self._on_update(step)
            self.steps = step - 1  # the job's own numbers
            self._end(time.perf_counter())
            return True
        counted = self.steps + (1 if self._updating else 0)
        if step != counted:
            self._say_once("report-mismatch", f"report_step({step}) came at training step "
                           f"{counted} as counted by {self.source or 'no source yet'} "
                           "boundaries: digests, order and step times use that count; the "
                           "metrics keep the job's numbers")
        return False

    def say_once(self, kind: str, message: str) -> None:
        """A note of the session's about the steps (``notes``, the probe's ``step_notes``),
        said once per kind."""
        self._say_once(kind, message)

    def close(self) -> None:
        """At exit: an update still open is the last step."""
        if self._updating:
            self._end(self._last_update_end)

    # -- inside -----------------------------------------------------------------------
    def _end(self, at: float) -> None:
        self._updating = False
        self._backward_seen = False
        self.steps += 1
        seconds, self._last_end = at - self._last_end, at
        self._on_end(self.steps, max(seconds, 0.0))

    def _say_once(self, kind: str, message: str) -> None:
        if kind in self._noted:
            return
        self._noted.add(kind)
        self.notes.append(message)
        self._note(message)
