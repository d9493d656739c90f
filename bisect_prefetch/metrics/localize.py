"""Where a run first drifted: its digests against the reference run's, read back to a unit.

``compare_run_digests(ref_dir, run_dir, ...)`` compares the two runs' digest files, rank
by rank (each rank's digests.rank<R>.jsonl against its partner, metrics/digests.py's
lockstep walk; an older run dir's one digests.jsonl is read whole), and checks that the
comparison can be trusted: a file cut mid-line, a rank that wrote no digests, a rank two
processes wrote, a rank whose digests stop early, runs that digest different records. Each
is one sentence naming the rank in ``DigestResult.problems``; a comparison with problems
and no difference proves nothing (the caller must not call the runs consistent).

``localize(result, run_dir, units)`` names the first divergence: the step, the
FSDP unit it is read back to, one (rank, parameter) of that unit, how many units differ at
that step, and the rule that named the unit:

- ``values``: some parameter values (digested before the update, under ``NAME@value``)
  differ at that step: a prefetch that wrote into a unit's persistent shard shows in that
  unit alone, one step before the next forward spreads it everywhere. The first such unit
  in forward order is named.
- ``backward-order``: only gradients differ. Gradients are computed in backward order,
  and a corruption inside one unit's backward reaches only the units computed after it,
  so the first differing unit in that order is named. The order is the run's own (its
  order record: units in the order their backward pre-hooks ran), else the reverse of
  the graph's forward order.
- ``every-unit``: only gradients differ, and in every unit that has them: the order cannot
  tell a corruption in the first unit in backward order from a forward race (which
  corrupts an unsharded buffer every gradient depends on). The unit given is only the
  first in backward order and is no hint; `explain` names the first op that differs.

Not which parameter moved most: the first step that differs often differs everywhere
(every gradient of a model depends on every parameter), and the largest move then names
an arbitrary unit.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from bisect_prefetch.metrics.digest_files import (
    DigestFiles,
    digest_files,
    ends_mid_line,
    first_record,
    last_record,
    read_run_digests,
)
from bisect_prefetch.metrics.digests import (
    SPREAD_STEPS,
    DigestResult,
    compare_digest_files,
    compare_digests,
)
from bisect_prefetch.vocab import VALUE_SUFFIX, order_rank_file

ROOT_UNIT = "root"  # the unit of parameters no named unit holds (FSDP2's root module)
# Ranks run in lockstep within a step or two (collectives every step): reading this many
# steps past the first divergence finds every rank's records of that step.
STEPS_READ_PAST = 8
EXAMPLES_SHOWN = 2


@dataclass(frozen=True)
class Localization:
    step: int  # first step where a digest differs
    rank: int
    unit: str  # the FSDP unit holding param (ROOT_UNIT when none does)
    param: str  # a differing parameter of that unit (NAME@value: its value)
    units_differing: int  # units with a differing digest at that step, over all ranks
    rule: str = "values"  # what named the unit: "values" or "backward-order" (module doc)

    def to_json(self) -> dict:
        return asdict(self)


def unit_of(param: str, units: Iterable[str]) -> str:
    """The unit holding a parameter: the one whose module path is its longest prefix.

    A unit over several modules is named by their paths joined with '+' (adapters/fsdp2.py).
    """
    best, best_length = ROOT_UNIT, 0
    for unit in units:
        for module in unit.split("+"):
            if len(module) > best_length and (param == module or param.startswith(module + ".")):
                best, best_length = unit, len(module)
    return best


@dataclass(frozen=True)
class DigestVerdict:
    """What a run's digests say against its reference run's."""

    first_diff_step: int | None
    localization: Localization | None
    problems: list[str]  # non-empty with no difference: the digests prove nothing


def judge_digests(ref_dir: Path, run_dir: Path, *, units: Iterable[str],
                  ranks: int | None = None, metric_first_diff: int | None = None,
                  labels: tuple[str, str] = ("reference", "run")) -> DigestVerdict | None:
    """Compare a run's digests with its reference's and localize a divergence (None: no digests).

    metric_first_diff: where the metrics already differ, if they do (then only the cheap
    checks run: a divergence stands whatever else the files lack).
    """
    result = compare_run_digests(ref_dir, run_dir, labels=labels, ranks=ranks,
                                 metric_first_diff=metric_first_diff)
    if result is None:
        return None
    where = localize(result, Path(run_dir), units, ref_dir=Path(ref_dir))
    return DigestVerdict(result.first_diff_step, where, list(result.problems))


def units_in_graph(path: Path) -> list[str]:
    """Node names of a graph.json (empty when it cannot be read)."""
    try:
        graph = json.loads(Path(path).read_text())
        return [node["name"] for node in graph.get("nodes", [])]
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return []


# -- comparing two runs' digests ------------------------------------------------------------
def compare_run_digests(
    ref_dir: Path,
    run_dir: Path,
    *,
    labels: tuple[str, str] = ("reference", "run"),
    ranks: int | None = None,
    metric_first_diff: int | None = None,
    spread_steps: int = SPREAD_STEPS,
) -> DigestResult | None:
    """Compare two run dirs' digests, rank by rank; None when neither recorded any.

    ranks: the job's world size, when known: a rank missing from both runs is a problem too.
    spread_steps: differing steps analysed past the first difference (the JSON says it).
    """
    fa, fb = digest_files(ref_dir), digest_files(run_dir)
    if not fa.found and not fb.found:
        return None
    if not (fa.found and fb.found):
        missing, present = (labels[0], labels[1]) if not fa.found else (labels[1], labels[0])
        return DigestResult(
            first_diff_step=None, at_first=[], spread={}, records_compared=0,
            records_differing=0, metric_first_diff_step=metric_first_diff,
            problems=[f"{missing} wrote no gradient digests ({present} did): "
                      "its gradients cannot be compared"],
        )  # fmt: skip
    if fa.shared is not None or fb.shared is not None:
        return _compare_shared(Path(ref_dir), Path(run_dir), fa, fb, labels=labels, ranks=ranks,
                               metric_first_diff=metric_first_diff)
    return compare_rank_files(fa, fb, labels=labels, ranks=ranks,
                              metric_first_diff=metric_first_diff, spread_steps=spread_steps)


def compare_rank_files(
    fa: DigestFiles,
    fb: DigestFiles,
    *,
    labels: tuple[str, str],
    ranks: int | None,
    metric_first_diff: int | None,
    spread_steps: int = SPREAD_STEPS,
) -> DigestResult:
    """Two runs' per-rank files compared pairwise, one rank after the other.

    Memory holds one rank pair's blocks and what differs at the first differing step,
    whatever the number of ranks. Ranks are not compared in parallel: the walk runs at
    memcmp and page-cache speed, and threads would share one interpreter lock
    (benchmarks/bench_scale.py measures the walk against reading the files).
    """
    problems = _claims(fa, labels[0]) + _claims(fb, labels[1])
    total = _Total(spread_steps)
    last: dict[int, tuple[int | None, int | None]] = {}  # rank -> its last step in a, in b
    gaps: list[str] = []
    for rank in sorted(set(range(ranks or 0)) | fa.ranks.keys() | fb.ranks.keys()):
        pa, pb = fa.ranks.get(rank), fb.ranks.get(rank)
        if pa is None or pb is None:
            if pa is None and pb is None:
                problems.append(f"rank {rank} wrote no gradient digests in either run")
            else:
                lacking, having = (labels[0], labels[1]) if pa is None else (labels[1], labels[0])
                problems.append(f"rank {rank} wrote no gradient digests in {lacking} ({having} has them)")
            continue
        cut = [ends_mid_line(pa), ends_mid_line(pb)]
        problems += [f"{label}'s {path.name} ends mid-line: its last record was cut off"
                     for path, label, is_cut in zip((pa, pb), labels, cut, strict=True) if is_cut]
        result = compare_digest_files(pa, pb, spread_steps=spread_steps)
        total.add(result)
        if result.first_diff_step is None:
            ends = tuple(r.step if (r := last_record(p)) is not None else None for p in (pa, pb))
            last[rank] = ends  # type: ignore[assignment]
            gaps += _rank_gaps(rank, result, labels, cut)
    out = total.result(metric_first_diff)
    out.notes = [f"{label}'s digests are not in canonical form: the lines that differ were "
                 "parsed the slow way (json)" for label, slow in zip(labels, total.slow, strict=True) if slow]
    if out.first_diff_step is None and metric_first_diff is None:
        # No divergence: every gap is a reason the comparison proves nothing.
        problems += gaps + _stopping_early(last, labels)
    out.problems = problems
    return out


class _Total:
    """The per-rank results summed: the first step over all ranks, the (rank, param) pairs
    at it (only those: a later first step is dropped), the first spread_steps of the spread."""

    def __init__(self, spread_steps: int) -> None:
        self.spread_steps = spread_steps
        self.first: int | None = None
        self.at_first: list[tuple[int, str]] = []
        self.spread: Counter = Counter()
        self.compared = self.differing = self.missing_a = self.missing_b = 0
        self.unread = [0, 0]
        self.slow = [False, False]

    def add(self, r: DigestResult) -> None:
        self.compared += r.records_compared
        self.missing_a += r.missing_in_a
        self.missing_b += r.missing_in_b
        self.unread = [self.unread[0] + r.lines_unread[0], self.unread[1] + r.lines_unread[1]]
        self.slow = [self.slow[0] or r.noncanonical[0], self.slow[1] or r.noncanonical[1]]
        self.spread.update(r.spread)
        for step in sorted(self.spread)[self.spread_steps:]:
            del self.spread[step]  # past the bound over all ranks
        if r.first_diff_step is None:
            return
        if self.first is None or r.first_diff_step < self.first:
            self.first, self.at_first = r.first_diff_step, []
        if r.first_diff_step == self.first:
            self.at_first += r.at_first

    def result(self, metric_first_diff: int | None) -> DigestResult:
        return DigestResult(
            first_diff_step=self.first, at_first=sorted(self.at_first),
            spread=dict(sorted(self.spread.items())), records_compared=self.compared,
            records_differing=sum(self.spread.values()), missing_in_a=self.missing_a,
            missing_in_b=self.missing_b, lines_unread=(self.unread[0], self.unread[1]),
            metric_first_diff_step=metric_first_diff, spread_steps=self.spread_steps,
        )  # fmt: skip


def _claims(files: DigestFiles, label: str) -> list[str]:
    """Ranks two processes wrote as theirs, in one run: each named with both files."""
    problems = []
    for rank, extra in sorted(files.second_writers.items()):
        names = [p.name for p in [files.ranks.get(rank), *sorted(extra)] if p is not None]
        problems.append(f"rank {rank} has two writers in {label}: {' and '.join(names)}")
    for rank, path in sorted(files.ranks.items()):
        record = first_record(path)
        if record is not None and record.rank != rank:
            other = files.ranks.get(record.rank)
            also = f" (rank {record.rank}'s own file is {other.name})" if other is not None else ""
            problems.append(f"{label}'s {path.name} holds records of rank {record.rank}{also}: "
                            f"two writers claim rank {record.rank}")
    return problems


def _rank_gaps(rank: int, result: DigestResult, labels: tuple[str, str],
               cut: list[bool]) -> list[str]:
    """Why one rank's files, showing no difference, do not prove the rank's runs the same."""
    gaps = []
    only_a, only_b = ([f"{p} at step {s}" for s, _, p in side] for side in result.unpaired)
    if only_a or only_b:
        sides = [f"only in {label}: {', '.join(names)}"
                 for label, names in zip(labels, (only_a, only_b), strict=True) if names]
        gaps.append(f"rank {rank}: the runs digest different records ({'; '.join(sides)})")
    for label, unread, is_cut in zip(labels, result.lines_unread, cut, strict=True):
        if unread - is_cut > 0:  # the cut line is said already
            gaps.append(f"rank {rank}: {unread - is_cut} line(s) of {label}'s digests are no digest records")
    return gaps


def _stopping_early(last: dict[int, tuple[int | None, int | None]],
                    labels: tuple[str, str]) -> list[str]:
    """Ranks whose digests stop before the run's other ranks' (a run stopping as a whole is
    the metrics' finding, not the digests')."""
    problems = []
    for side, label in enumerate(labels):
        ends = {rank: pair[side] for rank, pair in last.items()}
        reached = max((s for s in ends.values() if s is not None), default=None)
        problems += [f"rank {rank}'s digests stop at step {step} in {label} (its other ranks "
                     f"reach step {reached})"
                     for rank, step in sorted(ends.items()) if step is not None and step < reached]
    return problems


# -- older run dirs: one digests.jsonl every rank appended to --------------------------------
def _compare_shared(ref_dir: Path, run_dir: Path, fa: DigestFiles, fb: DigestFiles, *,
                    labels: tuple[str, str], ranks: int | None,
                    metric_first_diff: int | None) -> DigestResult:
    """An older run dir against any other: the records in any order, read whole."""
    if fa.shared is not None and fb.shared is not None:
        result = compare_digest_files(fa.shared, fb.shared, metric_first_diff=metric_first_diff)
    else:
        result = compare_digests(read_run_digests(ref_dir), read_run_digests(run_dir),
                                 metric_first_diff=metric_first_diff)
    result.problems = digest_problems(ref_dir, run_dir, labels=labels, ranks=ranks, result=result)
    return result


def digest_problems(
    a: Path, b: Path, *, labels: tuple[str, str], ranks: int | None, result: DigestResult
) -> list[str]:
    """Why a comparison of these two run dirs' digests, read whole, would not prove the runs
    the same (the older run dirs' way)."""
    problems = [f"{label}'s {path.name} ends mid-line: its last record was cut off"
                for run, label in ((a, labels[0]), (b, labels[1]))
                for path in digest_files(run).paths() if ends_mid_line(path)]
    if result.first_diff_step is not None or result.metric_first_diff_step is not None:
        return problems  # a divergence stands, and a run stopped at it lacks the steps after
    gaps = result.missing_in_a + result.missing_in_b + sum(result.lines_unread)
    if not gaps:
        # The same records in both: only a rank silent in both can hide, and the first
        # steps show every rank that writes at all.
        silent = sorted(set(range(ranks or 0)) - _ranks_at_start(a))
        return problems + [f"rank {rank} wrote no gradient digests in either run" for rank in silent]
    # Only now read both files whole: which ranks and parameters each has, per step.
    seen_a, seen_b = _inventory(a), _inventory(b)
    for rank in sorted(set(range(ranks or 0)) | seen_a.ranks | seen_b.ranks):
        in_a, in_b = rank in seen_a.ranks, rank in seen_b.ranks
        if not in_a and not in_b:
            problems.append(f"rank {rank} wrote no gradient digests in either run")
        elif not (in_a and in_b):
            lacking, having = (labels[0], labels[1]) if not in_a else (labels[1], labels[0])
            problems.append(f"rank {rank} wrote no gradient digests in {lacking} ({having} has them)")
    common = seen_a.ranks & seen_b.ranks  # a silent rank is said above, not param by param
    only_a = [f"{p} on rank {r}" for r, p in sorted(seen_a.params - seen_b.params) if r in common]
    only_b = [f"{p} on rank {r}" for r, p in sorted(seen_b.params - seen_a.params) if r in common]
    if only_a or only_b:
        problems.append(
            "the runs digest different parameters: "
            f"{len(only_a)} only in {labels[0]}{_examples(only_a)}, "
            f"{len(only_b)} only in {labels[1]}{_examples(only_b)}"
        )
    elif not problems:
        unmatched = _unmatched(seen_a, seen_b, labels)
        if unmatched:
            step, rank, param, label = unmatched
            problems.append(f"{label} lacks the digest of {param} (rank {rank}) at step {step}, "
                            f"a step both runs reached")
    return problems


def _ranks_at_start(path: Path) -> set[int]:
    """The ranks with records in a digest file's first steps (ranks run in lockstep)."""
    ranks: set[int] = set()
    steps: set[int] = set()
    for record in read_run_digests(path):
        steps.add(record.step)
        if len(steps) > STEPS_READ_PAST:
            break
        ranks.add(record.rank)
    return ranks


def _examples(names: Sequence[str]) -> str:
    if not names:
        return ""
    shown = ", ".join(names[:EXAMPLES_SHOWN])
    return f" ({shown}{', ...' if len(names) > EXAMPLES_SHOWN else ''})"


@dataclass
class _Inventory:
    last_step: dict[int, int]  # rank -> its last step
    params: set[tuple[int, str]]  # (rank, param)
    keys: set[tuple[int, int, str]]  # (step, rank, param)

    @property
    def ranks(self) -> set[int]:
        return set(self.last_step)


def _inventory(path: Path) -> _Inventory:
    inv = _Inventory({}, set(), set())
    for record in read_run_digests(path):
        inv.last_step[record.rank] = max(record.step, inv.last_step.get(record.rank, 0))
        inv.params.add((record.rank, record.param))
        inv.keys.add((record.step, record.rank, record.param))
    return inv


def _unmatched(a: _Inventory, b: _Inventory,
               labels: tuple[str, str]) -> tuple[int, int, str, str] | None:
    """The first (step, rank, param) one run lacks at a step every rank of both reached."""
    last = min([*a.last_step.values(), *b.last_step.values()], default=0)
    lacking = [(*key, labels[1]) for key in a.keys - b.keys if key[0] <= last]
    lacking += [(*key, labels[0]) for key in b.keys - a.keys if key[0] <= last]
    return min(lacking, default=None)


# -- localization -----------------------------------------------------------------------------
RULE_VALUES = "values"
RULE_BACKWARD_ORDER = "backward-order"
# Every unit's gradients differ at the first differing step: a corrupted first unit in
# backward order and a forward race (an unsharded buffer, which every gradient depends on)
# look alike, so no unit is named by order (`explain` finds the first op that differs).
RULE_EVERY_UNIT = "every-unit"


def localize(result: DigestResult | None, run_dir: Path,
             units: Iterable[str], *, ref_dir: Path | None = None) -> Localization | None:
    """The first divergence of two runs' digests, read back to a unit (None: no divergence).

    run_dir: the run whose order record gives the backward order; units: the graph's units
    in forward order; ref_dir: the reference run, whose digests say which units have
    gradients (by default run_dir's).
    """
    if result is None or result.first_diff_step is None or not result.at_first:
        return None
    units = list(units)
    step = result.first_diff_step
    differing = {unit_of(p, units) for _, p in result.at_first}
    values = [(r, p) for r, p in result.at_first if p.endswith(VALUE_SUFFIX)]
    if values:
        rule, candidates = RULE_VALUES, values
        order = units
    else:
        rule, candidates = RULE_BACKWARD_ORDER, result.at_first
        order = backward_order(Path(run_dir)) or units[::-1]
    position = {unit: k for k, unit in enumerate(order)}

    def rank_in_order(pair: tuple[int, str]) -> tuple[int, int, str]:
        return (position.get(unit_of(pair[1], units), len(order)), pair[0], pair[1])

    rank, param = min(candidates, key=rank_in_order)
    if rule == RULE_BACKWARD_ORDER and len(differing) > 1 and differing >= _units_with_gradients(
            Path(ref_dir or run_dir), step, units):
        rule = RULE_EVERY_UNIT  # the order cannot tell: say so (the unit is only the first)
    return Localization(step=step, rank=rank, unit=unit_of(param, units), param=param,
                        units_differing=len(differing), rule=rule)


def _units_with_gradients(path: Path, step: int, units: list[str]) -> set[str]:
    """The units with a gradient digest at ``step`` in a run dir's first rank file or a
    digests file (read up to it)."""
    found: set[str] = set()
    for record in read_run_digests(path):
        if record.step > step + STEPS_READ_PAST:
            break
        if record.step == step and not record.param.endswith(VALUE_SUFFIX):
            found.add(unit_of(record.param, units))
    return found


def backward_order(run_dir: Path) -> list[str]:
    """Units in the order their backward pre-hooks ran, from a run's order record (rank 0's
    first recorded step with a backward); empty without one."""
    for path in sorted(Path(run_dir).glob(order_rank_file("*"))):
        try:
            with open(path, encoding="utf-8") as f:
                for line in f:
                    events = json.loads(line).get("events") or []
                    order = [e[1] for e in events if e[:1] == ["use"] and e[2:3] == ["bwd"]]
                    if order:
                        return list(dict.fromkeys(order))
        except (OSError, ValueError, AttributeError, TypeError):
            continue
    return []


# -- the heat map's data ------------------------------------------------------------------------
STEPS_BEFORE = 3  # steps shown before the first divergence
STEPS_SHOWN = 40


def unit_step_differences(
    ref_path: Path, run_path: Path, units: Iterable[str], *, around: int | None = None
) -> tuple[list[str], list[int], dict[tuple[str, int], int]]:
    """Units, steps, and (unit, step) -> differing digest records, for the heat map.

    ref_path, run_path: two run dirs (or two digest files).
    Units come in the given (graph) order, then any other unit the parameters fall in.
    Steps: STEPS_SHOWN from a few before `around` (the first divergence), else from the start.
    """
    units = list(units)
    low = max(1, around - STEPS_BEFORE) if around is not None else 0
    high = low + STEPS_SHOWN - 1 if around is not None else None

    def window(path: Path) -> Iterable:
        for record in read_run_digests(path):
            if record.step >= low and (high is None or record.step <= high):
                yield record

    reference = {(r.step, r.rank, r.param): r.digest for r in window(ref_path)}
    counts: dict[tuple[str, int], int] = defaultdict(int)
    steps: set[int] = set()
    found: dict[str, None] = {}
    for record in window(run_path):
        expected = reference.get((record.step, record.rank, record.param))
        if expected is None:
            continue
        steps.add(record.step)
        unit = unit_of(record.param, units)
        found[unit] = None
        if expected != record.digest:
            counts[(unit, record.step)] += 1
    ordered = [u for u in units if u in found] + [u for u in found if u not in units]
    steps_shown = sorted(steps)[:STEPS_SHOWN]
    return ordered, steps_shown, dict(counts)
