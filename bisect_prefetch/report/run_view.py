"""A state dir's runs as the report shows them: groups, the command that ran each, and the
bisection's timeline (one row a run, numbered as the transcript's run lines).

A journal record's `variant` is `purpose+code@fingerprint` (runs/execute.Runner.key): the
purpose says which command ran it (`search*`: bisect; `aa`, `init`, `explain`, `audit`,
`matrix:CELL`; `discover`: the graph discovery every command shares), the fingerprint
which version of the experiment file.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bisect_prefetch.judge.faults import describe as describe_fault
from bisect_prefetch.report.localization import describe as describe_localization
from bisect_prefetch.vocab import CONSISTENT, DIVERGED, USABLE_OUTCOMES

SEARCH = "search"  # commands/bisect_setup.PURPOSE: the prefix of every run a bisection keys
DISCOVER = "discover"


def purpose_of(record: dict[str, Any]) -> str:
    return str(record.get("variant", "?")).split("@", 1)[0].split("+", 1)[0]


def fingerprint_of(record: dict[str, Any]) -> str:
    return str(record.get("variant", "")).rpartition("@")[2]


def command_of(purpose: str) -> str:
    """The command that runs a purpose's runs, in words."""
    if purpose.startswith(SEARCH):
        return "bisect"
    if purpose.startswith("matrix:"):
        return "matrix"
    if purpose == DISCOVER:
        return "graph discovery"
    return purpose


@dataclass
class RunGroup:
    """Journal records of one protocol step's runs: same purpose, mask, guard and steps."""

    purpose: str
    mask: list[str] | None
    guard: str
    steps: int
    records: list[dict[str, Any]] = field(default_factory=list)

    @property
    def usable(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("outcome") in USABLE_OUTCOMES]

    @property
    def diverged_runs(self) -> list[dict[str, Any]]:
        return [r for r in self.usable if r.get("first_diff_step") is not None]

    @property
    def first_diff_step(self) -> int | None:
        return min((r["first_diff_step"] for r in self.diverged_runs), default=None)

    @property
    def verdict(self) -> str:
        """diverged, consistent, error (no usable run), or reference: runs compared with
        nothing (a golden trajectory, a graph discovery), which decide nothing alone."""
        if self.diverged_runs:
            return DIVERGED  # a divergence is conclusive, even in a group of one run
        if not self.usable:
            return "error"
        if any(r.get("reference") is not None for r in self.usable):
            return CONSISTENT
        return "reference"

    def first_divergence(self) -> dict[str, Any] | None:
        runs = sorted(self.diverged_runs, key=lambda r: r["first_diff_step"])
        return runs[0] if runs else None


def journal_groups(records: list[dict[str, Any]]) -> list[RunGroup]:
    """Group journal records, in the order their first run finished."""
    groups: dict[tuple, RunGroup] = {}
    for record in records:
        # The whole variant keys a group: an edited experiment starts new groups.
        mask = record.get("mask")
        key = (str(record.get("variant", "?")), None if mask is None else tuple(mask),
               record.get("guard", "none"), record.get("steps", 0))
        if key not in groups:
            groups[key] = RunGroup(purpose_of(record), None if mask is None else list(mask),
                                   key[2], key[3])
        groups[key].records.append(record)
    return list(groups.values())


def split_runs(records: list[dict[str, Any]], bisect: dict[str, Any] | None
               ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the bisection's runs, every other command's): with a bisect.json, its runs are the
    search's of the fingerprint its run ids have, and the graph discovery of that
    fingerprint; without one there is no bisection and every run is another command's."""
    if not bisect:
        return [], list(records)
    ids = {d.get("run_id") for d in bisect.get("run_details") or []}
    prints = {fingerprint_of(r) for r in records if r.get("run_id") in ids}
    if not prints:  # a search cut short before its first run line: its newest fingerprint
        prints = {fingerprint_of(r) for r in records if purpose_of(r).startswith(SEARCH)}
        prints = set(list(prints)[-1:])
    mine = [r for r in records if fingerprint_of(r) in prints
            and (purpose_of(r).startswith(SEARCH) or purpose_of(r) == DISCOVER)]
    taken = {id(r) for r in mine}
    return mine, [r for r in records if id(r) not in taken]


def mask_text(mask: Sequence[str] | None, edge_ids: Sequence[str] | None) -> str:
    """A mask as `--mask` takes it: a preset where one fits, else keep-only or drop-only of
    the shorter list (every edge named: it can be pasted)."""
    if mask is None:
        return "unchanged (recording only)"
    if not edge_ids:
        return f"{len(mask)} edges on"
    from bisect_prefetch.select import describe

    name = describe(frozenset(mask), edge_ids)
    if not name.endswith(" on"):
        return name
    on = [e for e in edge_ids if e in set(mask)]
    off = [e for e in edge_ids if e not in set(mask)]
    return "keep-only:" + ",".join(on) if len(on) <= len(off) else "drop-only:" + ",".join(off)


@dataclass
class TimelineRow:
    """One run of the bisection: its transcript number (None for the golden run and the
    graph discovery, which have no run line), what it was, its segments and how it ended."""

    run: int | None
    run_id: str
    what: str
    segments: list[tuple[int, int, str]]  # (first step, last step, mask)
    outcome: str
    first_diff_step: int | None
    why: str
    reused: bool = False


def why_words(record: dict[str, Any]) -> str:
    """Where and how a run first differed (digests, metrics) or why it failed (fault)."""
    if record.get("outcome") not in USABLE_OUTCOMES:
        fault = record.get("fault")
        return describe_fault(fault) if isinstance(fault, dict) else str(record.get("reason") or "")
    step = record.get("first_diff_step")
    if step is None:
        if "golden" in purpose_of(record) or purpose_of(record) == DISCOVER:
            return "the reference the other runs are compared with" if DISCOVER != purpose_of(
                record) else "records the prefetch graph"
        return f"no difference over {record.get('steps_done', 0)} steps"
    where = describe_localization(record.get("localization"))
    return where or f"the printed metrics first differ at step {step}"


def _segments(schedule: list | None, mask: list[str] | None, steps: int,
              edge_ids: Sequence[str] | None) -> list[tuple[int, int, str]]:
    if not schedule:
        return [(1, steps, mask_text(mask, edge_ids))]
    out = []
    for i, (first, edges) in enumerate(schedule):
        last = schedule[i + 1][0] - 1 if i + 1 < len(schedule) else steps
        out.append((first, last, mask_text(edges, edge_ids)))
    return out


def timeline(bisect: dict[str, Any], records: list[dict[str, Any]],
             edge_ids: Sequence[str] | None) -> list[TimelineRow]:
    """The bisection's runs in the order they were said: the graph discovery and golden
    runs first (no run line), then `run 1`, `run 2`, ... as the transcript numbered them."""
    by_id = {r.get("run_id"): r for r in records}
    rows: list[TimelineRow] = []
    numbered = {d.get("run_id") for d in bisect.get("run_details") or []}
    for record in records:
        purpose = purpose_of(record)
        if record.get("run_id") in numbered or not (purpose == DISCOVER or "golden" in purpose
                                                   or "maskref" in purpose):
            continue
        what = {DISCOVER: "graph discovery"}.get(purpose, "golden reference" if "golden" in purpose
                                                 else "reference of a mask that changes the math")
        rows.append(TimelineRow(None, str(record.get("run_id")), what,
                                _segments(None, record.get("mask"), record.get("steps", 0), edge_ids),
                                str(record.get("outcome")), None, why_words(record)))
    if not numbered:  # a bisect.json written without run_details: the journal's order
        return rows + [TimelineRow(None, str(r.get("run_id")), command_of(purpose_of(r)),
                                   _segments(r.get("schedule"), r.get("mask"), r.get("steps", 0),
                                             edge_ids),
                                   str(r.get("outcome")), r.get("first_diff_step"), why_words(r))
                       for r in records if purpose_of(r) == SEARCH]
    for number, detail in enumerate(bisect.get("run_details") or [], start=1):
        record = by_id.get(detail.get("run_id"), {}) | {
            k: v for k, v in detail.items() if v is not None and k != "mask"}
        steps = record.get("steps") or detail.get("steps_done") or 0
        what = SEARCH + (", stress" if detail.get("stress") else "")
        rows.append(TimelineRow(
            detail.get("run", number), str(detail.get("run_id")), what,
            _segments(detail.get("schedule"), detail.get("mask"), steps, edge_ids),
            str(detail.get("outcome")), detail.get("first_diff_step"), why_words(record),
            bool(detail.get("reused"))))
    return rows
