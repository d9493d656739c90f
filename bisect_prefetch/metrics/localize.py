"""Where a run first drifted: its digests against the reference run's, read back to a unit.

``compare_run_digests(ref_dir, run_dir, ...)`` compares the two runs' digests.jsonl and
checks that the comparison can be trusted: a file cut mid-line, a rank that wrote no
digests, runs that digest different parameters, records one run lacks up to a step both
reached. Each is one sentence in ``DigestResult.problems``; a comparison with problems and
no difference proves nothing (the caller must not call the runs consistent).

``localize(result, ref_path, run_path, units)`` names the first divergence: the step, the
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
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from bisect_prefetch.metrics.digests import (
    DigestResult,
    compare_digest_files,
    read_digests,
)
from bisect_prefetch.vocab import VALUE_SUFFIX

DIGEST_FILE = "digests.jsonl"
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
    where = localize(result, Path(ref_dir) / DIGEST_FILE, Path(run_dir) / DIGEST_FILE, units)
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
) -> DigestResult | None:
    """Compare two run dirs' digests; None when neither recorded any.

    ranks: the job's world size, when known: a rank missing from both runs is a problem too.
    """
    a, b = Path(ref_dir) / DIGEST_FILE, Path(run_dir) / DIGEST_FILE
    if not a.is_file() and not b.is_file():
        return None
    if not (a.is_file() and b.is_file()):
        missing, present = (labels[0], labels[1]) if not a.is_file() else (labels[1], labels[0])
        return DigestResult(
            first_diff_step=None, at_first=[], spread={}, records_compared=0,
            records_differing=0, metric_first_diff_step=metric_first_diff,
            problems=[f"{missing} wrote no gradient digests ({present} did): "
                      "its gradients cannot be compared"],
        )  # fmt: skip
    result = compare_digest_files(a, b, metric_first_diff=metric_first_diff)
    result.problems = digest_problems(a, b, labels=labels, ranks=ranks, result=result)
    return result


def digest_problems(
    a: Path, b: Path, *, labels: tuple[str, str], ranks: int | None, result: DigestResult
) -> list[str]:
    """Why a comparison of these two digest files would not prove the runs the same."""
    problems = [f"{label}'s digests.jsonl ends mid-line: its last record was cut off"
                for path, label in ((a, labels[0]), (b, labels[1])) if _ends_mid_line(path)]
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
    for record in read_digests(path):
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


def _ends_mid_line(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(0, 2)
        if f.tell() == 0:
            return False
        f.seek(-1, 2)
        return f.read(1) != b"\n"


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
    for record in read_digests(path):
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


def localize(result: DigestResult | None, ref_path: Path, run_path: Path,
             units: Iterable[str]) -> Localization | None:
    """The first divergence of two runs' digests, read back to a unit (None: no divergence).

    units: the graph's units in forward order.
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
        order = backward_order(Path(run_path).parent) or units[::-1]
    position = {unit: k for k, unit in enumerate(order)}

    def rank_in_order(pair: tuple[int, str]) -> tuple[int, int, str]:
        return (position.get(unit_of(pair[1], units), len(order)), pair[0], pair[1])

    rank, param = min(candidates, key=rank_in_order)
    if rule == RULE_BACKWARD_ORDER and len(differing) > 1 and differing >= _units_with_gradients(
            ref_path, step, units):
        rule = RULE_EVERY_UNIT  # the order cannot tell: say so (the unit is only the first)
    return Localization(step=step, rank=rank, unit=unit_of(param, units), param=param,
                        units_differing=len(differing), rule=rule)


def _units_with_gradients(path: Path, step: int, units: list[str]) -> set[str]:
    """The units with a gradient digest at ``step`` in a digests file (read up to it)."""
    found: set[str] = set()
    for record in read_digests(path):
        if record.step > step + STEPS_READ_PAST:
            break
        if record.step == step and not record.param.endswith(VALUE_SUFFIX):
            found.add(unit_of(record.param, units))
    return found


def backward_order(run_dir: Path) -> list[str]:
    """Units in the order their backward pre-hooks ran, from a run's order record (rank 0's
    first recorded step with a backward); empty without one."""
    for path in sorted(Path(run_dir).glob("order.rank*.jsonl")):
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

    Units come in the given (graph) order, then any other unit the parameters fall in.
    Steps: STEPS_SHOWN from a few before `around` (the first divergence), else from the start.
    """
    units = list(units)
    low = max(1, around - STEPS_BEFORE) if around is not None else 0
    high = low + STEPS_SHOWN - 1 if around is not None else None

    def window(path: Path) -> Iterable:
        for record in read_digests(path):
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
