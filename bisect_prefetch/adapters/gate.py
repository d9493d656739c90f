"""The prefetch gate's decisions: the mask of the current step and the size-one guard.

A plan may carry a ``schedule`` of masks by step (adapters/plan.py says which segment
holds at which step). The gate holds segment 0's mask from the start; when the step clock
ends step s, ``step_ended(s)`` gives it step s+1's, before any prefetch of step s+1. It
also keeps what the probe says of the schedule: ``schedule_followed`` (``[[segment, first
step it held], ...]``, a segment listed once a prefetch met the gate under it or a step
ended under it) and ``schedule_refused`` (an engine that fixes its prefetch decisions
once keeps segment 0's mask). Standard library only; thread-safe where the probe reads it.
"""

from __future__ import annotations

import threading

from bisect_prefetch.vocab import GUARD_SIZE_ONE, GUARDED, MASKED, Mask

from .plan import Plan


class Gate:
    """What a prefetch meets before it may run (see the module docstring)."""

    def __init__(self, plan: Plan | None) -> None:
        self.plan = plan
        self.guard_size_one = plan is not None and plan.guard == GUARD_SIZE_ONE
        self.mask: Mask | None = plan.mask if plan is not None else None  # None: every edge
        self.schedule = plan.schedule if plan is not None else None
        self.segment = 0  # the schedule's segment whose mask the gate holds
        self.segment_first_step = 1  # ... since this step
        self.followed: list[list[int]] = []  # [segment, first step it held]
        self.refused: str | None = None
        self.followed_unwritten = False  # a segment was listed since the probe read them
        self._pending = self.schedule is not None  # the current segment is not yet listed
        self._lock = threading.Lock()

    def mask_at(self, step: int) -> Mask | None:
        """The mask that holds at this 1-based training step (no schedule: the plan's)."""
        index = self.plan.segment_for_step(step) if self.plan is not None else None
        return self.mask if index is None else self.schedule[index][1]

    def decide(self, edge_id: str, target_shard_size: int) -> str | None:
        """MASKED or GUARDED when the prefetch must not run, else None (it may run)."""
        if self._pending:  # the first prefetch under a new segment: it is followed
            self._list_segment()
        if self.mask is not None and edge_id not in self.mask:
            return MASKED
        if self.guard_skips(target_shard_size):
            return GUARDED
        return None

    def guard_skips(self, target_shard_size: int) -> bool:
        """The guard alone: whether a prefetch into a unit of this shard size is skipped."""
        return self.guard_size_one and target_shard_size == 1

    def step_ended(self, step: int) -> bool:
        """Step ``step`` ended: list its segment, take step+1's mask; True if it changed."""
        if self.schedule is None:
            return False
        if self._pending:  # a step ended under it: it is followed
            self._list_segment()
        if self.refused is not None:
            return False
        # At exit no step follows: a segment switched to here stays unlisted.
        index = self.plan.segment_for_step(step + 1)
        if index == self.segment:
            return False
        self.segment, self.segment_first_step = index, step + 1
        self.mask = self.schedule[index][1]
        self._pending = True
        return True

    def refuse(self, reason: str) -> bool:
        """Keep segment 0's mask for the whole run; False when there is nothing to refuse."""
        if self.schedule is None or self.refused is not None:
            return False
        self.refused = reason
        self.segment, self.segment_first_step = 0, 1
        self.mask = self.schedule[0][1]
        self._pending = [0, 1] not in self.followed
        return True

    def followed_for_probe(self) -> list[list[int]]:
        """A copy of ``followed`` for the probe (which then holds every listed segment)."""
        with self._lock:
            self.followed_unwritten = False
            return [list(entry) for entry in self.followed]

    def _list_segment(self) -> None:
        with self._lock:
            if self._pending:
                self._pending = False
                self.followed.append([self.segment, self.segment_first_step])
                self.followed_unwritten = True
