"""The search's oracle over real training runs (search.oracle.Oracle).

Each run is one trial: it is compared against ONE golden reference trajectory
(the first all-off run, produced on first use) and stopped at its first
differing step. Runs come from the journal when they finished before: the
k-th request for a mask is that mask's run index k, and a retry after an error
is the next attempt of the same index, so a resumed search replays exactly
the runs it had and re-runs none.

Golden comparison assumes masks do not change the numbers (prefetch only
moves copies earlier). This is checked, not assumed: every run's trajectory
hash (over the steps up to its first difference) is kept, and a mask whose
runs diverge from golden at the same step with the same numbers changes the
math deterministically. From then on that mask's runs are compared within
the mask, against a full-length run of the mask itself.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.runs.execute import Runner, RunOutcome
from bisect_prefetch.search.oracle import RunResult

OnRun = Callable[[frozenset[str], RunOutcome], None]


class RealOracle:
    def __init__(
        self,
        runner: Runner,
        *,
        steps: int,
        guard: str,
        max_retries: int = 1,
        purpose: str = "search",
        on_run: OnRun | None = None,
    ) -> None:
        self.runner = runner
        self.steps = steps
        self.guard = guard
        self.max_retries = max_retries
        self.purpose = purpose
        self.on_run = on_run
        self.runs_launched = 0
        self.runs_reused = 0
        self._requests: Counter[frozenset[str]] = Counter()
        self._golden: str | None = None
        self._mask_reference: dict[frozenset[str], str] = {}
        self._divergences: dict[frozenset[str], list[tuple[int, str]]] = defaultdict(list)

    # -- the golden reference ---------------------------------------------
    @property
    def golden(self) -> str:
        """Run id of the golden trajectory: the first usable all-off run."""
        if self._golden is None:
            self._golden = self._full_run(frozenset(), f"{self.purpose}-golden")
        return self._golden

    def _full_run(self, mask: frozenset[str], purpose: str) -> str:
        """A full-length run of mask compared with nothing, retried on error."""
        failures = []
        for attempt in range(self.max_retries + 1):
            key = self.runner.key(purpose, mask=mask, guard=self.guard, steps=self.steps,
                                  index=0, attempt=attempt)
            out = self._count(self.runner.run(key, label=f"{purpose}-a{attempt}"))
            if out.usable:
                return out.run_id
            failures.append(f"{out.run_id}: {out.outcome} ({out.reason})")
        raise BisectPrefetchError(
            f"the reference run ({purpose}) failed {len(failures)} times: " + "; ".join(failures)
        )

    # -- Oracle -----------------------------------------------------------
    def run(self, mask: frozenset[str]) -> RunResult:
        """Run once with exactly mask's edges enabled; errors are retried up to max_retries."""
        mask = frozenset(mask)
        index = self._requests[mask]
        self._requests[mask] += 1
        reference = self._mask_reference.get(mask) or self.golden
        for attempt in range(self.max_retries + 1):
            key = self.runner.key(self.purpose, mask=mask, guard=self.guard, steps=self.steps,
                                  index=index, attempt=attempt)
            label = f"{self.purpose}-k{index}" + (f"-a{attempt}" if attempt else "")
            out = self._count(self.runner.run(key, label=label, reference=reference))
            if self.on_run is not None:
                self.on_run(mask, out)
            if out.usable:
                break
        if not out.usable:
            return RunResult(outcome=out.outcome, steps=out.steps_done)
        if out.diverged and reference == self._golden:
            self._note_divergence(mask, out)
        return RunResult(outcome=out.outcome, diverged=out.diverged,
                         first_diff_step=out.first_diff_step, steps=out.steps_done)

    # -- masks that change the numbers ------------------------------------
    def _note_divergence(self, mask: frozenset[str], out: RunOutcome) -> None:
        seen = self._divergences[mask]
        signature = (out.first_diff_step, out.trajectory_hash)
        if signature in seen and mask not in self._mask_reference:
            # Two runs that drifted identically: the mask changes the math, it is not a race.
            self._mask_reference[mask] = self._full_run(mask, f"{self.purpose}-maskref")
        seen.append(signature)

    def deterministic_masks(self) -> list[frozenset[str]]:
        """Masks found to change the numbers deterministically (compared within the mask)."""
        return list(self._mask_reference)

    def _count(self, out: RunOutcome) -> RunOutcome:
        if out.reused:
            self.runs_reused += 1
        else:
            self.runs_launched += 1
        return out
