"""`bisect-prefetch audit`: one short recorded run, then the audit of its probe and order (judge/audit.py).

The run changes nothing (no mask) and uses the experiment's guard unless
--guard says otherwise, so it shows the build as it is: which edges prefetch
into units whose shard group has size 1, whether those still issue async
unshards, whether a guard has switched real (shard size > 1) prefetch off,
and, from the order record, each kind of suspect edge (--kinds chooses):
size-one, never-consumed and late are problems (exit 1), no-op, shadowed and
duplicate-target are notes.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from bisect_prefetch.commands.common import check_outputs, write_json
from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.experiment import load_experiment
from bisect_prefetch.judge.audit import FAILING_KINDS, KINDS, audit_run_dir
from bisect_prefetch.runs.state import open_state
from bisect_prefetch.runs.workloads import require_prefetch_graph
from bisect_prefetch.vocab import STDERR_FILE

AUDIT_STEPS = 2  # step 1 alone already fires every edge; a second shows it repeats


def parse_kinds(text: str | None) -> list[str]:
    """--kinds K,...: the kinds of finding to report (default all)."""
    if not text:
        return list(KINDS)
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise BisectPrefetchError(f"--kinds {text!r}: unknown kind(s) {', '.join(unknown)}; "
                                  f"choose from {', '.join(KINDS)}")
    return kinds


def audit(experiment_path: Path, *, guard: str | None, kinds: str | None, state_dir: Path,
          console: Console, json_out: Path | None = None) -> int:
    """Run the audit and print it; exit code 0 when the build is right, 1 otherwise."""
    result = run_audit(experiment_path, guard=guard, state_dir=state_dir, console=console,
                       outputs=(json_out,),
                       kinds=parse_kinds(kinds))
    console.print(audit_table(result))
    for line in verdict_lines(result):
        console.print(line, markup=False)
    if json_out is not None:
        write_json(json_out, result, console)
    return 0 if result["ok"] else 1


def run_audit(
    experiment_path: str | Path, *, guard: str | None, state_dir: str | Path, console: Console,
    kinds: list[str] | None = None, outputs: tuple[Path | None, ...] = (),
) -> dict:
    experiment = load_experiment(experiment_path)
    require_prefetch_graph(experiment)
    check_outputs(*outputs, state_dir=Path(state_dir), name=experiment.name)
    guard = guard or experiment.guard
    with open_state(experiment, state_dir, console=console) as opened:
        runner, state = opened.runner, opened.state
        key = runner.key("audit", mask=None, guard=guard, steps=AUDIT_STEPS, index=0, stress=False)
        if not runner.holds(key):
            console.print(f"recording {AUDIT_STEPS} steps of {experiment.name} "
                          f"(guard {guard}, no mask)...", markup=False)
        out = runner.run(key, label="audit")
        run_dir = state.run_dir(out.run_id)
        if not out.usable:
            raise BisectPrefetchError(
                f"audit run {out.run_id} ended in {out.outcome} ({out.reason}); "
                f"see {run_dir / STDERR_FILE}"
            )
        result = audit_run_dir(run_dir, kinds=kinds or KINDS)
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
    if result.get("units_without_params"):
        lines.append("units in which the adapter found no parameter tensors (their parameter "
                     "counts and shard sizes are not the build's): "
                     + ", ".join(result["units_without_params"]))
    observed = "" if result.get("guard_observed", True) else " (no size-one edge fired: nothing to judge by)"
    note = f" ({result['guard_note']})" if result.get("guard_note") else ""
    lines.append(f"guard: {result['guard']}{observed}{note}")
    lines += finding_lines(result)
    not_checked = [n["kind"] for n in result.get("not_checked", [])]
    if not result["ok"]:
        lines.append("-> PROBLEM: see above")
    elif not_checked:
        lines.append(f"-> OK for what was checked ({', '.join(result.get('checked', []))}); "
                     f"not checked: {', '.join(not_checked)}")
    else:
        lines.append("-> OK: the build is right")
    return lines


def finding_lines(result: dict) -> list[str]:
    """One line per finding: failing kinds as problems, the others as notes."""
    lines = []
    by_reason: dict[str, list[str]] = {}
    for item in result.get("not_checked", []):
        by_reason.setdefault(item["reason"], []).append(item["kind"])
    for reason, kinds in by_reason.items():
        lines.append(f"not checked: {', '.join(kinds)}: {reason}")
    for f in result.get("findings", []):
        label = "problem" if f["kind"] in FAILING_KINDS else "note"
        where = _where(f)
        lines.append(f"{label}: {f['kind']} {f['edge']}: {f['evidence']}{where}")
    return lines


def _where(finding: dict) -> str:
    parts = []
    if finding.get("steps"):
        parts.append("step" + ("s " if len(finding["steps"]) > 1 else " ")
                     + ",".join(str(s) for s in finding["steps"]))
    if finding.get("ranks"):
        parts.append("rank" + ("s " if len(finding["ranks"]) > 1 else " ")
                     + ",".join(str(r) for r in finding["ranks"]))
    return f" ({'; '.join(parts)})" if parts else ""
