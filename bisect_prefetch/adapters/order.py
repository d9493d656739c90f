"""The order record: what happened to each unit, in order, during the first few steps.

One line per recorded step and rank in ``order.rank{R}.jsonl`` (same writing
rule as metrics.jsonl)::

    {"step": S, "rank": R, "events": [EVENT, ...]}

Events, in the order they happened on that rank:

- ``["prefetch", EDGE, OUTCOME]``: the edge fired; OUTCOME is a probe outcome
  (issued, noop, masked, guarded).
- ``["unshard", UNIT, BY]``: UNIT started an unshard (all-gather, or the local
  copy of a size-one unit); BY is ``"self"`` (the unit's own hook) or the edge
  id whose prefetch started it.
- ``["use", UNIT, PHASE]``: UNIT's own pre-hook ran (PHASE ``fwd`` or ``bwd``):
  its parameters are used now.
- ``["reshard", UNIT]``: UNIT went back to its shards.

Only the first ``order_steps`` steps are kept (the plan's
``record.order_steps``); after them recording stops. A step keeps at most
MAX_EVENTS_PER_STEP events (its line then says ``"events_dropped": N``), so
memory stays bounded even in a job whose steps never end. Standard library
only, Python 3.9.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

SELF = "self"  # ``by`` of an unshard started by the unit's own hook
# Far above what a step of any model records (four events per unit and edge), far below
# what would hurt a job's memory.
MAX_EVENTS_PER_STEP = 100_000


class OrderLog:
    """Collects one step's events and hands each finished step to ``write(line)``."""

    def __init__(self, *, rank: int, steps: int, write: Callable[[str], None]) -> None:
        self.rank = rank
        self.steps_left = steps
        self._write = write
        self._events: list[list[str]] = []
        self._dropped = 0  # events past MAX_EVENTS_PER_STEP in the current step
        self._local = threading.local()  # the edge whose prefetch is running on this thread

    @property
    def active(self) -> bool:
        return self.steps_left > 0

    # -- what the adapters call -----------------------------------------------------
    def running_edge(self) -> str | None:
        return getattr(self._local, "edge", None)

    def set_running_edge(self, edge_id: str | None) -> None:
        self._local.edge = edge_id

    def begin_prefetch(self, edge_id: str) -> list[str] | None:
        """The edge fires: its event goes in now, before the unshards it starts.

        Returns the event, whose outcome (index 2) the caller fills in once known.
        """
        if self.steps_left <= 0:
            return None
        event = ["prefetch", edge_id, ""]
        return event if self._add(event) else None

    def unshard(self, unit: str) -> None:
        if self.steps_left > 0:
            self._add(["unshard", unit, self.running_edge() or SELF])

    def use(self, unit: str, phase: str) -> None:
        if self.steps_left > 0:
            self._add(["use", unit, phase])

    def reshard(self, unit: str) -> None:
        if self.steps_left > 0:
            self._add(["reshard", unit])

    def _add(self, event: list[str]) -> bool:
        if len(self._events) >= MAX_EVENTS_PER_STEP:
            self._dropped += 1
            return False
        self._events.append(event)
        return True

    # -- step ends ------------------------------------------------------------------
    def end_step(self, step: int) -> None:
        """What was recorded since the last step end belongs to ``step``; write it."""
        if self.steps_left <= 0:
            return
        self.steps_left -= 1
        line = {"step": step, "rank": self.rank, "events": self._events}
        if self._dropped:
            line["events_dropped"] = self._dropped
        self._events, self._dropped = [], 0
        self._write(json.dumps(line) + "\n")
