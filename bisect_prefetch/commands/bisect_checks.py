"""The bisect command's runs before its search (commands/bisect.py), each through the one
loop (commands/bisect_loop.drive) like every run of the search:

- the stress calibration (--stress auto): all-on without and with stress, a pair at a
  time, until search/stress.Calibration decides; each run on the oracle of its setting;
- the search's first checks (all-on, and after a divergence all-off), one mask a run,
  before the segments are cut: how often drift shows all-on is what their cost model
  needs (search/segments.py);
- the segment lengths they decide (search.segments auto), or one mask a run.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.console import Console

from bisect_prefetch.commands.bisect_loop import RunNumbers, Unsaid, drive
from bisect_prefetch.commands.bisect_setup import PURPOSE, Bisecting, BisectOracle
from bisect_prefetch.commands.bisect_words import (
    SEGMENTS_UNMEASURED,
    calibration_title,
    calibration_verdict,
    golden_again_title,
    leading_check_title,
    lengths_words,
    one_run_verdict,
    segments_cost_more_line,
    segments_fixed_line,
    segments_unfit_line,
)
from bisect_prefetch.experiment import segments_unfit, steps_fixed
from bisect_prefetch.judge.step_time import startup_in_steps
from bisect_prefetch.search.interface import Search
from bisect_prefetch.search.oracle import Finished, RunResult
from bisect_prefetch.search.runlog import Ask, mask_name
from bisect_prefetch.search.segments import Lengths, lengths_for
from bisect_prefetch.search.stress import Calibration, CalibrationRule, Hazard
from bisect_prefetch.vocab import STAGE_CALIBRATE, STAGE_CHECK_OFF, Mask


# -- the stress calibration ----------------------------------------------------------------
class BothSettings:
    """The oracles of both stress settings as one, for the calibration: each run goes to
    the oracle of the setting the calibration asks for. It asks one run at a time (one
    slot), so the run in flight is the last one asked; the loop asks it nothing more (no
    segments, and no golden run drifts: the calibration compares runs with none)."""

    slots = 1
    schedule_refused: str | None = None

    def __init__(self, calibration: Calibration, oracle_of: Callable[[bool], BisectOracle]):
        self.calibration = calibration
        self.oracle_of = oracle_of
        self._asked: BisectOracle | None = None

    def request(self, mask: Mask) -> None:
        ask = self.calibration.pending  # the ask the loop requests
        self._asked = self.oracle_of(ask.stress)
        self._asked.request(mask)

    def finished(self) -> Finished | None:
        return None if self._asked is None else self._asked.finished()

    def cancel(self) -> None:
        if self._asked is not None:
            self._asked.cancel()


def calibrate_stress(b: Bisecting, rule: CalibrationRule) -> None:
    """Whether stress makes drift show more often, until the rule decides; each setting's
    runs with the line that said them (the chosen setting's count in its search, and
    without: the search again without stress)."""
    b.console.print(calibration_title(rule), markup=False)
    calibration = Calibration(Mask(b.opened.graph().edge_ids()), steps=b.experiment.steps,
                              rule=rule)
    drive(calibration, BothSettings(calibration, b.oracle_of), narrator=Unsaid(),
          numbers=b.numbers, lines=b.lines)
    lines = b.numbers.new_search()  # the line of each calibration run, in the order run
    choice = calibration.result()
    b.console.print(calibration_verdict(choice, rule), markup=False, soft_wrap=True)
    b.stress.choice, b.stress.used = choice, choice.use
    said = {on: [line for line, setting in zip(lines, calibration.settings, strict=True)
                 if setting == on] for on in (False, True)}
    b.calibration = {on: list(zip(calibration.runs[on], said[on], strict=True))
                     for on in (False, True)}


# -- the first checks ----------------------------------------------------------------------
class FirstChecks:
    """The search's first checks as a search of their own: the search's asks while they
    are first checks (all-on, all-off), one at a time, each recorded in the search; it
    asks nothing more at the search's first other ask, and no all-on where the
    calibration's runs already tell how often drift shows all-on (`calibrated`)."""

    def __init__(self, search: Search, *, calibrated: bool) -> None:
        self.search = search
        self.all_on = Mask(search.edge_ids)
        self.calibrated = calibrated
        self.results: dict[bool, list[RunResult]] = {True: [], False: []}  # by all-on or not
        self._in_flight = False

    @property
    def pending(self) -> Ask | None:
        ask = self.search.pending
        if self._in_flight or ask is None or ask.stage not in (STAGE_CALIBRATE, STAGE_CHECK_OFF):
            return None
        return None if ask.mask == self.all_on and self.calibrated else ask

    def propose(self) -> None:
        self._in_flight = True  # one at a time on any number of slots

    def record(self, mask: Mask, result: RunResult) -> None:
        self._in_flight = False
        self.search.record(mask, result)
        self.results[mask == self.all_on].append(result)

    @property
    def done(self) -> bool:
        return self.search.done

    @property
    def runs_used(self) -> int:
        return self.search.runs_used

    @property
    def golden_drifted(self) -> int | None:
        return self.search.golden_drifted

    def golden(self, steps: int) -> None:
        self.search.golden(steps)


class EachCheck:
    """Says each first check as it runs: its title, then its one run's verdict."""

    def __init__(self, console: Console, numbers: RunNumbers, edge_ids: list[str]) -> None:
        self.console = console
        self.numbers = numbers
        self.edge_ids = edge_ids

    def before(self, ask: Ask) -> None:
        self.console.print(leading_check_title(ask, mask_name(ask.mask, self.edge_ids)),
                           markup=False)

    def recorded(self, result: RunResult) -> None:
        self.console.print(one_run_verdict(result, self.numbers.said), markup=False)

    def close(self) -> None:
        pass


def first_checks(b: Bisecting) -> tuple[Hazard | None, bool]:
    """What the cost model of segments needs from the runs: the per-step hazard all-on
    (from the calibration's runs of this setting and the first checks'; None where no
    all-on run completed) and whether all-off drifted too. Full runs either way."""
    started = b.current
    calibrated = [result for result, _ in b.calibration.get(started.on, [])]
    checks = FirstChecks(started.search, calibrated=bool(calibrated))
    drive(checks, started.oracle, narrator=EachCheck(b.console, b.numbers,
                                                     started.search.edge_ids),
          numbers=b.numbers, lines=b.lines)
    completed = [r for r in calibrated + checks.results[True] if r.completed]
    hazard = Hazard.of([r.first_diff_step if r.diverged else None for r in completed],
                       steps=b.experiment.steps) if completed else None
    return hazard, any(r.diverged for r in checks.results[False])


# -- the segment lengths -------------------------------------------------------------------
def segment_lengths(b: Bisecting) -> Lengths | None:
    """search.segments auto: segment length and step cap from the start-up and step time
    this experiment's runs measured (the golden run's at least) and the per-run chance of
    drift all-on, and the golden run as long as the longest run; None: one mask a run
    (segments off, or not cheaper: search/segments.py)."""
    experiment, console, oracle = b.experiment, b.console, b.current.oracle
    if experiment.search.segments == "off":
        return None
    if unfit := segments_unfit(experiment):
        console.print(segments_unfit_line(unfit), markup=False)
        return None
    if fixed := steps_fixed(experiment):  # a run of several masks is longer than the job's own
        console.print(segments_fixed_line(fixed, experiment.steps), markup=False)
        return None
    startup = startup_in_steps(_runs_before_the_search(b))
    if startup is None:
        console.print(SEGMENTS_UNMEASURED, markup=False)
        return None
    chance, background = first_checks(b) if startup > 0 else (None, False)
    if b.current.search.done:
        return None  # nothing left to cut (the search ended on its first checks)
    lengths = lengths_for(experiment.steps, startup, len(b.opened.graph().edge_ids()),
                          chance=None if chance is None else chance.per_run_chance(),
                          background=background)
    if lengths.cap_steps == experiment.steps:
        console.print(segments_cost_more_line(startup, chance, background), markup=False)
        return None
    console.print(lengths_words(lengths, startup), markup=False)
    if lengths.cap_steps > oracle.golden_steps:
        console.print(golden_again_title(lengths.cap_steps), markup=False)
        oracle.run_golden(lengths.cap_steps)
    return lengths


def _runs_before_the_search(b: Bisecting) -> list[dict]:
    """This experiment's runs before the search's own, none longer than a run (not the
    golden run lengthened for segments), so that a resumed search cuts its runs the same
    way."""
    experiment = b.experiment
    tail, before = "@" + experiment.fingerprint(), []
    for record in b.opened.state.records():
        variant = str(record.get("variant", ""))
        if variant.endswith(tail) and variant.partition("+")[0] == PURPOSE:
            break
        if variant.endswith(tail) and record.get("steps", 0) <= experiment.steps:
            before.append(record)
    return before
