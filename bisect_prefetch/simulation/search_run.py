"""One simulated search: the tool's own search against a simulated oracle (search/simulate.py),
on several slots, and what it cost.

Slots: `slots` runs at once, each taking the share of a full run it ran (a
diverged run stops at its first difference) and its start-up (`startup_cost` steps); whenever a slot frees, the search
proposes the next run from everything finished and in flight (search/protocol.py), and
results fold in in the order they finish. Wall-clock ("rounds") is in units of
one full run; runs still in flight when the verdict comes are cancelled and
count as runs.

Where the runs go: each search's runs per protocol stage (`runs_by_stage`), the
background controls of all_off_runs="auto" apart from the other all-off runs.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from bisect_prefetch.search.causes import CauseSearch
from bisect_prefetch.search.oracle import RunResult
from bisect_prefetch.search.protocol import Bisection
from bisect_prefetch.search.runlog import BACKGROUND_CONTROL
from bisect_prefetch.search.segments import Lengths, Schedule, plan_run, record_run
from bisect_prefetch.search.simulate import SimulatedOracle
from bisect_prefetch.vocab import STAGES, Mask

# The tool's search, and (for comparison) its one-cause search alone (protocol.Bisection).
METHODS = ("search", "one-cause")


@dataclass(frozen=True)
class Outcome:
    verdict: str
    minimal_set: list[str]
    confidence: float | None  # None: the method claims nothing
    runs: int  # runs started (those cancelled at the verdict included)
    steps: int
    rounds: float  # wall-clock to the verdict, in full runs
    startups: int = 0  # training runs launched, the golden reference included
    golden_steps: int = 0  # the golden references' steps (each as long as the longest run)
    # The search's runs per protocol stage (STAGES), its background controls apart
    # ("background-control", out of check-off), runs cancelled at the verdict as
    # "cancelled"; empty for a baseline.
    runs_by_stage: dict[str, int] = field(default_factory=dict)
    culprit_sets: list[list[str]] = field(default_factory=list)  # every cause named (causes.py)


def run_search(edge_ids, oracle: SimulatedOracle, *, slots: int = 1, hint: Callable[[], str] | None = None,
               lengths: Lengths | None = None, startup_cost: float = 0.0, one_cause: bool = False,
               **options) -> Outcome:
    """The tool's own search (causes.CauseSearch; one_cause: protocol.Bisection alone, the
    search before several causes, for comparison) against the oracle, on `slots` slots.

    hint: called once, at the first diverged run, for the unit its localization names.
    lengths: several masks per run (segments.py); None: one mask per run.
    startup_cost: each run's start-up, in steps: wall-clock counts it.
    """
    search = (Bisection if one_cause else CauseSearch)(edge_ids, **options)
    golden_steps = oracle.steps if lengths is None else lengths.cap_steps
    search.golden(golden_steps)
    oracle.run_golden(golden_steps)
    clock, order = 0.0, 0
    running: list[tuple[float, int, float, Mask | Schedule, RunResult]] = []  # a heap by finish time
    runs = steps = 0
    goldens = 1  # golden runs: a new one after one drifted (golden_drift.py)
    while True:
        while len(running) < slots and not search.done:
            if lengths is None:
                ask = search.propose()
                planned = None if ask is None else ask.mask
            else:
                planned = plan_run(search, lengths)
            if planned is None:
                break
            result = oracle.run(planned) if lengths is None else oracle.run_schedule(planned)
            duration = (startup_cost + max(result.steps, 1)) / oracle.steps
            heapq.heappush(running, (clock + duration, order, clock, planned, result))
            order += 1
            runs += 1
        if search.done or not running:
            break
        clock, _, _, planned, result = heapq.heappop(running)
        steps += result.steps
        if hint is not None and result.diverged:
            result, hint = replace(result, unit=hint()), None
        if lengths is None:
            search.record(planned, result, hint=result.unit if result.diverged else None)
        else:
            record_run(search, planned, result)
        if search.golden_drifted and not search.done:  # golden_drift.py: a new golden run
            for _, _, started, _, _ in running:  # compared with the old one: cancelled
                steps += max(0, round((clock - started) * oracle.steps - startup_cost))
            running = []
            oracle.replace_golden()
            search.golden(golden_steps)
            goldens += 1
            clock += (startup_cost + golden_steps) / oracle.steps  # nothing runs beside it
    for _, _, started, _, _ in running:  # cancelled at the verdict: the steps they ran count
        steps += max(0, round((clock - started) * oracle.steps - startup_cost))
    result = search.result()
    return Outcome(result.verdict, result.minimal_set, result.confidence, runs, steps, clock,
                   runs_by_stage=runs_by_stage(search), startups=runs + goldens,
                   golden_steps=golden_steps * goldens, culprit_sets=[s["edges"] for s in result.culprit_sets])


def runs_by_stage(search: Bisection | CauseSearch) -> dict[str, int]:
    """The search's runs per protocol stage, its background controls apart, and those
    cancelled at the verdict."""
    out = dict.fromkeys((*STAGES, BACKGROUND_CONTROL, "cancelled"), 0)
    for block in search.blocks:
        out[BACKGROUND_CONTROL if block.context == BACKGROUND_CONTROL else block.stage] += block.runs
    out["cancelled"] = len(search.in_flight)
    return out
