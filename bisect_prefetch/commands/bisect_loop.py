"""The bisect command's one loop: the search's runs through an oracle's slots, narrated.

The same loop for every oracle (search/oracle.py's slot operations): real
training runs on the executor's slots (drivers/oracle.py), or a simulation that
answers at once (search/simulate.py, and the whole-transcript tests). Serial
is one slot. The words it prints come from commands/bisect_words.py.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from rich.console import Console

from bisect_prefetch.commands.bisect_words import (
    notice_line,
    run_line,
    stage_title,
    verdict_line,
)
from bisect_prefetch.runs.outcome import RunOutcome
from bisect_prefetch.search.interface import Search
from bisect_prefetch.search.oracle import Oracle, RunResult
from bisect_prefetch.search.rounds import ROUND_ENDED
from bisect_prefetch.search.runlog import Ask, mask_name
from bisect_prefetch.search.segments import Lengths, Schedule, plan_run, record_run
from bisect_prefetch.search.verdict import SearchResult
from bisect_prefetch.vocab import Mask


class RunNumbers:
    """"run N" in a transcript, one way: the N-th run line (a retry and both settings'
    stress calibration runs included). A verdict line or fact that names a run of the
    search names it by its line (`of(k)`: the line of the search's k-th run)."""

    def __init__(self) -> None:
        self.said = 0
        self._lines: list[int] = []  # the line of each run the search recorded

    def __iter__(self) -> RunNumbers:
        return self

    def __next__(self) -> int:
        self.said += 1
        return self.said

    def recorded(self, line: int | None = None) -> None:
        """The search recorded a run: the last line said (or the one given) reported it."""
        self._lines.append(self.said if line is None else line)

    def new_search(self) -> None:
        self._lines = []

    def of(self, run: int) -> int:
        return self._lines[run - 1] if 0 < run <= len(self._lines) else run


def run_lines(console: Console, details: list[dict] | None = None, *, stress: bool = False,
              numbers: Iterator[int] | None = None):
    """The oracle's `on_run`: one line per finished run (drivers/oracle.py OnRun).

    details, when given, gets each run's record for the JSON's run_details; the oracles
    of one command share it and the run numbers.
    """
    numbers = numbers if numbers is not None else itertools.count(1)

    def on_run(planned: Mask | tuple[tuple[int, Mask], ...], out: RunOutcome) -> None:
        segmented = isinstance(planned, tuple)
        mask = planned[0][1] if segmented else planned
        number = next(numbers)
        if details is not None:  # `run`: the number its line says, the same in the JSON and report
            details.append({"run": number, "run_id": out.run_id, "mask": sorted(mask),
                            "outcome": out.outcome,
                            "steps_done": out.steps_done, "first_diff_step": out.first_diff_step,
                            "localization": out.localization, "fault": out.fault,
                            "reused": out.reused, "stress": stress,
                            "step_time_ms": out.step_time_ms})
            if segmented:
                details[-1]["schedule"] = [[first, sorted(m)] for first, m in planned]
        console.print(run_line(number, planned, out, stress=stress), markup=False)

    return on_run


class Narrator:
    """Says a stage's title before its first run and its `->` verdict line once it is over.

    One run at a time, a stage is over when the next one is announced. With several
    slots, runs of several stages interleave: a stage is over once a run of a later
    stage was recorded (or at the end), and its verdict line names the stage.
    """

    def __init__(self, search: Search, console: Console, numbers: RunNumbers, *,
                 interleaved: bool = False) -> None:
        self.search = search
        self.console = console
        self.numbers = numbers
        self.interleaved = interleaved
        blocks = search.blocks
        self.closed = len(blocks)  # blocks recorded before this drive are not its to say
        self.titled = [(blocks[-1].stage, blocks[-1].enabled)] if blocks else []
        self.notices_said = len(search.notices)  # the audit's suspects are already said
        self.units_said: set[str] = set()
        self.switch_said = False  # a divergence at a switch of masks: explained once

    def before(self, ask: Ask) -> None:
        """Before a run of the mask the search asks for (`search.pending`)."""
        if self.titled[-1:] == [(ask.stage, ask.mask)]:
            return  # the same stage goes on
        blocks = self.search.blocks
        self.close(len(blocks) - 1 if self.interleaved else len(blocks))  # a stage may go on
        name = mask_name(ask.mask, self.search.edge_ids)
        self.console.print(f"{stage_title(ask.stage, name, ask.target, ask.context)}...",
                           markup=False)
        self.titled.append((ask.stage, ask.mask))

    def recorded(self) -> None:
        """After a run was recorded: the stages it ended, and what its localization did to
        the search (once a unit); or that the golden run drifted, the search reading its
        runs again (not said again)."""
        if self.search.golden_drifted:
            said = next(n for n in reversed(self.search.notices) if n["event"] == "golden-drifted")
            self.console.print(f"  {notice_line(said)}", markup=False, soft_wrap=True)
            self.closed, self.titled = len(self.search.blocks), []
            self.notices_said = len(self.search.notices)
            return
        new = self.search.notices[self.notices_said:]
        # Every block but the last is complete; all are once the run ended its stage, whose
        # verdict line comes before the notice of what comes next.
        ended = any(n.get("event") in ROUND_ENDED for n in new)
        self.close(None if ended else len(self.search.blocks) - 1)
        for notice in new:
            if notice["event"] == "diverged-at-switch":
                if self.switch_said:
                    continue  # said once; their count comes after the verdict
                self.switch_said = True
            if "unit" not in notice or notice["unit"] not in self.units_said:  # a unit's hint once
                self.console.print(f"  {notice_line(notice)}", markup=False, soft_wrap=True)
                self.units_said.add(notice.get("unit"))
        self.notices_said = len(self.search.notices)

    def close(self, upto: int | None = None) -> None:
        """The verdict lines of the blocks before `upto` (None: all) not yet said. A stage
        interrupted before its first run finished has no block, and no verdict yet."""
        blocks = self.search.blocks
        upto = len(blocks) if upto is None else upto
        for block in blocks[self.closed:upto]:
            which = (f"{stage_title(block.stage, block.mask, block.target, block.context)}: "
                     if self.interleaved else "")
            self.console.print(f"  -> {which}{verdict_line(block, run=self.numbers.of)}",
                               markup=False)
        self.closed = max(self.closed, upto)


def run_bisection(search: Search, oracle: Oracle, *, console: Console,
                  numbers: RunNumbers | None = None, lengths: Lengths | None = None) -> SearchResult:
    """Run the search to its verdict, narrating each stage; returns the result.

    One loop for any oracle and any number of slots; serial is one slot. While a slot
    is free the search proposes the next run from everything finished and everything
    still in flight; each result is recorded as it arrives. With one slot the run is
    not marked in flight (`pending`, then `record`): nothing else is asked while it
    runs, and the search decides exactly as it does serially. A resumed search needs
    no replay here: the real oracle answers runs that finished from the journal.
    lengths: several masks per run (search/segments.py); each run's segments are
    planned before it starts and said, with what each showed, once it ended.
    """
    numbers = numbers if numbers is not None else RunNumbers()
    slots = oracle.slots
    narrator = Narrator(search, console, numbers, interleaved=slots > 1 or lengths is not None)

    def propose() -> Ask | Schedule | None:
        nonlocal lengths
        if search.done or search.pending is None:
            return None  # done, or nothing to ask before a result arrives
        if lengths is not None and oracle.schedule_refused:
            console.print(f"segments: {oracle.schedule_refused}; one mask a run from here",
                          markup=False)
            lengths = None
        if lengths is not None:
            return plan_run(search, lengths)
        ask = search.pending
        narrator.before(ask)
        if slots > 1:
            search.propose()  # in flight: the next free slot gets another question
        return ask

    def arrived(planned: Mask | Schedule, result: RunResult) -> None:
        if search.done:
            return  # runs that arrive after the verdict are not evidence
        trials = search.runs_used
        if isinstance(planned, Schedule):
            record_run(search, planned, result)
        else:
            search.record(planned, result)
        for _ in range(search.runs_used - trials):  # a segment's trial is its run's line
            numbers.recorded()
        narrator.recorded()

    running = 0  # runs requested and not yet heard (a retry keeps its run's slot)
    try:
        while not search.done:
            # oracle.slots, not the first count: a Slurm allocation that lost a node holds fewer.
            while running < oracle.slots and (planned := propose()) is not None:
                if isinstance(planned, Schedule):
                    oracle.request_schedule(planned)
                else:
                    oracle.request(planned.mask)
                running += 1
            heard = oracle.finished()
            if heard is None:
                break
            running -= 1
            arrived(heard.planned, heard.result)
            if search.golden_drifted and not search.done:  # search/golden_drift.py
                oracle.cancel()  # compared with the golden run that drifted
                running = 0
                oracle.replace_golden()
                search.golden(oracle.golden_steps)
    finally:
        oracle.cancel()  # runs still in flight at the verdict (or an interrupt)
        narrator.close()  # an interrupted stage still gets its verdict line
    return search.result()
