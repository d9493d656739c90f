"""The verdict block of a bisection, in words: the same lines in the terminal and the HTML report.

Everything here reads bisect.json's data (docs/contract.md), so the terminal
(commands/bisect_verdict_words.render_result) and a report rebuilt later from the
state dir say the same thing in the same order: the verdict, every cause with
its confidence, keep-only evidence and size-one status, the next steps, then
one count of runs. The guard check's result is read from the journal
(`guard_check`): it may have run after the bisection.
"""

from __future__ import annotations

from typing import Any

from bisect_prefetch.vocab import (
    CONSISTENT,
    DIVERGED,
    GUARD_SIZE_ONE,
    VERDICT_FOUND,
    VERDICT_INCONCLUSIVE,
)

# next_steps' kinds, in the order they are listed (bisect_record.next_steps)
STEP_GUARD, STEP_REPRODUCE, STEP_FIX, STEP_EXPLAIN = "guard", "reproduce", "fix", "explain"
# What each kind of first divergence means (metrics/op_compare.py's kinds; explain says them too)
KIND_WORDS = {
    "origin": "origin: inputs matched, output differed",
    "receiver": "receiver: the difference came from another rank",
    "changed-behind": "changed-behind: a buffer was written outside the traced ops",
    "untraced-input": "untraced-input: an input no traced op wrote differed",
    "alignment": "alignment broke: the runs ran different ops",
}


def headline(data: dict[str, Any]) -> str:
    """e.g. `verdict: culprit-found, 2 independent causes (confidence 0.991)`."""
    sets = causes_of(data)
    what = ""
    if data["verdict"] == VERDICT_FOUND or sets:
        what = (f", {len(sets)} independent causes, each enough alone" if len(sets) > 1
                else ", one cause" if sets else "")
    asked = data.get("confidence_asked")
    below = (f", below the {asked:g} asked" if data.get("confidence_met") is False and asked
             and data["verdict"] != VERDICT_INCONCLUSIVE else "")
    return f"verdict: {data['verdict']}{what} (confidence {data['confidence']:.3f}{below})"


def causes_of(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Every cause: `culprit_sets`, or the minimal set of a bisect.json written without them."""
    if data.get("culprit_sets"):
        return list(data["culprit_sets"])
    if data.get("minimal_set"):
        return [{"edges": list(data["minimal_set"]), "confidence": data.get("confidence"),
                 "per_run_chance": (data.get("calibration") or {}).get("per_run_chance"),
                 "keep_only_runs": []}]
    return []


def run_detail(data: dict[str, Any], number: int) -> dict[str, Any] | None:
    """The run the transcript called `run N` (run_details[N - 1] before `run` was written)."""
    details = data.get("run_details") or []
    found = next((d for d in details if d.get("run") == number), None)
    if found is None and 0 < number <= len(details) and "run" not in details[number - 1]:
        found = details[number - 1]
    return found


def keep_only_words(data: dict[str, Any], cause: dict[str, Any]) -> str:
    """e.g. `keep-only diverged in run 7 (0011-search-k0) at step 19`; a run of several masks
    also says its segment's step, which the search's own lines count."""
    runs = cause.get("keep_only_runs") or []
    if not runs:
        return "keep-only: no divergence recorded"
    first = runs[0]
    detail = run_detail(data, first) or {}
    which = f"run {first}" + (f" ({detail['run_id']})" if detail.get("run_id") else "")
    step = detail.get("first_diff_step")
    where = f" at step {step}" if step is not None else ""
    if step is not None and detail.get("schedule"):
        began = max((s for s, _ in detail["schedule"] if s <= step), default=1)
        if began > 1:
            where += f" (step {step - began + 1} of its segment from step {began})"
    more = f", {len(runs) - 1} more run{'s' * (len(runs) > 2)}" if len(runs) > 1 else ""
    return f"keep-only diverged in {which}{where}{more}"


def size_one_words(cause: dict[str, Any]) -> str:
    flag = cause.get("size_one")
    if flag is None:
        return "size-one: not known (no discovery run audited)"
    edges = cause.get("size_one_edges") or []
    if flag:
        return "size-one: yes (every edge targets a unit whose shard group has size 1)"
    if edges:
        return f"size-one: {len(edges)} of {len(cause['edges'])} edges ({', '.join(edges)})"
    return "size-one: no"


def cause_line(data: dict[str, Any], number: int, cause: dict[str, Any]) -> str:
    """e.g. `cause 1: bwd:layers.2->layers.1 (confidence 0.995; keep-only diverged in run 7 ...;
    size-one: no)`."""
    confidence = cause.get("confidence")
    chance = cause.get("per_run_chance")
    parts = [f"confidence {confidence:.3f}" if confidence is not None else "confidence not known",
             keep_only_words(data, cause)]
    if chance:
        parts.append(f"drift in {chance_words(chance)} with it alone on")
    parts.append(size_one_words(cause))
    return f"cause {number}: {','.join(cause['edges'])} ({'; '.join(parts)})"


def chance_words(chance: float) -> str:
    """A per-run chance as runs: `about 7 of 10 runs`, `about 1 run in 40`."""
    if chance >= 0.095:
        return f"about {round(10 * chance)} of 10 runs"
    return f"about 1 run in {round(1 / chance)}"


def step_title(step: dict[str, Any], *, several: bool) -> str:
    """What a next step is for, e.g. `reproduce cause 2 alone (keep-only)`."""
    kind, cause = step["step"], step.get("cause")
    if kind == STEP_GUARD:
        return ("check the size-one guard, the engine's fix (the causes' edges "
                f"{', '.join(step['edges'])} target units whose shard group has size 1)")
    if kind == STEP_REPRODUCE:
        return f"reproduce cause {cause} alone (keep-only)"
    if kind == STEP_FIX:
        return ("check the whole fix (drop-only of every cause)" if several
                else "check the fix (drop-only of the cause)")
    if cause is None:
        return "explain the drift without prefetch (all-off): the first op that differs"
    return f"explain cause {cause}: the first op that differs"


def guard_result_words(result: dict[str, Any] | None) -> str:
    """e.g. `consistent over 4 runs with the guard on: ...`, or that it was not run."""
    if result is None:
        return "not run yet"
    runs = f"{result['runs']} run{'s' * (result['runs'] != 1)}"
    if result["verdict"] == DIVERGED:
        return (f"diverged with the guard on: {result['diverged']} of {runs}, first at step "
                f"{result['first_diff_step']}: the guard is not the whole fix")
    if result["verdict"] == CONSISTENT:
        return f"consistent over {runs} with the guard on: the guard removes the drift"
    return f"no verdict ({runs}, none usable)"


def explain_result_words(result: dict[str, Any] | None) -> str | None:
    """What `bisect --explain` found for an explain step (None: it was not run), e.g.
    `first divergence at step 2, rank 0, backward of layers.4: prefetch-window
    (changed-behind: ...); edge bwd:layers.5->layers.4`."""
    if result is None:
        return None
    if result.get("error"):
        return f"not explained: {result['error']}"
    first = result.get("first")
    if not first:
        return f"{result.get('verdict')}: no first differing op"
    edge = f"edge {first['edge']}" if first.get("edge") else (
        f"no edge ({first['edge_note']})" if first.get("edge_note") else "no edge")
    kind = KIND_WORDS.get(first.get("kind"), first.get("kind"))
    return (f"first divergence at step {first['step']}, rank {first['rank']}, "
            f"{first['phase']} of {first['module']}: {first['op']} ({kind}); {edge}")


def step_lines(data: dict[str, Any]) -> list[tuple[str, str, str | None]]:
    """(title, command, result words or None) for each next step, in order (a bisect.json
    written before next_steps: its `reproduce`): the guard check's result, and what
    `bisect --explain` found for each explain step."""
    if "next_steps" not in data:
        return [("reproduce", data["reproduce"], None)] if data.get("reproduce") else []
    several = len(causes_of(data)) > 1
    return [(step_title(s, several=several), s["command"],
             guard_result_words(s.get("result")) if s["step"] == STEP_GUARD else
             explain_result_words(s.get("result")) if s["step"] == STEP_EXPLAIN else None)
            for s in data.get("next_steps") or []]


def counts_line(data: dict[str, Any]) -> str:
    """The one count of runs: launched, reused, lost; with segments, the trials said once."""
    launched, reused = data.get("runs_launched", 0), data.get("runs_reused", 0)
    lost = len(data.get("runs_lost") or [])
    head = (f"runs: {launched} launched, {reused} reused from the journal, {lost} lost "
            "(retried)" if lost else
            f"runs: {launched} launched, {reused} reused from the journal")
    segments = data.get("segments") or {}
    if segments.get("used"):
        used = (f"the search's verdict stands on {data['runs_used']} trials in "
                f"{segments['startups']} runs (a trial: one mask's segment of a run, "
                "several masks a run)")
    else:
        used = f"the search's verdict stands on {data['runs_used']} runs"
    return f"{head}; {used}; steps: {data['steps_used']}"


def guard_check(groups: list[Any], *, edge_ids: list[str] | None) -> dict[str, Any] | None:
    """The newest `aa --guard size-one` group with every edge on (report/run_view.RunGroup's),
    as next_steps' `result`: verdict, runs, diverged, first differing step, run ids."""
    every = set(edge_ids or [])
    found = [g for g in groups if g.purpose == "aa" and g.guard == GUARD_SIZE_ONE
             and (g.mask is None or not every or set(g.mask) == every)]
    if not found:
        return None
    group = found[-1]
    verdict = group.verdict if group.verdict != "reference" else "error"
    return {"verdict": verdict, "runs": len(group.records), "diverged": len(group.diverged_runs),
            "first_diff_step": group.first_diff_step,
            "run_ids": [r.get("run_id") for r in group.records]}
