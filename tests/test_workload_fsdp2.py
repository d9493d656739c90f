"""The FSDP2 reference workload, run for real: torch.distributed.run, 2 gloo ranks on CPU.

Each run is launched the way the launcher will launch it: the adapter's site
directory first on PYTHONPATH and BISECT_PREFETCH_PLAN pointing at a plan file.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SITE = REPO / "bisect_prefetch" / "adapters" / "site"
LAYERS = 4
FAULT_EDGE = "bwd:layers.3->layers.2"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_plan(run_dir: Path, **fields) -> Path:
    plan = {
        "version": 1,
        "experiment": "test",
        "run_id": run_dir.name,
        "out_dir": str(run_dir),
        "mask": None,
        "guard": "none",
        "record": {"graph": True, "probe": True, "digests": None, "digest_every": 1},
        "fault": None,
        "seed": 1234,
        "steps": 30,
    }
    plan.update(fields)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "plan.json"
    path.write_text(json.dumps(plan))
    return path


def run_fsdp2(
    run_dir: Path,
    *,
    steps: int,
    nproc: int = 2,
    plan: Path | None = None,
    extra_args: tuple[str, ...] = (),
    timeout: float = 120,
) -> subprocess.CompletedProcess:
    """Launch the workload under torchrun; kill the whole process group on timeout."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("BISECT_PREFETCH_PLAN", None)
    if plan is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(SITE), str(REPO)])
        env["BISECT_PREFETCH_PLAN"] = str(plan)
    command = [
        sys.executable, "-m", "torch.distributed.run",
        f"--nproc_per_node={nproc}", f"--master_port={free_port()}",
        "-m", "bisect_prefetch.workloads.fsdp2",
        "--layers", str(LAYERS), "--steps", str(steps), "--seed", "1234", *extra_args,
    ]  # fmt: skip
    run_dir.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        command, cwd=run_dir, env=env, text=True, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    result = subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
    assert result.returncode == 0, f"workload failed:\n{stderr[-4000:]}"
    return result


def read_jsonl(path: Path) -> list[dict]:
    """Records sorted by (step, rank, param): ranks append in any order."""
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return sorted(records, key=lambda r: (r["step"], r["rank"], r.get("param", "")))


def read_probe(run_dir: Path, rank: int = 0) -> dict:
    return json.loads((run_dir / f"probe.rank{rank}.json").read_text())


def all_edges(run_dir: Path) -> list[str]:
    graph = json.loads((run_dir / "graph.rank0.json").read_text())
    return [edge["id"] for edge in graph["edges"]]


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("baseline")
    plan = write_plan(run_dir, record={"graph": True, "probe": True, "digests": "layers.*"})
    run_fsdp2(run_dir, steps=30, plan=plan)
    return run_dir


def test_aa_without_fault_is_bitwise_identical(baseline, tmp_path):
    plan = write_plan(tmp_path, record={"graph": True, "probe": True, "digests": "layers.*"})
    run_fsdp2(tmp_path, steps=30, plan=plan)
    a, b = read_jsonl(baseline / "metrics.jsonl"), read_jsonl(tmp_path / "metrics.jsonl")
    assert len(a) == 30 * 2
    assert {(r["step"], r["rank"]) for r in a} == {(s, r) for s in range(1, 31) for r in (0, 1)}
    assert a == b
    assert a[0]["loss"] > a[-1]["loss"]  # it trains
    digests_a = read_jsonl(baseline / "digests.jsonl")
    assert digests_a and all(r["param"].startswith("layers.") for r in digests_a)
    assert digests_a == read_jsonl(tmp_path / "digests.jsonl")


def test_adapter_does_not_change_the_numbers(baseline, tmp_path):
    result = run_fsdp2(tmp_path, steps=30, plan=None)
    assert not (tmp_path / "metrics.jsonl").exists()
    printed = [line.split() for line in result.stdout.splitlines() if line.startswith("step ")]
    rank0 = [r for r in read_jsonl(baseline / "metrics.jsonl") if r["rank"] == 0]
    assert [(int(p[1]), float(p[3]), float(p[5])) for p in printed] == [
        (r["step"], r["loss"], r["grad_norm"]) for r in rank0
    ]


def test_fault_on_a_backward_edge_diverges(baseline, tmp_path):
    plan = write_plan(tmp_path)
    run_fsdp2(
        tmp_path, steps=30, plan=plan,
        extra_args=("--fault-edge", FAULT_EDGE, "--fault-hazard", "1.0"),
    )  # fmt: skip
    a, b = read_jsonl(baseline / "metrics.jsonl"), read_jsonl(tmp_path / "metrics.jsonl")
    assert [(r["step"], r["rank"]) for r in a] == [(r["step"], r["rank"]) for r in b]
    assert a != b
    assert read_probe(tmp_path)["edges"][FAULT_EDGE]["issued"] == 30


def test_fault_edge_masked_off_is_identical_to_baseline(baseline, tmp_path):
    mask = [edge for edge in all_edges(baseline) if edge != FAULT_EDGE]
    assert len(mask) == len(all_edges(baseline)) - 1
    plan = write_plan(tmp_path, mask=mask, fault={"edge": FAULT_EDGE, "hazard": 1.0})
    run_fsdp2(tmp_path, steps=30, plan=plan)  # the fault comes from the plan this time
    assert read_jsonl(baseline / "metrics.jsonl") == read_jsonl(tmp_path / "metrics.jsonl")
    for rank in (0, 1):
        counts = read_probe(tmp_path, rank)["edges"][FAULT_EDGE]
        assert counts == {"fired": 30, "issued": 0, "noop": 0, "masked": 30, "guarded": 0}
        assert all(FAULT_EDGE in step["masked"] for step in read_probe(tmp_path, rank)["steps"])
