"""A user's FSDP2 script on the oldest torch the adapter supports and the newest the package
index serves here by default, each in a job venv of its own (`make torch-venvs`: torch 2.8.0 and
2.14.1, CUDA builds that run on CPU); the tool's own venv is never on the job's path.

The job is tests/jobs/two_causes_job.py (4 layers, 2 ranks under the venv's torchrun, gloo)
with its own fault on one backward edge: the backward prefetch into layers.1, which layers.2
issues. Per torch: the runtime graph, `aa --mask all-off` consistent with digests on every
rank (torch 2.8 has no torch.hash_tensor: its digests take the fallback of
adapters/torch_digest.py), and `aa` with the planted edge alone on diverged. Then a torch the adapter refuses:
the same job made to lack torch.cpu.Stream.record_event (as 2.6 and 2.7 do) by
tests/jobs/torch_lacking.py: every run fails with the adapter's one line, and no verdict.
4.4 minutes measured on 2 cores at load 4.5-9 (each run starts torchrun and imports a CUDA build).
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest

from bisect_prefetch.cli import main
from tests.conftest import read_ranks, run_json

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "tests" / "jobs" / "two_causes_job.py"
LACKING = REPO / "tests" / "jobs" / "torch_lacking.py"
LAYERS = 4
PLANTED = "bwd:layers.2->layers.1"  # the script's fault rides on the prefetch into layers.1
VERSIONS = ["2.8.0", "2.14.1"]  # the Makefile's TORCH_LOW and TORCH_HIGH


def _venv(version: str) -> Path:
    venv = REPO / f".venv-torch-{version}"
    if not (venv / ".installed").is_file():
        pytest.skip(f"the torch {version} job venv is not built (make torch-venvs)")
    return venv


def _experiment(folder: Path, venv: Path, *, name: str, graph: str = "{source: runtime}",
                lacking: str | None = None) -> Path:
    wrapper = [str(LACKING), lacking] if lacking else []
    command = [str(venv / "bin" / "torchrun"), "--nnodes=1", "--nproc_per_node=2",
               "--master_port={port}", *wrapper, str(JOB), "--layers", str(LAYERS),
               "--steps", "{steps}", "--seed", "{seed}",
               "--fault-targets", "layers.1", "--fault-hazard", "0.8"]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(textwrap.dedent(f"""
        name: {name}
        command: {json.dumps(command)}
        metrics: {{format: torchtitan, names: [loss, grad_norm]}}
        graph: {graph}
        steps: 3
        seed: 5
        timeout_s: 240
        search: {{confidence: 0.9, max_runs: 24}}
    """))
    return path


@pytest.mark.parametrize("version", VERSIONS)
def test_graph_aa_with_digests_and_the_planted_edge_on_a_users_script(version, tmp_path, capsys):
    folder = tmp_path / version
    experiment = _experiment(folder, _venv(version), name="job")

    graph_json = folder / "graph.json"
    assert main(["graph", str(experiment), "--format", "json", "--out", str(graph_json),
                 "--state-dir", str(folder / "state")]) == 0, capsys.readouterr().out
    graph = json.loads(graph_json.read_text())
    chain = ["root", *(f"layers.{i}" for i in reversed(range(LAYERS)))]
    assert [e["id"] for e in graph["edges"]] == [
        f"bwd:{a}->{b}" for a, b in zip(chain, chain[1:], strict=False)]
    assert {n["shard_size"] for n in graph["nodes"] if n["name"] != "root"} == {2}

    code, aa = run_json(folder, "aa", str(experiment), "--mask", "all-off", "--runs", "2")
    out = capsys.readouterr().out
    assert code == 0 and aa["verdict"] == "consistent", out
    assert "bitwise identical (digests)" in out
    assert aa["signals"]["digests"]["ranks"] == 2
    for detail in aa["run_details"]:
        run_dir = folder / "state" / "job" / "runs" / detail["run_id"]
        digests = read_ranks(run_dir, "digests")
        assert {(d["rank"], d["step"]) for d in digests} == {
            (rank, step) for rank in (0, 1) for step in (1, 2, 3)}
        probe = json.loads((run_dir / "probe.json").read_text())
        assert probe["edges"] and all(c["masked"] > 0 and c["issued"] == 0
                                      for c in probe["edges"].values())

    # The planted edge alone diverges: the mask reaches this torch's prefetch (what a bisect
    # names, in one group; the search on real runs: tests/e2e/test_two_causes.py).
    code, alone = run_json(folder, "aa", str(experiment), "--mask", f"keep-only:{PLANTED}",
                           "--runs", "2")
    out = capsys.readouterr().out
    assert code == 1 and alone["verdict"] == "diverged", out
    assert alone["mask"] == [PLANTED]


def test_a_torch_lacking_a_name_the_adapter_needs_fails_every_run_with_one_line(tmp_path, capsys):
    """On a static graph (no discovery run before the masked runs: the case that said
    "consistent"); a bisect's discovery run failing with the line is tests/runs/
    test_mask_applied.py's, on the tool's own torch."""
    venv = _venv(VERSIONS[-1])
    line = re.compile(r"adapter not active: torch 2\.14\.1(\+\w+)? lacks "
                      r"torch\.cpu\.Stream\.record_event")
    experiment = _experiment(tmp_path, venv, name="lacking", lacking="torch.cpu.Stream.record_event",
                             graph="{source: static, policy: fsdp2-chain, layers: 4}")
    code, aa = run_json(tmp_path, "aa", str(experiment), "--mask", "all-off", "--runs", "2")
    out = capsys.readouterr().out
    assert code == 2 and aa["verdict"] not in ("consistent", "diverged"), out
    assert [d["outcome"] for d in aa["run_details"]] == ["error", "error"]
    assert all(line.fullmatch(d["reason"]) for d in aa["run_details"]), aa["run_details"]
