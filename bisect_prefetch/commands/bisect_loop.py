"""The bisect command's one loop: every run a search asks for, through an oracle's slots,
each said as it is heard (its run line) and narrated (its block's title and verdict).

The same loop for every oracle (search/oracle.py's slot operations): real
training runs on the executor's slots (drivers/oracle.py), or a simulation that
answers at once (search/simulate.py, and the whole-transcript tests). Serial
is one slot. It drives the search (`run_bisection`), and the runs before it
(commands/bisect_checks.py: the stress calibration, the first checks). The words
it prints come from commands/bisect_words.py.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any, Protocol, cast

from rich.console import Console

from bisect_prefetch.commands.bisect_words import (
    notice_line,
    run_line,
    segments_refused_line,
    stage_title,
    verdict_line,
)
from bisect_prefetch.runs.outcome import RunOutcome
from bisect_prefetch.search.interface import Search
from bisect_prefetch.search.oracle import Finished, Oracle, RunResult
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

    def new_search(self) -> list[int]:
        """The lines of the runs recorded so far, forgotten: the next search counts anew."""
        lines, self._lines = self._lines, []
        return lines

    def of(self, run: int) -> int:
        return self._lines[run - 1] if 0 < run <= len(self._lines) else run


class RunLines:
    """One line per finished run, as the loop hears it, numbered one way (RunNumbers);
    `details`, when given, gets each run's record for the JSON's run_details (`run`: the
    number its line says, the same in the JSON and the report)."""

    def __init__(self, console: Console, numbers: Iterator[int] | None = None,
                 details: list[dict] | None = None) -> None:
        self.console = console
        self.numbers = numbers if numbers is not None else itertools.count(1)
        self.details = details

    def say(self, heard: Finished) -> None:
        """The line of a run the oracle heard finish (none where it keeps no outcome)."""
        out = cast(RunOutcome | None, heard.outcome)
        if out is None:
            return  # a bare simulation (search/simulate.py): nothing ran
        number = next(self.numbers)
        masks = heard.planned.masks if isinstance(heard.planned, Schedule) else [(1, heard.planned)]
        if self.details is not None:
            self.details.append({"run": number, "run_id": out.run_id, "mask": sorted(masks[0][1]),
                                 "outcome": out.outcome, "steps_done": out.steps_done,
                                 "first_diff_step": out.first_diff_step,
                                 "localization": out.localization, "fault": out.fault,
                                 "reused": out.reused, "stress": heard.stress,
                                 "step_time_ms": out.step_time_ms})
            if isinstance(heard.planned, Schedule):
                self.details[-1]["schedule"] = [[first, sorted(m)] for first, m in masks]
        self.console.print(run_line(number, masks, out, stress=heard.stress), markup=False)


class Narrator:
    """Says each block of a search (runs of one mask in one protocol stage): its title
    before its first run, its `->` verdict line once it is over.

    One run at a time, a block is over when the next one is titled. With several slots,
    runs of several blocks interleave: a block is over once a run of a later block was
    recorded (or at the end), and its verdict line names it. Every block is over once a
    run ended a round of the cause search (rounds.ROUND_ENDED: it searches elsewhere next).
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
            return  # the same block goes on
        blocks = self.search.blocks
        self.close(len(blocks) - 1 if self.interleaved else len(blocks))  # the last may go on
        name = mask_name(ask.mask, self.search.edge_ids)
        self.console.print(f"{stage_title(ask.stage, name, ask.target, ask.context)}...",
                           markup=False)
        self.titled.append((ask.stage, ask.mask))

    def recorded(self, result: RunResult | None = None) -> None:
        """After a run was recorded: the blocks it ended, and what its localization did to
        the search (once a unit); or that the golden run drifted, the search reading its
        runs again (not said again)."""
        search = self.search
        if search.golden_drifted:
            said = next(n for n in reversed(search.notices) if n["event"] == "golden-drifted")
            self.console.print(f"  {notice_line(said)}", markup=False, soft_wrap=True)
            self.closed, self.titled = len(search.blocks), []
            self.notices_said = len(search.notices)
            return
        new = search.notices[self.notices_said:]
        # Every block but the last is over; all are once the run ended a round, whose
        # verdict line comes before the notice of what comes next.
        round_ended = any(n.get("event") in ROUND_ENDED for n in new)
        self.close(None if round_ended else len(search.blocks) - 1)
        for notice in new:
            if notice["event"] == "diverged-at-switch":
                if self.switch_said:
                    continue  # said once; their count comes after the verdict
                self.switch_said = True
            if "unit" not in notice or notice["unit"] not in self.units_said:  # a unit's hint once
                self.console.print(f"  {notice_line(notice)}", markup=False, soft_wrap=True)
                self.units_said.add(notice.get("unit"))
        self.notices_said = len(search.notices)

    def close(self, upto: int | None = None) -> None:
        """The verdict lines of the blocks before `upto` (None: all) not yet said. A block
        whose first run was interrupted is not one yet: it has no verdict."""
        blocks = self.search.blocks
        upto = len(blocks) if upto is None else upto
        for block in blocks[self.closed:upto]:
            which = (f"{stage_title(block.stage, block.mask, block.target, block.context)}: "
                     if self.interleaved else "")
            self.console.print(f"  -> {which}{verdict_line(block, run=self.numbers.of)}",
                               markup=False)
        self.closed = max(self.closed, upto)


class Narrates(Protocol):
    """What the loop tells its narrator: an ask before its run, a result once recorded, the
    end of the drive."""

    def before(self, ask: Any) -> None: ...

    def recorded(self, result: RunResult) -> None: ...

    def close(self) -> None: ...


class Unsaid:
    """A drive whose asks and results the command words itself, before and after it (the
    stress calibration): the loop says only the run lines."""

    def before(self, ask: Any) -> None:
        pass

    def recorded(self, result: RunResult) -> None:
        pass

    def close(self) -> None:
        pass


def run_bisection(search: Search, oracle: Oracle, *, console: Console,
                  numbers: RunNumbers | None = None, lengths: Lengths | None = None,
                  lines: RunLines | None = None) -> SearchResult:
    """Run the search to its verdict, narrating each block of its runs (Narrator);
    returns the result. lengths: several masks per run (search/segments.py)."""
    numbers = numbers if numbers is not None else RunNumbers()
    narrator = Narrator(search, console, numbers,
                        interleaved=oracle.slots > 1 or lengths is not None)
    drive(search, oracle, narrator=narrator, numbers=numbers,
          lines=lines if lines is not None else RunLines(console, numbers), lengths=lengths)
    return search.result()


def drive(search: Any, oracle: Oracle, *, narrator: Narrates, numbers: RunNumbers,
          lines: RunLines, lengths: Lengths | None = None) -> None:
    """The one loop: every run of the bisect command that a search asks for, the stress
    calibration's and the leading checks' too, until the search is done or asks nothing
    more (search: `done`, `pending`, `record`, `golden_drifted`, `runs_used`; `propose`
    with several slots).

    One loop for any oracle and any number of slots; serial is one slot. While a slot
    is free the search proposes the next run from everything finished and everything
    still in flight; each run is said (its run line) as the oracle hears it finish, and
    its result recorded. With one slot the run is not marked in flight (`pending`, then
    `record`): nothing else is asked while it runs, and the search decides exactly as it
    does serially. A resumed search needs no replay here: the real oracle answers runs
    that finished from the journal. lengths: each run's segments are planned before it
    starts (search/segments.py).
    """
    slots = oracle.slots

    def propose() -> Ask | Schedule | None:
        nonlocal lengths
        if search.done or search.pending is None:
            return None  # done, or nothing to ask before a result arrives
        if lengths is not None and oracle.schedule_refused:
            lines.console.print(segments_refused_line(oracle.schedule_refused), markup=False)
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
        narrator.recorded(result)

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
            lines.say(heard)
            if heard.retried:
                continue  # run again in its slot: heard once more
            running -= 1
            arrived(heard.planned, heard.result)
            if search.golden_drifted and not search.done:  # search/golden_drift.py
                oracle.cancel()  # compared with the golden run that drifted
                running = 0
                oracle.replace_golden()
                search.golden(oracle.golden_steps)
    finally:
        oracle.cancel()  # runs still in flight at the verdict (or an interrupt)
        narrator.close()  # an interrupted block still gets its verdict line
