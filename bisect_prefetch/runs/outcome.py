"""How one run ended, as the journal keeps it and the search sees it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from bisect_prefetch.judge.faults import describe as describe_fault
from bisect_prefetch.search.oracle import RunResult
from bisect_prefetch.vocab import USABLE_OUTCOMES


@dataclass
class RunOutcome:
    """How one run ended, as journaled. first_diff_step is against its reference.

    The search sees it as a RunResult (`.result()`); the rest is for the journal
    and the reports.
    """

    run_id: str
    outcome: str  # one of vocab.RUN_OUTCOMES
    reason: str
    first_diff_step: int | None = None
    reference: str | None = None  # run id it was compared with
    steps_done: int = 0  # last step the metrics rank reported
    trajectory_hash: str | None = None  # of the steps up to first_diff_step (all, if none)
    wall_s: float | None = None
    first_progress_s: float | None = None  # launch to first metrics line
    exit_code: int | None = None
    problems: list[str] = field(default_factory=list)
    fault: dict[str, Any] | None = None  # judge.faults record of a failed run, if a log names one
    step_time_ms: float | None = None  # median step time after warm-up (judge/step_time.py)
    # [step, ms] of every step after warm-up (the slowest rank's): costs compare runs over
    # the steps they all ran (judge/step_time.compare_runs).
    step_times_ms: list[list[float]] | None = None
    # The machine's 1-minute load average when the run was collected: step times of runs
    # on a differently busy machine are no cost of a mask (judge/step_time.py).
    load_avg: float | None = None
    # Where the digests first differ from the reference: metrics.localize.Localization's JSON.
    localization: dict[str, Any] | None = None
    # What the run measured (judge/signals.py): step boundaries, digests, order, precision.
    signals: dict[str, Any] | None = None
    # The job's own environment, as its ranks saw it (runs/envprint.summary; None: no print).
    environment: dict[str, Any] | None = None
    # What the job read (runs/reuse.collect): the run is reused only while it is the same.
    manifest: dict[str, Any] | None = None
    # What it was started with (runs/launch_env.launch_print): likewise.
    launched: dict[str, Any] | None = None
    # The command's session that ran it (runs/sessions.py): --resume continues its own.
    session: str | None = None
    reused: bool = False

    @property
    def usable(self) -> bool:
        """Only ok and stopped-early runs enter a verdict."""
        return self.outcome in USABLE_OUTCOMES

    @property
    def diverged(self) -> bool:
        return self.first_diff_step is not None

    def why(self) -> str:
        """The reason it ended, with the fault its logs name: for a run's terminal line."""
        return self.reason + (f"; fault {describe_fault(self.fault)}" if self.fault else "")

    def result(self) -> RunResult:
        """What the search sees of this run."""
        if not self.usable:
            return RunResult(outcome=self.outcome, steps=self.steps_done)
        return RunResult(outcome=self.outcome, diverged=self.diverged,
                         first_diff_step=self.first_diff_step, steps=self.steps_done,
                         unit=None if (self.localization or {}).get("rule") == "every-unit"
                         else (self.localization or {}).get("unit"))

    def to_record(self) -> dict[str, Any]:
        record = asdict(self)
        record.pop("reused")
        return record

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> RunOutcome:
        names = {f for f in cls.__dataclass_fields__ if f != "reused"}
        return cls(**{k: v for k, v in record.items() if k in names}, reused=True)

