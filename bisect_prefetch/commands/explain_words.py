"""What `explain` says of a comparison of two runs' op traces (commands/explain.py): the
finding with its edge, each rank's, how much of each rank's traces there was to compare,
and what to run next."""

from __future__ import annotations

from typing import Any

from bisect_prefetch.metrics.op_compare import (
    ALIGNMENT_BROKEN,
    COPY_OUT,
    EXPLAINED,
    ISSUED,
    READ,
    TRACES_INCOMPLETE,
    WINDOW,
    Explanation,
    RankFinding,
)
from bisect_prefetch.report.verdict_block import KIND_WORDS

NO_EDGE_OFF = "no prefetch edge was on (every edge off)"
NO_EDGE = ("the op ran in no prefetch and read nothing a prefetch filled, and no prefetch's "
           "window saw a parameter change")


def where(finding: RankFinding) -> str:
    place = f"{finding.phase} of {finding.module}" if finding.module else (finding.phase or "")
    return f"rank {finding.rank}, step {finding.step}, {place}"


def op_words(finding: RankFinding) -> str:
    """The op, tied to its edge where it is: `c10d._allgather_base_ issued by prefetch E`."""
    edge, how = finding.edge, finding.edge_how
    if edge is None:
        return finding.op or ""
    if how == ISSUED:
        return f"{finding.op} issued by prefetch {edge}"
    if how == COPY_OUT:
        return f"{finding.op}, the copy-out of prefetch {edge}"
    if how == WINDOW:
        return f"the window of prefetch {edge}, from its issue to {finding.module}'s use"
    if how == READ:
        return f"{finding.op}, reading what prefetch {edge} filled"
    return f"{finding.op} (prefetch {edge})"


def read_by_words(finding: RankFinding) -> str:
    reader = finding.read_by
    if not reader:
        return ""
    return f", read by {reader.get('module') or 'no module'}'s {reader.get('phase')}"


def edge_note(explanation: Explanation, mask: list[str]) -> str | None:
    """Why the first divergence is tied to no edge (None where it is tied to one)."""
    first = explanation.first
    if first is None or first.edge is not None:
        return None
    return NO_EDGE_OFF if not mask else NO_EDGE


def coverage_line(finding: RankFinding, pair: list[str] | None) -> str:
    """A rank whose traces were not compared in full, with its counts."""
    coverage = finding.coverage or {}
    names = {"a": pair[0], "b": pair[1]} if pair else {"a": "run A", "b": "run B"}
    short = names.get(coverage.get("run"), "a run")
    other = names["b" if coverage.get("run") == "a" else "a"]
    expected = coverage.get("expected")
    if coverage.get("traced") is None:
        return (f"rank {finding.rank}: {short} has no op trace (~{expected} ops in {other}): "
                "this rank was not compared")
    stops = coverage.get("stops_at")
    stop = f" (its trace stops at step {stops[0]}, op {stops[1]})" if stops else ""
    through = coverage.get("through_step")
    span = f" through step {through}" if through is not None else ""
    return (f"rank {finding.rank}: {short} traced {coverage['traced']} of ~{expected} ops"
            f"{span}{stop}: the {finding.ops_compared} both traced agree; what came after "
            "was not compared")


def explanation_lines(explanation: Explanation, *, first_diff_step: int | None,
                      again: str | None = None,
                      localization: dict[str, Any] | None = None,
                      pair: list[str] | None = None, mask: list[str] | None = None,
                      describe_localization: Any = None) -> list[str]:
    """The terminal lines of a comparison (the finding, each rank, what to do next)."""
    first = explanation.first
    traced = explanation.steps_traced
    window = f"{traced[0]}-{traced[-1]}" if traced else "none"
    gaps = [coverage_line(f, pair) for f in explanation.gaps()]
    if first is None:
        if explanation.verdict == TRACES_INCOMPLETE:
            lines = [f"no op differs among those both runs traced (steps traced: {window}; "
                     f"the runs first differ at step {first_diff_step}), but not every "
                     "rank's traces were compared in full:", *gaps]
        else:
            lines = [f"no traced op differs (steps traced: {window}; the runs first differ "
                     f"at step {first_diff_step}): no op the dispatcher ran read the "
                     "difference before the run was stopped, or it arose outside the "
                     "traced steps"]
        where_digests = describe_localization(localization) if describe_localization else None
        if where_digests:
            lines.append(f"first differing tensor, from the digests: {where_digests}")
        if again and first_diff_step is not None and (
                first_diff_step not in traced or explanation.verdict == TRACES_INCOMPLETE):
            lines.append(f"trace that step: {again}")
        return lines
    lines = []
    if explanation.verdict == ALIGNMENT_BROKEN:
        lines.append(f"alignment broke: {where(first)}, {first.seq} ops after the step began: "
                     f"{op_words(first)} in one run, {first.other_op} in the other (the runs' "
                     "control flow differs before any fingerprint did)")
    elif explanation.verdict == EXPLAINED:
        lines.append(f"first divergence: {where(first)}: {op_words(first)} "
                     f"({KIND_WORDS.get(first.kind, first.kind)}){read_by_words(first)}, "
                     f"{first.seq} ops after the step began")
    if first.stack:
        lines.append(f"  at {first.stack}")
    if first.detail and explanation.verdict == EXPLAINED and first.kind != "origin":
        lines.append(f"  {first.detail}")
    if first.edge is not None:
        lines.append(f"  edge: {first.edge}")
    elif mask is not None:
        lines.append(f"  edge: none ({edge_note(explanation, mask)})")
    for finding in explanation.ranks:
        if finding is first:
            continue
        if finding.coverage is not None:
            continue  # said below, with its counts
        if finding.kind is None:
            lines.append(f"rank {finding.rank}: every one of its {finding.ops_compared} ops "
                         "compared agrees")
        elif (finding.step, finding.seq, finding.op, finding.kind) == (
                first.step, first.seq, first.op, first.kind):
            lines.append(f"rank {finding.rank}: the same op")
        else:
            lines.append(f"{where(finding)}: {op_words(finding)} ({finding.kind}), "
                         f"{finding.seq} ops after the step began")
    return lines + gaps
