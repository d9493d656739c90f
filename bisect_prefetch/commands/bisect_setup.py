"""What the bisect command's parts share (commands/bisect.py): the open state dir, the
oracle of each stress setting, what was said, the one helper that starts a search, and
the record of what was learned (bisect_record)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from rich.console import Console

from bisect_prefetch.commands.bisect_loop import RunLines, RunNumbers
from bisect_prefetch.commands.bisect_record import (
    EVERY_CAUSE,
    ONE_CAUSE,
    BisectRecord,
    StressRecord,
    fix_edges,
    next_steps,
    reproduce_command,
    segments_json,
)
from bisect_prefetch.commands.common import Given
from bisect_prefetch.drivers.oracle import Earlier
from bisect_prefetch.experiment import Experiment
from bisect_prefetch.judge.step_time import fix_costs
from bisect_prefetch.report.run_view import fingerprint_of, journal_groups
from bisect_prefetch.report.verdict_block import guard_check
from bisect_prefetch.runs.state import OpenState
from bisect_prefetch.search.causes import CauseSearch
from bisect_prefetch.search.interface import Search
from bisect_prefetch.search.oracle import Oracle, RunResult
from bisect_prefetch.search.protocol import Bisection
from bisect_prefetch.search.segments import Lengths
from bisect_prefetch.search.verdict import SearchResult
from bisect_prefetch.vocab import STRESS_AUTO, STRESS_OFF, STRESS_ON, Mask


class BisectOracle(Oracle, Protocol):
    """The oracle the command drives: runs masks, and says what it ran and reused."""

    runs_launched: int
    runs_reused: int
    golden_steps: int

    def run_golden(self, steps: int | None = None) -> str | None: ...

    def reuse_earlier(self) -> Earlier: ...

    def deterministic_masks(self) -> list[Mask]: ...


OracleFor = Callable[..., BisectOracle]  # (opened, *, stress=False)
# The purpose every run a bisection keys begins with (runs/execute.Runner.key).
PURPOSE = "search"


@dataclass
class Started:
    """A search and the oracle that runs it (one a stress setting)."""

    search: Search
    oracle: BisectOracle
    on: bool  # under stress


@dataclass
class Bisecting:
    """What the command's parts share: the open state dir, the oracles, what was said and
    done."""

    experiment: Experiment
    opened: OpenState
    console: Console
    oracle_for: OracleFor
    confidence: float
    max_runs: int | None
    given: Given  # the command as given: what its printed commands carry
    suspects: list[str] = field(default_factory=list)
    numbers: RunNumbers = field(default_factory=RunNumbers)
    run_details: list[dict] = field(default_factory=list)
    oracles: dict[bool, BisectOracle] = field(default_factory=dict)
    earlier: dict[bool, Earlier] = field(default_factory=dict)  # per stress setting
    before: list[Earlier] = field(default_factory=list)  # per search
    stress: StressRecord = field(init=False)
    lines: RunLines = field(init=False)  # every run line, numbered by `numbers`
    # The stress calibration's runs of each setting, with the line that said each.
    calibration: dict[bool, list[tuple[RunResult, int]]] = field(default_factory=dict)
    lengths: Lengths | None = None
    one_cause: bool = False  # a journal begun before several causes: replayed as one (protocol.Bisection)
    current: Started | None = None
    result: SearchResult | None = None
    unstressed: SearchResult | None = None
    discovery: dict | None = None  # the graph discovery run's journal record (a runtime graph)
    size_one: list[str] | None = None  # edges its audit found size-one (None: not audited)

    def __post_init__(self) -> None:
        self.stress = StressRecord(self.experiment.stress.mode)
        self.lines = RunLines(self.console, self.numbers, self.run_details)

    def oracle_of(self, on: bool) -> BisectOracle:
        """The oracle of one stress setting, made on first use; earlier commands' all-off
        runs are taken before its first run (its golden run may be one of them)."""
        if on not in self.oracles:
            # An oracle of a test may know no stress: it is asked only when stress is.
            self.oracles[on] = (self.oracle_for(self.opened, stress=True) if on
                                else self.oracle_for(self.opened))
            self.earlier[on] = self.oracles[on].reuse_earlier()
        return self.oracles[on]

    def new_search(self) -> Search:
        experiment = self.experiment
        return (Bisection if self.one_cause else CauseSearch)(self.opened.graph().edge_ids(), confidence=self.confidence,
                         max_runs=self.max_runs, steps_per_run=experiment.steps,
                         all_off_runs=experiment.search.all_off_runs,
                         suspects=self.suspects)  # a soft prior the runs correct (hints.py)


def start_search(b: Bisecting, on: bool) -> Started:
    """A new search with what is known before its own runs: earlier commands' all-off
    runs (its first background controls) and the calibration's runs of this setting."""
    search = b.new_search()
    oracle = b.oracle_of(on)
    for out in b.earlier[on].controls:
        search.reuse(Mask(), out.result())  # evidence before the search's own runs
    all_on = Mask(search.edge_ids)
    for result, line in b.calibration.get(on, []):
        search.record(all_on, result)  # the calibration's runs of this setting count
        b.numbers.recorded(line)
    return Started(search, oracle, on)


def bisect_record(b: Bisecting, began: float) -> BisectRecord:
    """What the command learned so far (all of it, once the verdict came)."""
    search = b.current.search if b.current is not None else b.new_search()
    result = b.result or search.result()
    every, records = list(b.oracles.values()), b.opened.state.records()
    stressed = [r["signals"]["stress"] for r in records
                if r.get("stress") and (r.get("signals") or {}).get("stress")]
    stress = b.stress.to_json(b.run_details, unstressed=b.unstressed)
    stress["record"] = next(  # the first stressed run that delayed anything
        (s for s in stressed if s.get("delays") or s.get("no_window_edges")),
        stressed[0] if stressed else None)
    launched, reused = _discovery_counts(b)
    graph = b.opened.graph()
    fingerprint = b.experiment.fingerprint()
    guard = guard_check(journal_groups([r for r in records if fingerprint_of(r) == fingerprint]),
                        edge_ids=graph.edge_ids())
    return BisectRecord(
        result=result, reproduce=reproduce_command(b.given, result), run=b.numbers.of,
        experiment=b.experiment.name, elapsed_s=round(time.monotonic() - began, 1),
        deterministic_masks=[sorted(m) for o in every for m in o.deterministic_masks()],
        runs_launched=launched + sum(o.runs_launched for o in every),
        runs_reused=reused + sum(o.runs_reused for o in every),
        earlier_all_off=[{"golden": e.golden, "controls": [out.run_id for out in e.controls]}
                         for e in b.before],
        runs_lost=[lost for o in every for lost in getattr(o, "runs_lost", [])],
        segments=segments_json(b.experiment.search.segments, b.lengths, search),
        suspects=b.suspects,
        hints=[n for n in search.notices if n["event"].startswith("hint")],
        golden_drifts=[{"step": n["step"], "runs": n["runs"]} for n in search.notices
                       if n["event"] == "golden-drifted"],
        run_details=b.run_details, stress=stress,
        signals=next((r["signals"] for r in records if r.get("signals")), None),
        step_time=fix_costs(records, edge_ids=graph.edge_ids(),
                            fix=fix_edges(result),
                            variant_suffix="@" + b.experiment.fingerprint()),
        search=ONE_CAUSE if b.one_cause else EVERY_CAUSE, confidence_asked=b.confidence,
        next_steps=next_steps(b.given, result, size_one=b.size_one, guard_result=guard,
                              stress=traced_stress(b)),
        size_one=b.size_one, graph=graph.to_dict())


def traced_stress(b: Bisecting) -> str | None:
    """The stress an explain of the answer traces under, where the search chose it
    (--stress auto): explain traces one setting."""
    return (STRESS_ON if b.stress.used else STRESS_OFF) if b.stress.mode == STRESS_AUTO else None


def _discovery_counts(b: Bisecting) -> tuple[int, int]:
    """(launched, reused): the graph discovery run, when this command took it (the oracles
    count every other run), so that the one count of runs holds every run it took."""
    run_id = (b.discovery or {}).get("run_id")
    runner = b.opened.runner
    if run_id in runner.launched_ids:
        return 1, 0  # launched once, however often the graph was asked for afterwards
    return 0, int(run_id in runner.reused)
