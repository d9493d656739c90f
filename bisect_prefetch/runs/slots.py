"""Keep every slot of the executor busy: ask for the next run whenever one is free.

The caller proposes runs one at a time (`propose` returns a RunRequest, or
None when nothing more can be asked until a result arrives, or ever) and is
told of each finished run as it arrives, in any order. Runs the journal
holds are replayed in the order they first finished. When the caller stops
(Ctrl-C, SIGTERM, an error), every job still in flight is cancelled.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from bisect_prefetch.runs.execute import POLL_S, Runner, RunOutcome, StartedRun
from bisect_prefetch.runs.store import RunKey


@dataclass(frozen=True)
class RunRequest:
    key: RunKey
    label: str
    reference: str | None = None  # run id to compare with live (None: nothing); stops at a difference
    tag: object = None  # the caller's own note (an index, a mask), handed back with the result


Propose = Callable[[], "RunRequest | None"]
OnDone = Callable[[RunRequest, RunOutcome], None]
OnStart = Callable[[RunRequest], None]


def keep_slots_busy(runner: Runner, propose: Propose, on_done: OnDone, *,
                    on_start: OnStart | None = None,
                    stop: Callable[[], bool] | None = None) -> None:
    """Run what propose asks for, up to executor.slots at once, until it asks nothing more.

    A run the journal holds takes its slot too and comes back in the order the
    journal says it finished, before any run still going: a resumed search
    sees its results in the order it saw them first, so it makes the same
    decisions and asks for the same runs. stop, when it says True (a verdict
    reached), ends it at once: runs still in flight are cancelled, never
    journaled as finished.
    """
    finished_at = {record["run_id"]: i for i, record in enumerate(runner.state.records())}
    in_flight: list[tuple[RunRequest, StartedRun]] = []
    replayed: list[tuple[int, RunRequest, RunOutcome]] = []
    try:
        while stop is None or not stop():
            while len(in_flight) + len(replayed) < runner.executor.slots:
                request = propose()
                if request is None:
                    break
                if on_start is not None:
                    on_start(request)
                started = runner.start(request.key, label=request.label,
                                       reference=request.reference)
                if isinstance(started, RunOutcome):
                    replayed.append((finished_at.get(started.run_id, -1), request, started))
                else:
                    in_flight.append((request, started))
            if replayed:
                replayed.sort(key=lambda entry: entry[0])
                _, request, outcome = replayed.pop(0)
                on_done(request, outcome)
                continue
            if not in_flight:
                return
            # One result at a time, then the free slot is filled: the order a resume
            # replays (the journal's) is then the order the decisions were made in.
            for entry in in_flight:
                outcome = runner.poll(entry[1])
                if outcome is not None:
                    in_flight.remove(entry)
                    on_done(entry[0], outcome)
                    break
            else:
                time.sleep(POLL_S)
    finally:
        for _, started in in_flight:
            runner.executor.cancel(started.job_id)
