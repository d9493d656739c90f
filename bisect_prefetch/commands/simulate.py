"""`bisect-prefetch simulate`: the search against a simulated oracle with a known answer, scored."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from bisect_prefetch.commands.common import write_json
from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.simulation.trials import simulate as run_simulation
from bisect_prefetch.vocab import VERDICT_NO_DRIFT, VERDICT_NOT_PREFETCH


def simulate(policy: str, layers: int, culprits: Sequence[str], *, console: Console,
             json_out: Path | None = None, **settings: Any) -> int:
    """Narrate, run and score the simulated searches.

    settings: simulation.trials.simulate's keyword arguments (hazard, steps,
    together, trials, seed, method, ...), passed on as they are.
    """
    s = settings
    if culprits and s.get("hazard") is None:
        raise BisectPrefetchError("--culprit needs --hazard (the per-step chance of its drift)")
    if not culprits:
        # No culprit: the case of drift without prefetch (--background), which a right
        # search calls not-prefetch (no-drift-reproduced when there is no drift at all).
        if s.get("hazard"):
            raise BisectPrefetchError("--hazard is the culprit's drift: give --culprit with it")
        if s.get("together"):
            raise BisectPrefetchError("--together needs --culprit")
        settings = {**settings, "hazard": 0.0}
        s = settings
        what = (f"no culprit, drift without prefetch in {s.get('background', 0.0):g} of runs"
                if s.get("background") else "no culprit and no drift")
        console.print(f"simulating {s['trials']} searches on {policy} x {layers} layers, {what}, "
                      f"{s['steps']} steps a run, seed {s['seed']}...", markup=False)
    else:
        if len(culprits) == 1:
            which = f"culprit {culprits[0]}"
        elif s["together"]:
            which = f"culprit {' + '.join(culprits)} (together)"
        else:
            which = f"culprits {', '.join(culprits)} (each enough alone)"
        console.print(f"simulating {s['trials']} searches on {policy} x {layers} layers, {which}, "
                      f"hazard {s['hazard']:g} over {s['steps']} steps, seed {s['seed']}...",
                      markup=False)
    result = run_simulation(policy, layers, list(culprits), **settings)
    if settings.get("segments") == "auto":  # side by side: the same searches, one mask a run
        one = run_simulation(policy, layers, list(culprits), **{**settings, "segments": "off"})
        result["one_mask_per_run"] = {k: one[k] for k in (
            "accuracy", "claimed_confidence", "startups_median", "steps_median", "cost_median",
            "runs_median", "rounds_median")}
    claimed = result["claimed_confidence"]
    if culprits:
        console.print(f"per-run divergence chance q = {result['per_run_chance']:.3f} "
                      f"({result['edges']} edges)", markup=False)
    else:
        console.print(f"{result['edges']} edges; a right trial says "
                      f"{VERDICT_NOT_PREFETCH if s.get('background') else VERDICT_NO_DRIFT}",
                      markup=False)
    console.print(f"accuracy {result['accuracy']:.3f}"
                  + (f" (claimed confidence {claimed:.3f})" if claimed is not None else ""),
                  markup=False)
    console.print(f"runs: median {result['runs_median']:g}, p90 {result['runs_p90']:g}; "
                  f"steps: median {result['steps_median']:g}", markup=False)
    spent = {stage: runs for stage, runs in result["runs_by_step_mean"].items() if runs}
    if spent:  # the JSON's runs_by_step_mean counts runs by protocol stage
        console.print("runs by stage (mean): " + ", ".join(f"{stage} {runs:.1f}"
                                                            for stage, runs in spent.items()),
                      markup=False)
    if (one := result.get("one_mask_per_run")) is not None:
        console.print(
            f"segments: search masks every {result['segment_steps']} steps, runs up to "
            f"{result['cap_steps']} steps (start-up cost {result['startup_cost']:g} steps)",
            markup=False)
        console.print(
            f"  start-ups median {result['startups_median']:g} against {one['startups_median']:g} "
            f"with one mask a run; steps {result['steps_median']:g} against {one['steps_median']:g}; "
            f"cluster time {result['cost_median']:g} against {one['cost_median']:g} steps "
            f"({result['cost_median'] / max(one['cost_median'], 1e-9):.2f}x; golden reference "
            f"included); accuracy {result['accuracy']:.3f} against {one['accuracy']:.3f}",
            markup=False)
    console.print(f"wall-clock on {result['slots']} slot{'s' * (result['slots'] != 1)}: median "
                  f"{result['rounds_median']:.1f}, p90 {result['rounds_p90']:.1f} full runs", markup=False)
    if (stress := result.get("stress")) is not None:
        _say_stress(stress, console)
    if json_out is not None:
        write_json(json_out, result, console)
    return 0


def _say_stress(stress: dict, console: Console) -> None:
    """--stress-factor: both settings' medians and costs, and whether stress pays."""
    console.print(
        f"stress x{stress['factor']:g} on the hazard, x{stress['step_cost']:g} on step time: "
        f"per-run chance {stress['per_run_chance_without']:.3f} -> "
        f"{stress['per_run_chance_with']:.3f}; runs median {stress['runs_median_without']:g} "
        f"-> {stress['runs_median_with']:g}; steps median {stress['steps_median_without']:g} -> "
        f"{stress['steps_median_with']:g}; time median (in unstressed steps) "
        f"{stress['time_median_without']:g} -> {stress['time_median_with']:g}", markup=False)
    if not stress["used"]:
        verdict = "stress lowers the hazard: --stress auto would not use it"
    elif stress["pays"]:
        verdict = "stress pays"
    else:
        verdict = "stress does not pay: its step-time cost outweighs the runs it saves"
    console.print(f"-> {verdict}", markup=False)
