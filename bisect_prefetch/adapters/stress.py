"""Stress: random delays before each prefetch is issued, to widen the window of a race.

A race between a prefetch and the unit that consumes it shows only when the
prefetch's collective is late relative to its use. Stress makes that happen
more often without changing a number: before an enabled prefetch edge issues
its unshard, this rank sleeps for a delay drawn log-uniformly from OS entropy
(``random.SystemRandom``: never the job's seed, and each rank draws its own),
scaled to that edge's issue-to-use gap::

    delay ~ exp(uniform(ln(gap * LOW), ln(gap * HIGH)))     LOW = 1/16, HIGH = 2

The gap is measured, not assumed: during the first ``measure_steps`` steps no
delay is applied, and for each edge the time from its issuing prefetch to the
target unit's use in the same phase is recorded (the framework adapter reports
uses); the edge's gap is the median. An edge first seen later, or whose use was
never seen, gets ``default_gap_ms`` and a note. A consumer is never delayed:
only the issuing side waits, which is where a delay opens the window (a peer
rank that issues late keeps the all-gather incomplete while this rank reaches
the use); a delay before the wait hides a race instead.

A prefetch that completes before it returns (a synchronous collective on a
host device) leaves no window to widen: the framework adapter says so with
``no_window(edge)``; that edge is not delayed, and the record and the run's
signals say it.

This is the host-side form, right where the host issues the collective: on a
CPU job the host's timeline is the device's. On an accelerator the delay must
land on the device timeline instead (docs/stress.md). Standard library only,
Python 3.9.
"""

from __future__ import annotations

import math
import random
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

LOW = 1.0 / 16.0  # the shortest delay, as a fraction of the edge's gap
HIGH = 2.0  # the longest delay, as a multiple of the gap
DEFAULT_MEASURE_STEPS = 2
DEFAULT_GAP_MS = 10.0


class Stress:
    """The delays of one rank under a plan's ``stress``; ``record()`` for the probe."""

    def __init__(self, *, measure_steps: int = DEFAULT_MEASURE_STEPS,
                 default_gap_ms: float = DEFAULT_GAP_MS,
                 sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.perf_counter,
                 entropy: random.Random | None = None) -> None:
        self.measure_steps = measure_steps
        self.default_gap_s = default_gap_ms / 1000.0
        self._sleep = sleep
        self._clock = clock
        self._entropy = entropy or random.SystemRandom()
        self._lock = threading.Lock()
        self.steps_done = 0
        self._pending: dict[tuple[str, str], tuple[str, float]] = {}  # (unit, phase) -> edge, t
        self._samples: dict[str, list[float]] = {}  # edge -> measured gaps (s)
        self._gaps: dict[str, float] | None = None  # fixed once measuring ends
        self._delays: dict[str, list[float]] = {}  # edge -> delays applied (s)
        self._defaulted: list[str] = []  # edges that got the default gap
        self._no_window: list[str] = []  # edges whose prefetch completed before returning

    @property
    def measuring(self) -> bool:
        return self.steps_done < self.measure_steps

    # -- what the gate and the framework adapters call --------------------------------
    def before_issue(self, edge_id: str) -> None:
        """Right before an enabled edge issues its unshard: the delay (after measuring)."""
        if self.measuring or edge_id in self._no_window:
            return  # a synchronous prefetch: a delay would widen nothing
        gap = self._gap(edge_id)
        delay = math.exp(self._entropy.uniform(math.log(gap * LOW), math.log(gap * HIGH)))
        self._sleep(delay)
        with self._lock:
            self._delays.setdefault(edge_id, []).append(delay)

    def issued(self, edge_id: str, target: str, phase: str) -> None:
        """The edge's prefetch started an unshard of target (measuring steps only)."""
        if self.measuring:
            with self._lock:
                self._pending[(target, phase)] = (edge_id, self._clock())

    def used(self, unit: str, phase: str) -> None:
        """unit's parameters are used now (its own pre-hook in phase)."""
        if not self.measuring:
            return
        now = self._clock()
        with self._lock:
            pending = self._pending.pop((unit, phase), None)
            if pending is not None:
                edge_id, started = pending
                self._samples.setdefault(edge_id, []).append(now - started)

    def no_window(self, edge_id: str) -> None:
        """The edge's prefetch completed before it returned: nothing overlaps its use."""
        with self._lock:
            if edge_id not in self._no_window:
                self._no_window.append(edge_id)

    def end_step(self, step: int) -> None:
        self.steps_done += 1
        if self.steps_done == self.measure_steps:
            with self._lock:
                self._gaps = {e: statistics.median(s) for e, s in self._samples.items() if s}
                self._pending.clear()

    # -- the record ----------------------------------------------------------------------
    def _gap(self, edge_id: str) -> float:
        gaps = self._gaps if self._gaps is not None else {}
        gap = gaps.get(edge_id)
        if gap is None or gap <= 0:
            with self._lock:
                if edge_id not in self._defaulted:
                    self._defaulted.append(edge_id)
            return self.default_gap_s
        return gap

    def record(self) -> dict[str, Any]:
        """The probe's ``stress``: per edge the gap and the delays; notes in words."""
        with self._lock:
            gaps = dict(self._gaps or {})
            edges: dict[str, Any] = {}
            for edge_id in sorted(set(self._delays) | set(gaps)):
                delays = self._delays.get(edge_id, [])
                edges[edge_id] = {
                    "gap_ms": round(gaps.get(edge_id, self.default_gap_s) * 1000, 3),
                    "gap_source": "measured" if edge_id in gaps else "default",
                    "delays": len(delays),
                    "delay_total_ms": round(sum(delays) * 1000, 3),
                    "delay_median_ms": round(statistics.median(delays) * 1000, 3) if delays else None,
                }
            every = [d for ds in self._delays.values() for d in ds]
            notes = [f"{e}: no issue-to-use gap measured in the first {self.measure_steps} "
                     f"step(s); delays scaled to a default gap of {self.default_gap_s * 1000:g} ms"
                     for e in self._defaulted]
            return {
                "measure_steps": self.measure_steps,
                "delays": len(every),
                "delay_total_ms": round(sum(every) * 1000, 3),
                "delay_median_ms": round(statistics.median(every) * 1000, 3) if every else None,
                "edges": edges,
                "default_gap_edges": list(self._defaulted),
                "no_window_edges": list(self._no_window),
                "notes": notes,
            }
