"""Comparing runs: two trajectories, a group of runs, a run in flight against a reference.

Equality is bitwise: two values are the same only if their float64 bits are, except that
every NaN equals every NaN at the same step (so 0.0 and -0.0 differ, NaN and 1.0 differ).
Statistics are over the steps both runs have (the common steps), on |a - b|:

- a step whose values are the same counts 0; an infinity against anything else counts inf;
- NaN against a number is a difference (counted in steps_differing) of no known size:
  mae, p95 and max_abs are then NaN, never a number that looks like agreement
  (``nan_mismatches`` counts such steps);
- p95 is numpy's default (linear interpolation) percentile;
- steps only one run has are reported (missing_in_a / missing_in_b and the first such
  step), never dropped silently.

In JSON the statistics stay floats, so an infinite one is written as Python's json writes
it (Infinity), like the recorder's NaN/Infinity tokens.

A metric's ``first_diff_step`` is the earliest differing step on any rank both runs have
(``first_diff_rank`` says which). Its top-level statistics are over the metrics rank
(``rank``); ``per_rank`` holds the same statistics for every rank both runs logged it on, so
a run that diverged on another rank first shows that rank's numbers too.

A comparison where one run stops before the other (fewer steps, or a last line cut off
mid-write) is ``truncated``: `compare` reports it as a finding unless told to compare the
common prefix on purpose.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import combinations
from pathlib import Path

import numpy as np

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.metrics.completeness import step_ranges, unlike_ranks
from bisect_prefetch.metrics.digests import DigestResult
from bisect_prefetch.metrics.lines import parse_jsonl_line
from bisect_prefetch.metrics.loading import load_runs
from bisect_prefetch.metrics.localize import compare_run_digests
from bisect_prefetch.metrics.trajectory import EMPTY_SERIES, Series, Trajectory


def same_bits(a: float, b: float) -> bool:
    """Bitwise equality of two floats, with every NaN equal to every NaN."""
    if a == b:
        return a != 0.0 or math.copysign(1.0, a) == math.copysign(1.0, b)
    return a != a and b != b


@dataclass
class MetricDiff:
    """How one metric of run B differs from run A."""

    name: str
    first_diff_step: int | None
    mae: float | None  # None when no step could be compared
    p95: float | None
    max_abs: float | None
    steps_compared: int
    steps_differing: int
    missing_in_a: int = 0  # steps run B has and run A lacks
    missing_in_b: int = 0
    first_missing_in_a: int | None = None
    first_missing_in_b: int | None = None
    nan_mismatches: int = 0
    first_diff_rank: int | None = None
    rank_first_diff: dict[int, int] = field(default_factory=dict)  # every rank that differs
    rank: int | None = None  # the rank of the top-level statistics (the metrics rank)
    per_rank: dict[int, MetricDiff] = field(default_factory=dict)  # every rank both runs logged

    @property
    def differs(self) -> bool:
        return self.first_diff_step is not None

    @property
    def complete(self) -> bool:
        """Both runs have the same steps (neither stopped early nor skipped any)."""
        return self.missing_in_a == 0 and self.missing_in_b == 0

    def stats_json(self) -> dict:
        """The statistics alone (what per_rank holds for each rank)."""
        return {
            "first_diff_step": self.first_diff_step,
            "mae": self.mae,
            "p95": self.p95,
            "max_abs": self.max_abs,
            "steps_compared": self.steps_compared,
            "steps_differing": self.steps_differing,
        }

    def to_json(self) -> dict:
        return {
            **self.stats_json(),
            "missing_in_a": self.missing_in_a,
            "missing_in_b": self.missing_in_b,
            "first_missing_in_a": self.first_missing_in_a,
            "first_missing_in_b": self.first_missing_in_b,
            "nan_mismatches": self.nan_mismatches,
            "first_diff_rank": self.first_diff_rank,
            "rank_first_diff": {str(r): s for r, s in sorted(self.rank_first_diff.items())},
            "rank": self.rank,
            "per_rank": {str(r): d.stats_json() for r, d in sorted(self.per_rank.items())},
        }


def _p95(d: np.ndarray) -> float:
    if not np.isinf(d).any():
        return float(np.percentile(d, 95))
    # numpy's interpolation gives NaN next to inf; the same rule, with inf kept.
    d = np.sort(d)
    k = 0.95 * (len(d) - 1)
    lo, hi = math.floor(k), math.ceil(k)
    if lo == hi or d[lo] == d[hi]:
        return float(d[lo])
    if math.isinf(d[hi]):
        return math.inf
    return float(d[lo] + (d[hi] - d[lo]) * (k - lo))


def _align(a: Series, b: Series) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Common steps and both runs' values there."""
    if len(a.steps) == len(b.steps) and np.array_equal(a.steps, b.steps):
        return a.steps, a.values, b.values
    common, ia, ib = np.intersect1d(a.steps, b.steps, assume_unique=True, return_indices=True)
    return common, a.values[ia], b.values[ib]


def _differing(va: np.ndarray, vb: np.ndarray) -> np.ndarray:
    same_bits_ = va.view(np.int64) == vb.view(np.int64)
    return ~(same_bits_ | (np.isnan(va) & np.isnan(vb)))


def first_diff(a: Series, b: Series) -> int | None:
    """The first common step where a and b are not bitwise equal."""
    common, va, vb = _align(a, b)
    differ = _differing(va, vb)
    return int(common[np.argmax(differ)]) if differ.any() else None


def compare_series(a: Series, b: Series, name: str = "") -> MetricDiff:
    """Compare one metric's series of run A and run B."""
    common, va, vb = _align(a, b)
    differ = _differing(va, vb)
    n_differ = int(differ.sum())
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(va - vb)
    d[~differ] = 0.0
    sized = d[~np.isnan(d)]
    mae = p95 = max_abs = None
    if len(sized) < len(d):  # a NaN against a number: a difference of no known size
        mae = p95 = max_abs = math.nan
    elif len(sized):
        with np.errstate(invalid="ignore", over="ignore"):
            mae = float(np.mean(sized))
        p95 = _p95(sized)
        max_abs = float(np.max(sized))
    diff = MetricDiff(
        name=name,
        first_diff_step=int(common[np.argmax(differ)]) if n_differ else None,
        mae=mae,
        p95=p95,
        max_abs=max_abs,
        steps_compared=len(common),
        steps_differing=n_differ,
        missing_in_a=len(b) - len(common),
        missing_in_b=len(a) - len(common),
        nan_mismatches=int(len(d) - len(sized)),
    )
    if diff.missing_in_a:
        diff.first_missing_in_a = int(np.setdiff1d(b.steps, common, assume_unique=True)[0])
    if diff.missing_in_b:
        diff.first_missing_in_b = int(np.setdiff1d(a.steps, common, assume_unique=True)[0])
    return diff


def compare_trajectories(
    a: Trajectory, b: Trajectory, names: Sequence[str] | None = None
) -> dict[str, MetricDiff]:
    """Compare each metric of two runs (default: every metric either run has).

    Top-level statistics come from the metrics rank, per_rank from every rank both runs
    have; first_diff_step is the earliest difference on any of them.
    """
    if names is None:
        names = list(dict.fromkeys([*a, *b]))
    out: dict[str, MetricDiff] = {}
    for name in names:
        diff = compare_series(a.get(name, EMPTY_SERIES), b.get(name, EMPTY_SERIES), name)
        diff.rank = a.series_rank.get(name, b.series_rank.get(name))
        for rank in a.ranks_with(name):
            if name not in b.per_rank.get(rank, {}):
                continue
            if rank == a.series_rank.get(name) and rank == b.series_rank.get(name):
                per_rank = replace(diff)  # the top-level statistics are this rank's
            else:
                per_rank = compare_series(a.per_rank[rank][name], b.per_rank[rank][name], name)
            diff.per_rank[rank] = per_rank
            if per_rank.first_diff_step is not None:
                diff.rank_first_diff[rank] = per_rank.first_diff_step
        if diff.first_diff_step is not None and diff.rank not in diff.rank_first_diff:
            diff.rank_first_diff[diff.rank] = diff.first_diff_step  # the ranks' metrics ranks differ
        if diff.rank_first_diff:
            rank, step = min(diff.rank_first_diff.items(), key=lambda rs: (rs[1], rs[0]))
            diff.first_diff_step, diff.first_diff_rank = step, rank
        out[name] = diff
    return out


def earliest(diffs: Mapping[str, MetricDiff]) -> tuple[int, str] | None:
    """(step, metric) of the earliest difference over all metrics, None if none differ."""
    found = [(d.first_diff_step, n) for n, d in diffs.items() if d.first_diff_step is not None]
    return min(found) if found else None


# --------------------------------------------------------------------------- groups


@dataclass
class PairResult:
    a: int  # indexes into the group
    b: int
    metrics: dict[str, MetricDiff]

    @property
    def first_diff_step(self) -> int | None:
        found = earliest(self.metrics)
        return found[0] if found else None


@dataclass
class GroupResult:
    """All pairs of k runs under one mask: k(k-1)/2 comparisons for the cost of k runs."""

    runs: int
    pairs: list[PairResult]

    @property
    def diverged(self) -> bool:
        return any(p.first_diff_step is not None for p in self.pairs)

    @property
    def first(self) -> tuple[int, PairResult, str] | None:
        """(step, pair, metric) of the earliest difference in the group."""
        best = None
        for pair in self.pairs:
            found = earliest(pair.metrics)
            if found and (best is None or found[0] < best[0]):
                best = (found[0], pair, found[1])
        return best

    @property
    def first_diff_step(self) -> int | None:
        return self.first[0] if self.first else None

    @property
    def first_pair(self) -> tuple[int, int] | None:
        return (self.first[1].a, self.first[1].b) if self.first else None

    def to_json(self) -> dict:
        first = self.first
        return {
            "runs": self.runs,
            "diverged": self.diverged,
            "first_diff_step": first[0] if first else None,
            "first_pair": [first[1].a, first[1].b] if first else None,
            "first_metric": first[2] if first else None,
            "pairs": [
                {
                    "a": p.a,
                    "b": p.b,
                    "first_diff_step": p.first_diff_step,
                    "metrics": {n: d.to_json() for n, d in p.metrics.items()},
                }
                for p in self.pairs
            ],
        }


def compare_group(trajectories: Sequence[Trajectory], names: Sequence[str] | None = None) -> GroupResult:
    """Compare every pair of runs; the group diverged if any pair differs."""
    pairs = [
        PairResult(i, j, compare_trajectories(trajectories[i], trajectories[j], names))
        for i, j in combinations(range(len(trajectories)), 2)
    ]
    return GroupResult(len(trajectories), pairs)


# --------------------------------------------------------------------------- early stop


class StreamingComparator:
    """Compares a run in flight, as its values arrive, against a reference trajectory.

    Values come one record at a time (feed, feed_line: the recorder's jsonl) or as columns
    of one rank and metric (feed_columns: what a console parser read from new lines). The
    first differing step is known as soon as a value differs from the reference at the same
    rank, metric and step (bitwise, NaN equal to NaN); once a difference is seen it keeps
    the earliest one. Values at steps, ranks or of metrics the reference lacks cannot be
    compared and are counted in ``unmatched``; metrics outside `names` are ignored. Other
    evidence (a gradient digest that differs) is noted with note_diff.
    """

    def __init__(self, reference: Trajectory, names: Iterable[str] | None = None):
        wanted = set(names) if names is not None else None
        self._names = wanted
        self._ref: dict[tuple[int, str], Series] = {
            (rank, name): s
            for rank, metrics in reference.per_rank.items()
            for name, s in metrics.items()
            if wanted is None or name in wanted
        }
        self.first_diff_step: int | None = None
        self.first_diff: tuple[int, str] | None = None  # (rank, metric)
        self.first_digest_diff_step: int | None = None
        # A reference that logs a step more than once (several ranks into one log without
        # ranks, a resumed run) is read with the last value per step: then a step is
        # compared only once a later one arrives, so the live verdict is the final one's.
        self._defer = reference.steps_repeated > 0
        self._pending: dict[tuple[int, str], tuple[int, float]] = {}
        self.lines_fed = 0
        self.lines_unread = 0
        self.unmatched = 0
        self.last_step = 0  # the highest step fed

    @property
    def diverged(self) -> bool:
        return self.first_diff_step is not None

    def note_diff(self, step: int, rank: int, what: str) -> None:
        """Record a difference found elsewhere (e.g. a gradient digest)."""
        if self.first_diff_step is None or step < self.first_diff_step:
            self.first_diff_step, self.first_diff = step, (rank, what)

    def note_digest_diff(self, step: int, rank: int, param: str) -> None:
        """A gradient digest that differs from the reference's."""
        self.note_diff(step, rank, f"digest of {param}")
        if self.first_digest_diff_step is None or step < self.first_digest_diff_step:
            self.first_digest_diff_step = step

    def feed(self, rank: int, step: int, metrics: Mapping[str, float]) -> int | None:
        self.lines_fed += 1
        self.last_step = max(self.last_step, step)
        for name, value in metrics.items():
            if self._names is not None and name not in self._names:
                continue
            if self._defer:
                pending = self._pending.get((rank, name))
                self._pending[rank, name] = (step, value)
                if pending is None or pending[0] == step:
                    continue
                step, value = pending
            ref = self._ref.get((rank, name))
            try:
                expected = ref[step] if ref is not None else None
            except KeyError:
                expected = None
            if expected is None:
                self.unmatched += 1
            elif not same_bits(value, expected):
                self.note_diff(step, rank, name)
        return self.first_diff_step

    def feed_columns(self, rank: int, name: str, steps: np.ndarray, values: np.ndarray) -> int | None:
        """Many steps of one rank and metric at once (vectorized)."""
        if len(steps) == 0 or (self._names is not None and name not in self._names):
            return self.first_diff_step
        self.last_step = max(self.last_step, int(steps.max()))
        if self._defer:
            if (pending := self._pending.get((rank, name))) is not None:
                steps, values = np.append(pending[0], steps), np.append(pending[1], values)
            # the last value per step, in the order the steps came; the newest step waits
            last = np.append(steps[1:] != steps[:-1], True)
            steps, values = steps[last], values[last]
            self._pending[rank, name] = (int(steps[-1]), float(values[-1]))
            steps, values = steps[:-1], values[:-1]
            if len(steps) == 0:
                return self.first_diff_step
        ref = self._ref.get((rank, name))
        if ref is None:
            self.unmatched += len(steps)
            return self.first_diff_step
        at = np.searchsorted(ref.steps, steps)
        inside = at < len(ref.steps)
        found = np.zeros(len(steps), dtype=bool)
        found[inside] = ref.steps[at[inside]] == steps[inside]
        self.unmatched += int(len(steps) - found.sum())
        differ = _differing(values[found], ref.values[at[found]])
        if differ.any():
            self.note_diff(int(steps[found][differ].min()), rank, name)
        return self.first_diff_step

    def feed_line(self, line: str | bytes) -> int | None:
        """Feed one line of a metrics.jsonl being written; unreadable lines are counted."""
        record = parse_jsonl_line(line)
        if record is None:
            if line.strip():
                self.lines_unread += 1
            return self.first_diff_step
        return self.feed(*record)


# --------------------------------------------------------------------------- the compare command


@dataclass
class Truncation:
    """One run stops before the other: where their common part ends and where each stops.

    last_common_step is the last step every rank and metric compared has in both runs;
    cut_mid_line names, per side, a file whose last line was cut off mid-write.
    """

    last_common_step: int | None
    last_step: dict[str, int | None]  # "a", "b"
    cut_mid_line: dict[str, tuple[str, int, str]] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "last_common_step": self.last_common_step,
            "last_step": dict(self.last_step),
            "cut_mid_line": {side: {"file": f, "line": n, "text": t} for side, (f, n, t) in self.cut_mid_line.items()},
        }


def _ends(trajectory: Trajectory, names: Sequence[str]) -> dict[tuple[int, str], int]:
    return {
        (rank, name): int(s.steps[-1])
        for rank, metrics in trajectory.per_rank.items()
        for name, s in metrics.items()
        if name in names and len(s)
    }


def find_truncation(a: Trajectory, b: Trajectory, names: Sequence[str]) -> Truncation | None:
    """None when both runs end at the same step on every rank and metric and neither log
    stops mid-line."""
    ends_a, ends_b = _ends(a, names), _ends(b, names)
    cut = {side: t.cut_mid_line[0] for side, t in (("a", a), ("b", b)) if t.cut_mid_line}
    if ends_a == ends_b and not cut:
        return None
    both = ends_a.keys() & ends_b.keys()
    return Truncation(
        last_common_step=min((min(ends_a[k], ends_b[k]) for k in both), default=None),
        last_step={"a": max(ends_a.values(), default=None), "b": max(ends_b.values(), default=None)},
        cut_mid_line=cut,
    )


@dataclass
class CompareResult:
    a: str
    b: str
    metrics: dict[str, MetricDiff]
    digests: DigestResult | None
    lines_unread: tuple[int, int] = (0, 0)
    unread_samples: list[tuple[str, int, str]] = field(default_factory=list)
    truncation: Truncation | None = None
    allow_truncated: bool = False  # compare the common prefix on purpose
    steps_repeated: tuple[int, int] = (0, 0)
    # steps, ranks or metrics one run logs and the other lacks, other than where one stops
    gaps: str | None = None

    @property
    def finding(self) -> bool:
        """What makes `compare` exit 1: a difference, a run that stops before the other, a
        step, rank or metric only one run logs, or digests that cannot vouch for the runs
        (never a false "identical")."""
        unvouched = bool(self.digests and self.digests.problems)
        return (self.differs or unvouched or self.gaps is not None
                or (self.truncation is not None and not self.allow_truncated))

    @property
    def first_diff_step(self) -> int | None:
        found = earliest(self.metrics)
        return found[0] if found else None

    @property
    def differs(self) -> bool:
        return self.first_diff_step is not None or bool(self.digests and self.digests.first_diff_step is not None)

    def to_json(self) -> dict:
        return {
            "a": self.a,
            "b": self.b,
            "metrics": {n: d.to_json() for n, d in self.metrics.items()},
            "digests": self.digests.to_json() if self.digests else None,
            "first_diff_step": self.first_diff_step,
            "lines_unread": {"a": self.lines_unread[0], "b": self.lines_unread[1]},
            "steps_repeated": {"a": self.steps_repeated[0], "b": self.steps_repeated[1]},
            "truncated": self.truncation.to_json() if self.truncation else None,
            "allow_truncated": self.allow_truncated,
            "gaps": self.gaps,
        }


def compare_paths(
    a: str | Path,
    b: str | Path,
    fmt: str | None = None,
    names: Sequence[str] | None = None,
    *,
    pattern: str | None = None,
    allow_truncated: bool = False,
) -> CompareResult:
    """`bisect-prefetch compare A B`: two run directories or two log files.

    The format is detected unless given. Gradient digests are compared when both are run
    directories with digest files (digests.rank<R>.jsonl, or an older run dir's
    digests.jsonl). A run that stops before the other is a finding (truncation) unless
    allow_truncated: then the common prefix is what counts.
    """
    a, b = Path(a), Path(b)
    ta, tb = load_runs([a, b], fmt, names, pattern=pattern)
    metrics = compare_trajectories(ta, tb, names)
    if not metrics:
        raise BisectPrefetchError(f"no metric in common to compare between {a} and {b}")
    digests = None
    found = earliest(metrics)
    if a.is_dir() and b.is_dir():  # with the checks of metrics/localize.py (cut, silent rank, ...)
        digests = compare_run_digests(a, b, labels=("a", "b"),
                                      metric_first_diff=found[0] if found else None)
    return CompareResult(
        a=str(a),
        b=str(b),
        metrics=metrics,
        digests=digests,
        lines_unread=(ta.lines_unread, tb.lines_unread),
        unread_samples=ta.unread_samples + tb.unread_samples,
        truncation=find_truncation(ta, tb, list(metrics)),
        allow_truncated=allow_truncated,
        steps_repeated=(ta.steps_repeated, tb.steps_repeated),
        gaps=_gaps(ta, tb, metrics),
    )


def _gaps(a: Trajectory, b: Trajectory, metrics: Mapping[str, MetricDiff]) -> str | None:
    """Steps inside both runs' range, ranks or metrics that only one run logs."""
    problems = []
    for name, diff in metrics.items():
        for rank in diff.per_rank or [None]:  # every rank both log, else the metrics rank
            where = name if rank is None else f"rank {rank} {name}"
            sa = a.get(name) if rank is None else a.per_rank[rank][name]
            sb = b.get(name) if rank is None else b.per_rank[rank][name]
            for side, have, lack in (("B", sa, sb), ("A", sb, sa)):
                if have is None or lack is None or not len(lack):
                    continue
                inside = have.steps[have.steps <= lack.steps[-1]]
                missing = np.setdiff1d(inside, lack.steps)
                if len(missing):
                    problems.append(f"{side} lacks step(s) {step_ranges(missing.tolist())} of {where}")
    if (ranks := unlike_ranks(a, b, list(metrics))) is not None:
        problems.append(ranks.replace("the reference", "the other run"))
    for name in metrics:
        if (name in a) != (name in b):
            problems.append(f"{name} only in {'A' if name in a else 'B'}")
    return "; ".join(dict.fromkeys(problems)) if problems else None
