"""The executor's slots: start a run in a free one, hear the next run that finished.

The caller decides what to run and when (the bisect command's loop through the
real oracle, or an A/A group); this module only starts, polls and cancels, and
never asks anything back. Runs the journal holds take a slot too and are heard
in the order they first finished, before any run still going, so a resumed
caller sees its results in the order it saw them first. `cancel` (Ctrl-C,
SIGTERM, an error, a verdict) ends every job still in flight.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from bisect_prefetch.runs.execute import POLL_S, Runner, StartedRun
from bisect_prefetch.runs.outcome import RunOutcome
from bisect_prefetch.runs.store import RunKey


@dataclass(frozen=True)
class RunRequest:
    key: RunKey
    label: str
    reference: str | None = None  # run id to compare with live (None: nothing); stops at a difference
    tag: object = None  # the caller's own note (an index, a mask), handed back with the result


class Slots:
    """Runs in flight on the runner's executor, at most `executor.slots` at once."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self._in_flight: list[tuple[RunRequest, StartedRun]] = []
        self._replayed: list[tuple[int, RunRequest, RunOutcome]] = []
        self._finished_at: dict[str, int] = {}  # run id -> its line in the journal

    @property
    def busy(self) -> int:
        return len(self._in_flight) + len(self._replayed)

    @property
    def free(self) -> int:
        return self.runner.executor.slots - self.busy

    def start(self, request: RunRequest) -> None:
        """Start the run (or take it from the journal, when it finished before)."""
        started = self.runner.start(request.key, label=request.label, reference=request.reference)
        if isinstance(started, RunOutcome):
            if started.run_id not in self._finished_at:
                self._finished_at = {record["run_id"]: i
                                     for i, record in enumerate(self.runner.state.records())}
            self._replayed.append((self._finished_at.get(started.run_id, -1), request, started))
        else:
            self._in_flight.append((request, started))

    def next_finished(self) -> tuple[RunRequest, RunOutcome] | None:
        """The next run that finished (waits for one); None when none is in flight."""
        if self._replayed:
            self._replayed.sort(key=lambda entry: entry[0])
            _, request, outcome = self._replayed.pop(0)
            return request, outcome
        while self._in_flight:
            # One result at a time, then the free slot is filled: the order a resume
            # replays (the journal's) is then the order the decisions were made in.
            for entry in self._in_flight:
                outcome = self.runner.poll(entry[1])
                if outcome is not None:
                    self._in_flight.remove(entry)
                    return entry[0], outcome
            time.sleep(POLL_S)
        return None

    def cancel(self) -> None:
        """Cancel every job still in flight; it is never journaled as finished."""
        for _, started in self._in_flight:
            self.runner.executor.cancel(started.job_id)
        self._in_flight = []
        self._replayed = []


Propose = Callable[[], "RunRequest | None"]
OnDone = Callable[[RunRequest, RunOutcome], None]
OnStart = Callable[[RunRequest], None]


def keep_slots_busy(runner: Runner, propose: Propose, on_done: OnDone, *,
                    on_start: OnStart | None = None) -> None:
    """Run what propose asks for, up to executor.slots at once, until it asks nothing more
    and nothing is in flight (an A/A group's runs: drivers/group.py).

    propose returns the next run, or None when nothing more can be asked until a
    result arrives, or ever.
    """
    slots = Slots(runner)
    try:
        while True:
            while slots.free > 0 and (request := propose()) is not None:
                if on_start is not None:
                    on_start(request)
                slots.start(request)
            done = slots.next_finished()
            if done is None:
                return
            on_done(*done)
    finally:
        slots.cancel()
