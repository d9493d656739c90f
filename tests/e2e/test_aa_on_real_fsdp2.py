"""`bisect-prefetch aa` on the real FSDP2 workload (2 CPU ranks, gloo, 4 layers): a clean group
is consistent, with digests on by default and identical between its runs, and each run's step
time; masking a planted fault's edge off makes the group consistent, the edge masked at every
firing; a timeout is an error that leaves no process; a planted one-ulp fault diverges, seen in
the gradients steps before the printed loss (read at 2 decimals) moves, localized to its unit.
`aa` over stand-in jobs: tests/commands/test_aa.py; digests compared on written files:
tests/metrics/test_digest_localization.py."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

from bisect_prefetch.cli import main
from bisect_prefetch.metrics.digest_files import read_run_digests
from tests.conftest import job_processes

# 4 layers: the chain, the implicit edge and a backward edge inside the chain; scale is not
# what these tests prove.
LAYERS, STEPS = 4, 10
FAULT_EDGE = "bwd:layers.2->layers.1"
FAULT_SURE = f', fault: {{edge: "{FAULT_EDGE}", hazard: 1.0}}'
STATIC = "{source: static, policy: fsdp2-chain}"


def _fsdp2(tmp_path: Path, name: str, *, fault: str = "", graph: str = "{source: runtime}",
           timeout_s: float = 240) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(textwrap.dedent(f"""
        name: {name}
        workload: {{builtin: fsdp2, layers: {LAYERS}, world_size: 2{fault}}}
        metrics: {{format: jsonl, names: [loss, grad_norm]}}
        graph: {graph}
        steps: {STEPS}
        timeout_s: {timeout_s}
        no_progress_timeout_s: 120
    """))
    return path


def _aa(tmp_path: Path, experiment: Path, *args: str) -> tuple[int, dict | None]:
    out = tmp_path / "aa.json"
    out.unlink(missing_ok=True)
    code = main(["aa", str(experiment), "--state-dir", str(tmp_path / "state"),
                 "--json", str(out), *args])
    return code, json.loads(out.read_text()) if out.exists() else None


def _run_dirs(tmp_path: Path, name: str) -> list[Path]:
    return sorted((tmp_path / "state" / name / "runs").iterdir())


def test_fsdp2_aa_without_fault_is_consistent_with_digests_and_step_times(tmp_path, capsys):
    code, result = _aa(tmp_path, _fsdp2(tmp_path, "fsdp2-clean"))
    assert code == 0, result
    assert result["verdict"] == "consistent" and result["localization"] is None
    assert result["metrics"]["loss"]["steps_compared"] == STEPS
    assert result["environment_drift"] == [] and result["graph_drift"] == []
    graph = json.loads((_run_dirs(tmp_path, "fsdp2-clean")[0] / "graph.json").read_text())
    edge_ids = {edge["id"] for edge in graph["edges"]}
    assert FAULT_EDGE in edge_ids and len(edge_ids) >= 2 * (LAYERS - 1)
    assert job_processes(str(tmp_path)) == []
    # Digests are recorded by default, and the two runs' records are the same (ranks
    # interleave their lines in any order).
    run_dirs = [tmp_path / "state" / "fsdp2-clean" / "runs" / r["run_id"]
                for r in result["run_details"]]
    records = [list(read_run_digests(d)) for d in run_dirs]
    assert len(records) == 2
    assert sorted(r[:4] for r in records[0]) == sorted(r[:4] for r in records[1])
    params = {r.param for r in records[0]}
    assert {"embedding.weight", "layers.0.qkv.weight", "layers.1.down.bias"} <= params
    assert {r.rank for r in records[0]} == {0, 1}
    assert {r.step for r in records[0]} == set(range(1, STEPS + 1))
    assert all(r.norm is not None and r.norm >= r.max_abs >= 0 for r in records[0])
    # Each run's step time, and the group's.
    times = [r["step_time_ms"] for r in result["run_details"]]
    assert all(t is not None and 0 < t < 60_000 for t in times)
    assert result["step_time"]["runs"] == 2
    assert result["step_time"]["min_ms"] == min(times)
    assert "step time: " in capsys.readouterr().out


def test_fsdp2_fault_edge_masked_off_is_consistent(tmp_path):
    experiment = _fsdp2(tmp_path, "fsdp2-masked", fault=FAULT_SURE, graph=STATIC)
    code, result = _aa(tmp_path, experiment, "--mask", f"drop-only:{FAULT_EDGE}")
    assert code == 0, result
    assert FAULT_EDGE not in result["mask"]
    for run_dir in _run_dirs(tmp_path, "fsdp2-masked"):
        probe = json.loads((run_dir / "probe.json").read_text())
        assert probe["edges"][FAULT_EDGE]["issued"] == 0
        assert probe["edges"][FAULT_EDGE]["masked"] > 0


def test_fsdp2_timeout_is_an_error_and_leaves_no_process(tmp_path):
    experiment = _fsdp2(tmp_path, "fsdp2-timeout", graph=STATIC, timeout_s=2)
    code, result = _aa(tmp_path, experiment)
    assert code == 2
    assert result["verdict"] == "error"
    assert result["outcomes"]["timeout"] == 2
    assert job_processes(str(tmp_path)) == []


def test_real_fsdp2_digests_see_a_one_ulp_fault_before_the_printed_loss(tmp_path, capsys):
    """A one-ulp nudge at every firing of bwd:layers.2->layers.1 moves the gradients at once;
    the loss, printed and read at 2 decimals, does not move for many steps (if ever)."""
    experiment = tmp_path / "fsdp2-digests.yaml"
    experiment.write_text(textwrap.dedent(f"""
        name: fsdp2-digests
        command: [{json.dumps(sys.executable)}, -m, torch.distributed.run, --nproc_per_node=2,
                  "--master_port={{port}}", -m, bisect_prefetch.workloads.fsdp2, --layers, "4",
                  --steps, "{{steps}}", --seed, "1234",
                  --fault-edge, "bwd:layers.2->layers.1", --fault-hazard, "1.0"]
        metrics: {{format: regex, names: [loss],
                   pattern: 'step (?P<step>\\d+) loss (?P<loss>-?\\d+\\.\\d{{2}})'}}
        steps: 8
        timeout_s: 300
    """))
    out = tmp_path / "aa.json"
    code = main(["aa", str(experiment), "--state-dir", str(tmp_path / "state"), "--json", str(out)])
    result = json.loads(out.read_text())
    assert code == 1 and result["verdict"] == "diverged"
    loss_step = result["metrics"]["loss"]["first_diff_step"]
    assert result["first_diff_step"] <= 2
    assert loss_step is None or loss_step > result["first_diff_step"]
    where = result["localization"]
    assert where["step"] == result["first_diff_step"] and where["rank"] in (0, 1)
    assert where["param"].startswith(where["unit"] + ".") and where["units_differing"] >= 1
    diverged = [run for run in result["run_details"] if run["first_diff_step"] is not None]
    assert diverged and diverged[0]["steps_done"] < 8  # stopped at the divergence, not at the end
    assert f"in {where['unit']} (rank {where['rank']}" in capsys.readouterr().out
