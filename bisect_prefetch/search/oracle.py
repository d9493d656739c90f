"""What one training run tells the search, and the interface of whatever runs it.

The real oracle (runs/) launches jobs; the simulated one (search/simulate.py)
draws outcomes. Each run is compared against one golden reference trajectory,
so one run is one trial. Both answer through the same slot operations, which
the bisect command's one loop drives (commands/bisect_loop.py): request a run
of a mask (or of a schedule of several, search/segments.py) while a slot is
free, hear the next run that finished, hear that the job refuses schedules. Runs that failed (error, timeout, truncated) tell
nothing about drift and never count as clean.

RunResult is the one result type the search sees; the runner's journal record
(runs.execute.RunOutcome) carries more and turns into one with `.result()`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Protocol

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.vocab import RUN_OUTCOMES, USABLE_OUTCOMES, Mask


@dataclass(frozen=True)
class RunResult:
    outcome: str  # one of vocab.RUN_OUTCOMES
    diverged: bool | None = None  # None unless the outcome is usable (ok, stopped-early)
    first_diff_step: int | None = None  # 1-based step of the first difference, if diverged
    steps: int = 0  # steps actually run
    # The unit (node name) holding the first parameter whose gradient digest differed, if
    # digests localized the divergence: a hint for ordering the search, never evidence.
    unit: str | None = None

    def __post_init__(self) -> None:
        if self.outcome not in RUN_OUTCOMES:
            raise BisectPrefetchError(
                f"unknown run outcome {self.outcome!r} (one of {', '.join(RUN_OUTCOMES)})"
            )
        if self.completed and self.diverged is None:
            raise BisectPrefetchError(f"a run with outcome {self.outcome} must say if it diverged")
        if not self.completed and self.diverged is not None:
            raise BisectPrefetchError(f"a run with outcome {self.outcome} cannot say it diverged")
        if self.steps < 0:
            raise BisectPrefetchError(f"steps cannot be negative, got {self.steps}")

    @property
    def completed(self) -> bool:
        """The run got far enough to say whether it diverged."""
        return self.outcome in USABLE_OUTCOMES

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> RunResult:
        try:
            return cls(
                outcome=data["outcome"],
                diverged=data.get("diverged"),
                first_diff_step=data.get("first_diff_step"),
                steps=int(data.get("steps", 0)),
                unit=data.get("unit"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise BisectPrefetchError(f"not a run result: missing or bad field {exc}") from None


@dataclass(frozen=True)
class Finished:
    """A run the oracle heard finish: what was asked (a mask, or a Schedule) and its result.

    outcome: the oracle's own record of the run, for its run line (runs/outcome.RunOutcome;
    None where the oracle keeps none, a bare simulation). retried: a failed run the oracle
    runs again in its slot: said, never recorded. stress: it ran under stress.
    """

    planned: object  # a Mask, or a search.segments.Schedule (which imports this module)
    result: RunResult
    outcome: object = None
    retried: bool = False
    stress: bool = False


class Oracle(Protocol):
    """What runs the search's masks on `slots` slots.

    The slot operations: `request` a run of a mask, or `request_schedule` one of several
    masks by step, while fewer than `slots` are in flight; `finished` waits for the next
    one to end (in the order they end) and returns None when none is in flight; a run that
    failed may be retried inside the oracle, in its slot: its failed attempts are heard as
    `retried`, the last one as the run. Once the
    job refused a schedule, `schedule_refused` says why (later runs hold one mask). `cancel`
    drops every run still in flight (the verdict came first). `replace_golden` runs a new
    golden run, as long (`golden_steps`), when the search found that the golden run drifted
    (search/golden_drift.py).
    """

    slots: int
    schedule_refused: str | None
    golden_steps: int

    def request(self, mask: Mask) -> None: ...

    def request_schedule(self, schedule) -> None: ...  # a search.segments.Schedule

    def finished(self) -> Finished | None: ...

    def cancel(self) -> None: ...

    def replace_golden(self) -> None: ...


class AnswersAtOnce:
    """The slot operations of an oracle that answers a run when it is asked (a simulation):
    `run` and `run_schedule` give the result, which waits in a queue until heard.

    With one slot (the default) a run is heard right after it is asked, as a serial search
    runs. With more, the runs asked are heard shortest first (a diverged run stops at its
    first difference), in the order asked on a tie.
    """

    slots = 1
    schedule_refused: str | None = None

    def run(self, mask: Mask) -> RunResult:
        raise NotImplementedError

    def run_schedule(self, schedule) -> RunResult:
        raise NotImplementedError

    def _answered(self) -> list[Finished]:
        if "_answers" not in self.__dict__:
            self._answers: list[Finished] = []
        return self._answers

    def request(self, mask: Mask) -> None:
        self._answered().append(Finished(mask, self.run(mask)))

    def request_schedule(self, schedule) -> None:
        self._answered().append(Finished(schedule, self.run_schedule(schedule)))

    def finished(self) -> Finished | None:
        answers = self._answered()
        if not answers:
            return None
        first = min(range(len(answers)), key=lambda i: answers[i].result.steps)
        return answers.pop(first)

    def cancel(self) -> None:
        self._answered().clear()
