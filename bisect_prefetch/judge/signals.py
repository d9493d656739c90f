"""What a run measured: the signals its records hold, said once per command and kept per run.

A run's signals (``run_signals(run_dir, ...)``, journaled with the run and in status.json):

- ``step_source``: where the adapter found step boundaries (adapters/steps.py:
  ``optimizer``, ``backward``, ``report``), or None (no adapter, or no boundary found);
  ``steps_counted``: per rank, how many training steps it counted;
- ``digests``: gradient and value digests (parameters, gradients, ranks, steps, coverage,
  and ``nothing_digested``: ``[{"rank", "reason"}]``, the ranks that digested no tensor at
  some step they digested, or took no digest while others did), or None;
- ``order_steps``: steps of unit order recorded (rank 0);
- ``step_time``: whether step times were recorded;
- ``precision``: per metric, the precision the job printed it at (metrics/precision.py);
- ``notes``: what the adapter said about the job's steps (an optimizer stepping twice, ...);
- ``stress``: None for a run without stress; else the delays before prefetches were issued
  (adapters/stress.py), summed over ranks: ``delays``, ``delay_total_ms``,
  ``delay_median_ms`` (the largest rank median), per edge (``edges``: delays, total,
  gap and whether it was measured), ``no_window_edges`` (prefetches that finished
  before they returned: nothing to widen) and ``notes``.

``signal_problems(signals)`` is what makes a run an error: ranks that counted different
numbers of steps. ``describe_signals`` is the command's one line; ``identical_wording``
says how far "identical" goes for the runs it covers.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bisect_prefetch.judge.audit import read_probe
from bisect_prefetch.metrics.precision import (
    AS_PRINTED,
    FULL,
    describe_precision,
    printed_precision,
)
from bisect_prefetch.metrics.trajectory import bounded_lines
from bisect_prefetch.vocab import (
    SHARED_DIGESTS_FILE,
    VALUE_SUFFIX,
    order_rank_file,
    probe_rank_file,
)


def _probes(run_dir: Path) -> dict[int, dict[str, Any]]:
    probes = {}
    for path in Path(run_dir).glob(probe_rank_file("*")):
        rank = path.name[len("probe.rank"):-len(".json")]
        if not rank.isdigit():
            continue
        probe, _ = read_probe(path)  # an unreadable one makes the run an error (judge/merge.py)
        if probe is not None:
            probes[int(rank)] = probe
    return probes


def _order_steps(run_dir: Path) -> int:
    path = Path(run_dir) / order_rank_file(0)
    try:
        with open(path, "rb") as f:
            return sum(1 for line in bounded_lines(f) if line is not None and line.strip())
    except OSError:
        return 0


def _digests_from_file(path: Path) -> dict[str, Any] | None:
    """What a digest file holds, where no probe summed it up (a job writing its own)."""
    params: set[str] = set()
    ranks: set[int] = set()
    try:
        with open(path, "rb") as f:
            for number, line in enumerate(bounded_lines(f)):
                if number >= 10_000:
                    break
                if line is None:
                    continue
                try:
                    record = json.loads(line)
                    params.add(str(record["param"]))
                    ranks.add(int(record["rank"]))
                except (ValueError, KeyError, TypeError):
                    continue
    except OSError:
        return None
    if not params:
        return None
    gradients = {p for p in params if not p.endswith(VALUE_SUFFIX)}
    values = len(params) - len(gradients)
    return {"parameters": values, "gradients": len(gradients), "ranks": len(ranks),
            "steps": None, "coverage": "as the job wrote them", "values": bool(values)}


def run_signals(run_dir: Path, *, metric_files: Sequence[Path], fmt: str,
                names: Sequence[str], pattern: str | None = None) -> dict[str, Any]:
    """The signals of one finished run (see the module docstring)."""
    probes = _probes(run_dir)
    sources = [p.get("step_source") for p in probes.values() if p.get("step_source")]
    digest_ranks = {r: p["digests"] for r, p in probes.items() if isinstance(p.get("digests"), dict)}
    digests = None
    if digest_ranks:
        summaries = list(digest_ranks.values())
        digests = {
            "parameters": max(int(s.get("parameters", 0)) for s in summaries),
            "gradients": max(int(s.get("gradients", 0)) for s in summaries),
            "ranks": len(digest_ranks),
            "steps": max(int(s.get("steps", 0)) for s in summaries),
            "coverage": summaries[0].get("coverage", "every element"),
            "nothing_digested": _nothing_digested(probes, digest_ranks),
            # per rank: [first step, last step, steps digested] (what "identical" may cover)
            "by_rank": {str(r): [s.get("first_step"), s.get("last_step"), s.get("steps")]
                        for r, s in sorted(digest_ranks.items())},
        }
    if digests is None:
        digests = _digests_from_file(Path(run_dir) / SHARED_DIGESTS_FILE)
    notes: list[str] = []
    for probe in probes.values():
        for note in probe.get("step_notes") or []:
            if isinstance(note, str) and note not in notes:
                notes.append(note)
    return {
        "stress": _stress(probes),
        "step_source": sources[0] if sources else None,
        "steps_counted": {str(r): p.get("steps_counted") for r, p in sorted(probes.items())
                          if isinstance(p.get("steps_counted"), int)},
        "digests": digests,
        "order_steps": _order_steps(run_dir),
        "step_time": any(p.get("step_seconds") for p in probes.values()),
        "precision": printed_precision(metric_files, fmt, names, pattern),
        "notes": notes,
    }


def _nothing_digested(probes: dict[int, dict[str, Any]],
                      summaries: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """The ranks that digested no tensor at a step they digested (or none while others did)."""
    empty = []
    for rank in sorted(probes):
        summary = summaries.get(rank)
        if summary is None:
            empty.append({"rank": rank, "reason": "it took no digest (the adapter found no "
                                                  "units on this rank)"})
        elif not summary.get("fewest_tensors", 1) or not (
                int(summary.get("parameters", 0)) + int(summary.get("gradients", 0))):
            empty.append({"rank": rank, "reason": str(summary.get(
                "nothing_digested", "the adapter found no parameter tensors to digest"))})
    return empty


def _stress(probes: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """The ranks' stress records summed (see the module docstring); None without stress."""
    records = [p["stress"] for _, p in sorted(probes.items()) if isinstance(p.get("stress"), dict)]
    if not records:
        return None
    edges: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    no_window: list[str] = []
    for record in records:
        for edge, row in (record.get("edges") or {}).items():
            if not isinstance(row, dict):
                continue
            out = edges.setdefault(edge, {"delays": 0, "delay_total_ms": 0.0, "gap_ms": [],
                                          "gap_source": row.get("gap_source")})
            out["delays"] += int(row.get("delays") or 0)
            out["delay_total_ms"] = round(out["delay_total_ms"]
                                          + float(row.get("delay_total_ms") or 0.0), 3)
            out["gap_ms"].append(row.get("gap_ms"))
            if row.get("gap_source") == "default":
                out["gap_source"] = "default"
        for note in record.get("notes") or []:
            if isinstance(note, str) and note not in notes:
                notes.append(note)
        for edge in record.get("no_window_edges") or []:
            if isinstance(edge, str) and edge not in no_window:
                no_window.append(edge)
    medians = [float(r["delay_median_ms"]) for r in records
               if isinstance(r.get("delay_median_ms"), int | float)]
    return {
        "delays": sum(int(r.get("delays") or 0) for r in records),
        "delay_total_ms": round(sum(float(r.get("delay_total_ms") or 0.0) for r in records), 3),
        "delay_median_ms": max(medians) if medians else None,
        "ranks": len(records),
        "edges": edges,
        "no_window_edges": no_window,
        "notes": notes,
    }


def describe_stress(stress: dict[str, Any] | None) -> str | None:
    """The stress part of the signals line, or None for a run without stress."""
    if not stress:
        return None
    if stress.get("no_window_edges") and not stress.get("delays"):
        return ("stress: no window to widen (every prefetch finished before it returned: a "
                "synchronous unshard, nothing overlaps its use); no delay applied")
    median = stress.get("delay_median_ms")
    line = (f"stress: {stress.get('delays', 0)} delays before prefetches were issued "
            f"(median {median:.3g} ms, total {stress.get('delay_total_ms', 0.0) / 1000:.3g} s, "
            f"{len(stress.get('edges') or {})} edges, {stress.get('ranks', 0)} rank(s))"
            if median is not None else "stress: no delay applied (no prefetch after the "
            "gap-measuring steps)")
    if stress.get("no_window_edges"):
        line += (f"; no window to widen on {len(stress['no_window_edges'])} edge(s) "
                 "(synchronous unshards: they finished before they returned)")
    default = [e for e, row in (stress.get("edges") or {}).items()
               if row.get("gap_source") == "default"]
    if default:
        line += (f"; no issue-to-use gap measured for {', '.join(sorted(default))}: "
                 "delays scaled to the default gap")
    return line


def signal_problems(signals: dict[str, Any] | None) -> list[str]:
    """Why a run's signals make it an error: ranks that counted different step numbers."""
    counted = (signals or {}).get("steps_counted") or {}
    if len(set(counted.values())) > 1:
        each = ", ".join(f"rank {r} {n}" for r, n in counted.items())
        return [f"ranks counted different numbers of training steps ({each}): "
                "their steps cannot be matched"]
    return []


def describe_signals(signals: dict[str, Any] | None) -> str:
    """One line: what the runs measure, and what is missing and why."""
    if not signals:
        return "signals: none recorded"
    parts = []
    digests = signals.get("digests")
    if digests:
        values = (f" and {digests['parameters']} parameter values"
                  if digests.get("values", True) else "")
        parts.append(f"digests of {digests['gradients']} gradients{values} x "
                     f"{digests['ranks']} rank(s), {digests['coverage']}")
        parts.extend(_describe_nothing_digested(digests))
    order = signals.get("order_steps") or 0
    if order:
        parts.append(f"unit order, {order} step{'s' if order != 1 else ''}")
    if signals.get("step_time"):
        parts.append("step time")
    line = "signals: " + "; ".join(parts) if parts else "signals:"
    missing = []
    if not digests:
        missing.append("digests")
    if not order:
        missing.append("order")
    if not signals.get("step_time"):
        missing.append("step time")
    if missing:
        why = _why_missing(signals)
        line += ("; " if parts else " ") + f"{why}: {', '.join(missing)} off"
    line += f"; comparing the printed {describe_precision(signals.get('precision') or {})}"
    for note in signals.get("notes") or []:
        line += f"; {note}"
    stress = describe_stress(signals.get("stress"))
    if stress:
        line += f"; {stress}"
    return line


def _describe_nothing_digested(digests: dict[str, Any]) -> list[str]:
    """'rank 0: 0 tensors digested: <why>; so no bitwise claim' per rank that compared nothing."""
    empty = digests.get("nothing_digested") or []
    said = [f"rank {row['rank']}: 0 tensors digested: {row['reason']}" for row in empty]
    if said:
        said[-1] += " (no bitwise claim: the digests compare nothing there)"
    return said


def _why_missing(signals: dict[str, Any]) -> str:
    source = signals.get("step_source")
    if source is None:
        return "no step boundary seen (no adapter in the job, or no optimizer step)"
    return f"steps from {source}"


def not_localized_wording(signals: Sequence[dict[str, Any] | None]) -> str | None:
    """Why a divergence has no unit named: ranks that digested nothing give nothing to
    localize from ('not localized: nothing digested on rank 0, 1'); None otherwise."""
    ranks = sorted({row["rank"] for s in signals if s and s.get("digests")
                    for row in s["digests"].get("nothing_digested") or []})
    if not ranks:
        return None
    return ("not localized: nothing digested on rank " + ", ".join(map(str, ranks))
            + " (no tensor to localize from)")


def digest_gaps(signals: dict[str, Any] | None, *, steps_done: int, every: int) -> list[str]:
    """Ranks whose gradient digests stop before the run's metrics do: the steps after them
    were never digested, so the run cannot vouch for them (an incomplete run). One sentence
    per step they stop at."""
    digests = (signals or {}).get("digests") or {}
    expected = steps_done // every * every  # the last step a digest is taken at
    stops: dict[int, list[int]] = {}
    for rank, (first, last, _) in (digests.get("by_rank") or {}).items():
        if isinstance(first, int) and isinstance(last, int) and last < expected:
            stops.setdefault(last, []).append(int(rank))
    return [f"the gradient digests of rank{'s' if len(ranks) > 1 else ''} {_ranks(sorted(ranks))} "
            f"stop at step {last} while the metrics go on to step {steps_done} (no optimizer step "
            f"the adapter saw after step {last}; record: {{digests: false}} compares the printed "
            "metrics alone)" for last, ranks in sorted(stops.items())]


def _digested(known: Sequence[dict[str, Any]], steps: int | None,
              world_size: int | None) -> tuple[str, bool] | None:
    """What every run's digests cover in common, in words, and whether that is every step
    compared on every rank of the job; None when some run has no digests at all."""
    if not all(s.get("digests") for s in known):
        return None
    ranges: dict[int, tuple[int, int, int]] = {}  # rank -> the steps every run digested there
    ranks_in_every_run: set[int] | None = None
    seen: set[int] = set()  # every rank any run heard from (a silent one included)
    for s in known:
        by_rank = {int(r): v for r, v in (s["digests"].get("by_rank") or {}).items()
                   if all(isinstance(x, int) for x in v)}
        silent = {int(row["rank"]) for row in s["digests"].get("nothing_digested") or []}
        ranks = set(by_rank) - silent
        seen |= set(by_rank) | silent
        ranks_in_every_run = ranks if ranks_in_every_run is None else ranks_in_every_run & ranks
        for rank, (first, last, count) in by_rank.items():
            old = ranges.get(rank, (first, last, count))
            ranges[rank] = (max(first, old[0]), min(last, old[1]), min(count, old[2]))
    ranks = sorted(ranks_in_every_run or ())
    if not ranks:
        return None
    first = max(ranges[r][0] for r in ranks)
    last = min(ranges[r][1] for r in ranks)
    whole_steps = all(ranges[r][2] == last - first + 1 for r in ranks)
    world = max(world_size or 0, max(seen) + 1)
    missing = [r for r in range(world) if r not in ranks]
    every_step = whole_steps and first == 1 and (steps is None or last >= steps)
    span = f"steps {first}-{last}" if first != last else f"step {first}"
    if not whole_steps:
        span = f"{min(ranges[r][2] for r in ranks)} steps between {first} and {last}"
    words = f"digests of {span} on rank{'s' if len(ranks) > 1 else ''} {_ranks(ranks)}"
    if missing:
        words += f" (rank{'s' if len(missing) > 1 else ''} {_ranks(missing)}: not in every run's digests)"
    return words, every_step and not missing


def _ranks(ranks: Sequence[int]) -> str:
    """'0-3' for consecutive ranks, else '0, 2, 5'."""
    if len(ranks) > 1 and list(ranks) == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(map(str, ranks))


def identical_wording(signals: Sequence[dict[str, Any] | None], *, steps: int | None = None,
                      world_size: int | None = None) -> str:
    """'bitwise identical' only where digests of every compared step on every rank of the job
    (world_size, where known), or full-precision metrics, back it; else what was compared."""
    known = [s for s in signals if s]
    digested = _digested(known, steps, world_size) if known else None
    if digested is not None and digested[1]:
        return "bitwise identical (digests)"
    precision = _coarsest_precision(known)
    if digested is not None:
        printed = f"the printed {describe_precision(precision)}" if precision else "the metrics read"
        return f"identical in the {digested[0]} and in {printed}"
    if precision and all(p == FULL for p in precision.values()):
        return "bitwise identical (metrics at full precision)"
    if precision:
        return f"identical at the printed precision ({describe_precision(precision)})"
    return "identical in the metrics read"


def _coarsest_precision(known: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per metric, the coarsest way any of the runs printed it: the fewest fixed decimals,
    else as printed, else full precision (metrics/precision.py)."""
    def coarseness(p: Any) -> tuple[int, int]:
        return (0, -p) if isinstance(p, int) else (1, 0) if p == AS_PRINTED else (2, 0)

    precision: dict[str, Any] = {}
    for s in known:
        for name, p in (s.get("precision") or {}).items():
            if p is not None and (name not in precision
                                  or coarseness(p) < coarseness(precision[name])):
                precision[name] = p
    return precision
