"""The search's oracle over real training runs (search.oracle.Oracle).

Each run is one trial: it is compared against ONE golden reference trajectory
(the first all-off run, produced on first use) and stopped at its first
differing step. Runs come from the journal when they finished before: the
k-th request for a mask is that mask's run index k, and a retry after an error
is the next attempt of the same index, so a resumed search replays exactly
the runs it had and re-runs none.

All-off runs of earlier commands (`aa --mask all-off`, a matrix cell, under the
same code, experiment fingerprint, steps, guard and stress) count too
(`reuse_earlier`): a full-length one that was compared with nothing (the first
of its group) is the golden run, and the all-off runs compared with it are the
search's first background controls. Only records journaled before this search's
first own run are looked at, so a resumed search reuses the same ones.

The golden run is started by `run_golden` (a run that needs it and finds none
starts it too). Runs of several masks (search/segments.py) come from
`request_schedule`: their key holds the schedule, and the golden run is
lengthened to the step cap first (`run_golden(cap)`), so it covers the longest
run. Every run the search asks for goes through the slot operations of
search.oracle.Oracle over drivers/slots.py (one slot is one run at a time); the
golden run and a mask's own reference (`_full_run`) are no ask of the search, and
run one at once, outside the slots, unsaid.

Golden comparison assumes masks do not change the numbers (prefetch only
moves copies earlier). This is checked, not assumed: every run's trajectory
hash (over the steps up to its first difference) is kept, and a mask whose
runs diverge from golden at the same step with the same numbers changes the
math deterministically. From then on that mask's runs are compared within
the mask, against a full-length run of the mask itself. All-off is the
golden run's own configuration: its runs differing alike show that the golden
run drifted, which the search tells from the runs (search/golden_drift.py);
`replace_golden` then runs a new one.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from bisect_prefetch.drivers.slots import RunRequest, Slots
from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.judge.merge import REFUSED
from bisect_prefetch.runs.execute import Runner
from bisect_prefetch.runs.executors.base import LOST, LOST_RETRIES
from bisect_prefetch.runs.outcome import RunOutcome
from bisect_prefetch.search.oracle import Finished
from bisect_prefetch.search.segments import Schedule
from bisect_prefetch.vocab import ADAPTER_NOT_ACTIVE, OK, USABLE_OUTCOMES, Mask


@dataclass
class Earlier:
    """All-off runs of earlier commands a search reuses: the golden run and its controls."""

    golden: str | None = None
    controls: list[RunOutcome] = field(default_factory=list)

    @property
    def runs(self) -> int:
        return (self.golden is not None) + len(self.controls)


def earlier_all_off(records: list[dict[str, Any]], *, own: str, fingerprint: str,
                    steps: int, guard: str, stress: bool) -> Earlier:
    """The golden run and controls among journal records (runs/store.py), by their fields.

    own: the search's purpose; its records (`own`, `own-golden`, `own-maskref`) and every
    record after its first are left out. fingerprint: "CODE@EXPERIMENT", the variant's
    tail after the purpose. The golden run: a clean full-length all-off run compared with
    nothing, the one most others were compared with (the first such on a tie); its
    controls: the usable all-off runs compared with it.
    """
    before = []
    for record in records:
        purpose, _, tail = record["variant"].rpartition("+")
        if tail == fingerprint and (purpose == own or purpose.startswith(own + "-")):
            break  # this search's own runs began here
        if (tail == fingerprint and record["mask"] == [] and record["steps"] == steps
                and record["guard"] == guard and (record.get("stress") is True) == stress
                and record.get("outcome") in USABLE_OUTCOMES):
            before.append(record)
    compared = Counter(r.get("reference") for r in before)
    candidates = [r["run_id"] for r in before
                  if r.get("outcome") == OK and r.get("reference") is None
                  and r.get("first_diff_step") is None and r.get("steps_done", 0) >= steps]
    if not candidates:
        return Earlier()
    golden = max(candidates, key=lambda run_id: compared[run_id])  # max keeps the first on a tie
    return Earlier(golden, [RunOutcome.from_record(r) for r in before
                            if r.get("reference") == golden])


class RealOracle:
    def __init__(
        self,
        runner: Runner,
        *,
        steps: int,
        guard: str,
        max_retries: int = 1,
        purpose: str = "search",
        stress: bool = False,
    ) -> None:
        self.runner = runner
        self.stress = stress  # every run of this oracle, golden included, under stress or not
        self.steps = steps
        self.golden_steps = steps  # as long as the longest run (segments: the step cap)
        self.guard = guard
        self.max_retries = max_retries
        self.purpose = purpose
        self.runs_launched = 0
        self.runs_reused = 0
        self.runs_lost: list[str] = []  # "run id: reason" of runs whose job the scheduler took away
        self.schedule_refused: str | None = None  # why the job cannot switch masks inside a run
        self._requests: Counter = Counter()  # per mask, or per schedule of several
        self._golden: str | None = None
        self._golden_replaced = 0  # golden runs that drifted (replace_golden)
        self._mask_reference: dict[Mask, str] = {}
        self._divergences: dict[Mask, list[tuple[int, str]]] = defaultdict(list)
        self._slots = Slots(runner)

    # -- the golden reference ---------------------------------------------
    def reuse_earlier(self) -> Earlier:
        """Take the golden run from earlier all-off runs where there is one (before the
        first request); returns it with the controls compared with it, for the search."""
        if self._golden is not None or self._requests:
            raise BisectPrefetchError("earlier runs are reused before the search's first run")
        variant = self.runner.key(self.purpose, mask=Mask(), guard=self.guard, steps=self.steps,
                                  index=0, stress=self.stress).variant
        earlier = earlier_all_off(self.runner.reusable_records(), own=self.purpose,
                                  fingerprint=variant.rpartition("+")[2], steps=self.steps,
                                  guard=self.guard, stress=self.stress)
        self._golden = earlier.golden
        return earlier

    @property
    def golden(self) -> str | None:
        """Run id of the golden trajectory (None until `run_golden`, or a reused one)."""
        return self._golden

    def run_golden(self, steps: int | None = None) -> str:
        """Run the golden reference (all-off, compared with nothing), unless there is one at
        least `steps` long (None: as long as the runs so far); its run id. Runs of several
        masks go up to their step cap: the golden run must cover them."""
        if steps is not None and steps > self.golden_steps:
            self.golden_steps, self._golden = steps, None
        if self._golden is None:
            self._golden = self._full_run(Mask(), f"{self.purpose}-golden", steps=self.golden_steps)
        return self._golden

    def replace_golden(self) -> None:
        """The golden run drifted (search/golden_drift.py): a new one as long, compared with
        nothing; what runs showed against the old one (masks that change the numbers) goes."""
        self._golden_replaced += 1
        self._golden = self._full_run(Mask(), f"{self.purpose}-golden{self._golden_replaced}",
                                      steps=self.golden_steps)
        self._mask_reference.clear()
        self._divergences.clear()

    def _full_run(self, mask: Mask, purpose: str, *, steps: int | None = None) -> str:
        """A full-length run of mask compared with nothing, retried on error."""
        failures = []
        attempt = 0
        while True:
            key = self.runner.key(purpose, mask=mask, guard=self.guard, steps=steps or self.steps,
                                  index=0, attempt=attempt, stress=self.stress)
            out = self._count(self.runner.run(key, label=f"{purpose}-a{attempt}"))
            if out.usable:
                return out.run_id
            failures.append(f"{out.run_id}: {out.outcome} ({out.reason})")
            if out.reason.startswith(ADAPTER_NOT_ACTIVE) or not self._retried(out, attempt):
                break  # a refused engine: a retry would be refused the same way
            attempt += 1
        raise BisectPrefetchError(
            f"the reference run ({purpose}) failed {len(failures)} times: " + "; ".join(failures)
        )

    def _retried(self, out: RunOutcome, attempt: int) -> bool:
        """Whether a run that ended so is run again: a failed run max_retries times; a lost
        one (the scheduler took its job away: a node failure, a cancel) LOST_RETRIES times
        more, as it says nothing about the job."""
        lost = f"{LOST}: " in out.reason
        return not out.usable and attempt < self.max_retries + (LOST_RETRIES if lost else 0)

    def _reference(self, mask: Mask) -> str:
        return self._mask_reference.get(mask) or self.run_golden()

    # -- the slot operations (search.oracle.Oracle): runs in flight on several slots --
    @property
    def slots(self) -> int:
        return self.runner.executor.slots

    def request(self, mask: Mask) -> None:
        """Start the next run of mask in a free slot; `finished` hears it."""
        self._slots.start(self._mask_request(mask))

    def request_schedule(self, schedule: Schedule) -> None:
        """Start a run of several masks by step (search/segments.py), up to its step cap,
        against the golden run; the k-th request of the same masks is its index k."""
        self._slots.start(self._schedule_request(schedule))

    def finished(self) -> Finished | None:
        """The next run that finished, with its outcome; None when none is in flight. A
        failed run that is run again in its slot is heard as `retried`, its retry later."""
        done = self._slots.next_finished()
        if done is None:
            return None
        request, out = done
        retry = self._retry(request, out)
        if retry is not None:
            self._slots.start(retry)
        planned, _, _ = request.tag
        return Finished(planned, out.result(), outcome=out, retried=retry is not None,
                        stress=self.stress)

    def cancel(self) -> None:
        self._slots.cancel()

    # A request's tag: (what was asked: a Mask or a Schedule, its index, its attempt).
    def _mask_request(self, mask: Mask, *, index: int | None = None,
                      attempt: int = 0) -> RunRequest:
        if index is None:
            index = self._requests[mask]
            self._requests[mask] += 1
        key = self.runner.key(self.purpose, mask=mask, guard=self.guard, steps=self.steps,
                              index=index, attempt=attempt, stress=self.stress)
        label = f"{self.purpose}-k{index}" + (f"-a{attempt}" if attempt else "")
        return RunRequest(key, label=label, tag=(mask, index, attempt),
                          reference=self._reference(mask))

    def _schedule_request(self, schedule: Schedule, *, index: int | None = None,
                          attempt: int = 0) -> RunRequest:
        masks = tuple(schedule.masks)
        if index is None:
            index = self._requests[masks]
            self._requests[masks] += 1
        key = self.runner.key(self.purpose, mask=masks[0][1], guard=self.guard,
                              steps=schedule.steps, index=index, attempt=attempt,
                              stress=self.stress, schedule=masks)
        label = f"{self.purpose}-s{index}" + (f"-a{attempt}" if attempt else "")
        return RunRequest(key, label=label, tag=(schedule, index, attempt),
                          reference=self.run_golden())

    def _retry(self, request: RunRequest, out: RunOutcome) -> RunRequest | None:
        """The retry to run in a finished run's place, or None: the search learns from it."""
        planned, index, attempt = request.tag
        self._count(out)
        segmented = isinstance(planned, Schedule)
        if segmented and REFUSED in (out.reason or ""):  # the engine: a retry would refuse too
            self.schedule_refused = out.reason
            return None
        if self._retried(out, attempt):
            if segmented:
                return self._schedule_request(planned, index=index, attempt=attempt + 1)
            return self._mask_request(planned, index=index, attempt=attempt + 1)
        # A run of several masks that diverged tells no mask that changes the math by itself.
        if out.usable and out.diverged and request.reference == self._golden and not segmented:
            self._note_divergence(planned, out)
        return None

    # -- masks that change the numbers ------------------------------------
    def _note_divergence(self, mask: Mask, out: RunOutcome) -> None:
        if not mask:  # all-off is the golden run's configuration: runs of it that differ from
            return    # it alike show that the golden run drifted (search/golden_drift.py)
        seen = self._divergences[mask]
        signature = (out.first_diff_step, out.trajectory_hash)
        if signature in seen and mask not in self._mask_reference:
            # Two runs that drifted identically: the mask changes the math, it is not a race.
            self._mask_reference[mask] = self._full_run(mask, f"{self.purpose}-maskref")
        seen.append(signature)

    def deterministic_masks(self) -> list[Mask]:
        """Masks found to change the numbers deterministically (compared within the mask)."""
        return list(self._mask_reference)

    def _count(self, out: RunOutcome) -> RunOutcome:
        if f"{LOST}: " in out.reason:  # also after "stopped at step N of M, "
            self.runs_lost.append(f"{out.run_id}: {out.reason}")
        if out.reused:
            self.runs_reused += 1
        else:
            self.runs_launched += 1
        return out
