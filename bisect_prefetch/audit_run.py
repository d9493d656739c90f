"""`bisect-prefetch audit`: one short recorded run, then the size-one audit of its probe.

The run changes nothing (no mask) and uses the experiment's guard unless
--guard says otherwise, so it shows the build as it is: which edges prefetch
into units whose shard group has size 1, whether those still issue async
unshards, and whether a guard has switched real (shard size > 1) prefetch off.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from bisect_prefetch.audit import audit_run_dir
from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.experiment import load_experiment
from bisect_prefetch.runs.execute import Runner
from bisect_prefetch.runs.store import StateDir

AUDIT_STEPS = 2  # step 1 alone already fires every edge; a second shows it repeats


def run_audit(
    experiment_path: str | Path, *, guard: str | None, state_dir: str | Path, console: Console
) -> dict:
    experiment = load_experiment(experiment_path)
    guard = guard or experiment.guard
    with StateDir(state_dir, experiment.name) as state:
        runner = Runner(experiment, state)
        key = runner.key("audit", mask=None, guard=guard, steps=AUDIT_STEPS, index=0)
        if state.find(key) is None:
            console.print(f"recording {AUDIT_STEPS} steps of {experiment.name} "
                          f"(guard {guard}, no mask)...", markup=False)
        out = runner.run(key, label="audit")
        run_dir = state.run_dir(out.run_id)
        if not out.usable:
            raise BisectPrefetchError(
                f"audit run {out.run_id} ended in {out.outcome} ({out.reason}); "
                f"see {run_dir / 'stderr.log'}"
            )
        result = audit_run_dir(run_dir)
    result["run_id"] = out.run_id
    result["guard_under_test"] = guard
    return result


def audit_table(result: dict) -> Table:
    table = Table(title="prefetch edges and their targets", title_justify="left")
    table.add_column("edge", no_wrap=True, overflow="fold")
    for column in ("shard size", "size one", "async unshards", "attempts", "guarded"):
        table.add_column(column, justify="right")
    for e in result["edges"]:
        size = "?" if e["target_shard_size"] is None else str(e["target_shard_size"])
        # "yes!" marks the reported mechanism: a size-one prefetch that still copies.
        flag = "yes!" if e["size_one"] and e["async_unshards"] else "yes" if e["size_one"] else "no"
        table.add_row(e["id"], size, flag, str(e["async_unshards"]), str(e.get("attempts", "")),
                      str(e.get("guarded", "")))
    return table


def verdict_lines(result: dict) -> list[str]:
    lines = [f"size-one edges: {len(result['size_one_edges'])} of {len(result['edges'])}"]
    if result["size_one_edges_unsharding"]:
        lines.append("size-one edges still issuing async unshards (the reported drift mechanism): "
                     + ", ".join(result["size_one_edges_unsharding"]))
    if result["real_prefetch_lost"]:
        lines.append("real prefetch lost (shard size > 1, no async unshard; a guard reading a "
                     "missing shard_size as 1?): " + ", ".join(result["real_prefetch_lost"]))
    if result.get("pitfall_units"):
        lines.append("units whose parameters lack shard_size (a guard reading "
                     "getattr(param, 'shard_size', 1) would disable their prefetch): "
                     + ", ".join(result["pitfall_units"]))
    observed = "" if result.get("guard_observed", True) else " (no size-one edge fired: nothing to judge by)"
    lines.append(f"guard: {result['guard']}{observed}")
    lines.append("-> OK: the build is right" if result["ok"] else "-> PROBLEM: see above")
    return lines
