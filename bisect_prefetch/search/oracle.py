"""What one training run tells the search, and the interface of whatever runs it.

The real oracle (runs/) launches jobs; the simulated one (search/simulate.py)
draws outcomes. Each run is compared against one golden reference trajectory,
so one run is one trial. Runs that failed (error, timeout, truncated) tell
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


class Oracle(Protocol):
    def run(self, mask: Mask) -> RunResult:
        """Run the workload once with exactly the edges in mask enabled."""
        ...
