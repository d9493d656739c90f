"""Matrix cells built from a bisection's verdict (a matrix file's `cells_from: bisect.json`).

Each cause the verdict names is dropped alone (drop-only of its set), and all of them at once
(drop-only of their union). Dropped alone, a cause leaves the others on, so the cell is expected
to diverge when there are others; with every cause dropped, the runs are expected consistent.
The sets come from `culprit_sets`, or from `minimal_set` in a bisect.json written before the
search named several causes (its per-run chance then from `calibration`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.vocab import CONSISTENT, DIVERGED, DROP_ONLY, quote_edges

DEFAULT_RUNS = 4  # a cell's runs where the verdict gives no per-run chance
MAX_RUNS = 12
MISS = 0.05  # the chance a cause of the verdict's per-run chance stays unseen in a cell's runs
ALL_DROPPED = "all-causes-dropped"


class CulpritSet:
    """One cause of the verdict: its edge ids, and the per-run chance the search measured."""

    def __init__(self, edges: list[str], per_run_chance: float | None) -> None:
        self.edges = edges
        self.per_run_chance = per_run_chance


def read_culprit_sets(path: Path, experiment_name: str) -> list[CulpritSet]:
    """The causes a bisect.json names; one line of why where it names none or is not one."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise BisectPrefetchError(f"cells_from {path}: not a readable bisect.json ({exc})") from None
    if not isinstance(data, dict):
        raise BisectPrefetchError(f"cells_from {path}: not a bisect.json (no JSON object)")
    named = data.get("experiment")
    if named is not None and named != experiment_name:
        raise BisectPrefetchError(f"cells_from {path}: a bisection of experiment {named!r}, "
                                  f"not of this matrix's {experiment_name!r}")
    if "culprit_sets" in data:
        sets = [_culprit_set(path, entry) for entry in _list(path, data["culprit_sets"])]
    else:
        edges = _edge_ids(path, data.get("minimal_set", []))
        calibration = data.get("calibration")
        chance = calibration.get("per_run_chance") if isinstance(calibration, dict) else None
        sets = [CulpritSet(edges, _chance(path, chance))] if edges else []
    if not sets or not all(s.edges for s in sets):
        raise BisectPrefetchError(
            f"cells_from {path}: the verdict ({data.get('verdict', 'none')}) names no culprit set, "
            "so there is nothing to drop")
    return sets


def verdict_shortfall(path: Path) -> str | None:
    """Why the verdict a bisect.json holds falls short of what was asked (its confidence
    below the one asked: `confidence_met` false), or None. A cell built from such a verdict
    cannot meet its expectation: CI must see that the verdict was never reached."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None  # read_culprit_sets says why
    if not isinstance(data, dict) or data.get("confidence_met", True) is not False:
        return None
    return (f"the verdict it checks ({data.get('verdict')}) holds at confidence "
            f"{data.get('confidence', 0):.3f}, below the {data.get('confidence_asked')} asked")


def _list(path: Path, value: Any) -> list:
    if not isinstance(value, list):
        raise BisectPrefetchError(f"cells_from {path}: culprit_sets is not a list")
    return value


def _culprit_set(path: Path, entry: Any) -> CulpritSet:
    if not isinstance(entry, dict):
        raise BisectPrefetchError(f"cells_from {path}: a culprit set is not an object: {entry!r}")
    return CulpritSet(_edge_ids(path, entry.get("edges")), _chance(path, entry.get("per_run_chance")))


def _chance(path: Path, chance: Any) -> float | None:
    if chance is not None and not (isinstance(chance, (int, float)) and 0 < chance <= 1):
        raise BisectPrefetchError(f"cells_from {path}: per_run_chance {chance!r} is not in (0, 1]")
    return chance


def _edge_ids(path: Path, value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(e, str) and e for e in value):
        raise BisectPrefetchError(f"cells_from {path}: edges must be a list of edge ids, "
                                  f"not {value!r}")
    return list(value)


def runs_to_see(chances: list[float | None]) -> int:
    """Runs enough that the weakest cause, at the per-run chance measured, shows but for MISS."""
    known = [c for c in chances if c is not None]
    if not known:
        return DEFAULT_RUNS
    weakest = min(known)
    if weakest >= 1:
        return 2
    return max(2, min(MAX_RUNS, math.ceil(math.log(MISS) / math.log(1 - weakest))))


def verdict_cells(sets: list[CulpritSet]) -> list[dict[str, Any]]:
    """The cells, as a matrix file would list them: each cause dropped alone (when there are
    several), then every cause dropped."""
    cells = []
    if len(sets) > 1:
        for number, dropped in enumerate(sets, start=1):
            others = [s.per_run_chance for s in sets if s is not dropped]
            cells.append({"name": f"cause-{number}-dropped",
                          "mask": f"{DROP_ONLY}:" + quote_edges(dropped.edges),
                          "runs": runs_to_see(others), "expect": DIVERGED})
    union = list(dict.fromkeys(e for s in sets for e in s.edges))
    cells.append({"name": ALL_DROPPED, "mask": f"{DROP_ONLY}:" + quote_edges(union),
                  "runs": runs_to_see([s.per_run_chance for s in sets]), "expect": CONSISTENT})
    return cells
