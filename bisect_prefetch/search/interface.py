"""What the bisect loop drives: the names commands/bisect_loop.run_bisection and its
Narrator use of a search, and those segments.plan_run and record_run use on the loop's
behalf (plan_trials, cancel), and bisect.json's record of them (startups). The one-cause search (protocol.Bisection) and the search
for every cause (causes.CauseSearch) both are one; tests/search/test_interface.py checks it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from bisect_prefetch.search.oracle import RunResult
from bisect_prefetch.search.runlog import Ask, Block
from bisect_prefetch.search.verdict import SearchResult
from bisect_prefetch.vocab import Mask


@runtime_checkable
class Search(Protocol):
    edge_ids: list[str]
    notices: list[dict]  # what the search says of itself (hints, rounds, a golden run that drifted)
    golden_drifted: int | None  # the step a golden run drifted at, until `golden` gives a new one

    @property
    def pending(self) -> Ask | None: ...  # the next run; None: wait for a run in flight

    @property
    def done(self) -> bool: ...

    @property
    def blocks(self) -> Sequence[Block]: ...  # the blocks of runs, in order (the narrated lines)

    @property
    def runs_used(self) -> int: ...

    @property
    def startups(self) -> int: ...  # training runs the trials took (bisect.json's segments record)

    def propose(self, ask: Ask | None = None) -> Ask | None: ...  # the next run, marked in flight

    def record(self, mask: Mask, result: RunResult, *, hint: str | None = None, startup: bool = True,
               matched: int | None = None) -> None: ...

    def cancel(self, mask: Mask) -> None: ...

    def plan_trials(self, share: float) -> None: ...

    def golden(self, steps: int) -> None: ...

    def result(self) -> SearchResult: ...
