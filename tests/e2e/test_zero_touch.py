"""Every signal on a user's own job: step boundaries found zero-touch, and every run says
what it measured; every file of a run dir has one writer (the orchestrator or one rank).
The job (examples/fsdp2_train.py) imports nothing of ours and calls nothing of ours; it runs
under torchrun with 2 ranks and gradient accumulation 2.
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import rank_lines, run_dir_writers, run_json

pytest.importorskip("torch")
JOB = Path(__file__).resolve().parents[2] / "examples" / "fsdp2_train.py"


def _experiment(tmp_path: Path, *job_args: str, name: str = "user", steps: int = 6,
                ranks: int = 2) -> Path:
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={ranks}", str(JOB), "--steps", "{steps}", *job_args]
    path = tmp_path / f"{name}.yaml"
    path.write_text(textwrap.dedent(f"""
        name: {name}
        command: {json.dumps(argv)}
        metrics: {{format: torchtitan, names: [loss, grad_norm]}}
        graph: {{source: runtime}}
        steps: {steps}
        timeout_s: 180
    """))
    return path


def _runs(tmp_path: Path, name: str = "user") -> list[Path]:
    return sorted(p for p in (tmp_path / "state" / name / "runs").iterdir() if "aa" in p.name)


def test_a_users_job_gets_digests_order_and_step_times_and_says_so(tmp_path, capsys):
    code, result = run_json(tmp_path, "aa", str(_experiment(tmp_path)), "--runs", "2")
    out = capsys.readouterr().out
    assert code == 0, out
    for run_dir in _runs(tmp_path):
        ranks = {json.loads(line)["rank"] for line in rank_lines(run_dir, "digests")}
        assert ranks == {0, 1}
        # Every file of the run dir has one writer: the orchestrator, or one rank.
        writers = run_dir_writers(run_dir, 2)
        assert {writers[f"digests.rank{r}.jsonl"] for r in (0, 1)} == {"rank 0", "rank 1"}
        assert (run_dir / "order.rank0.jsonl").is_file() and (run_dir / "order.rank1.jsonl").is_file()
        for rank in (0, 1):
            probe = json.loads((run_dir / f"probe.rank{rank}.json").read_text())
            # Gradient accumulation 2: two backward passes, one optimizer step, one step.
            assert probe["step_source"] == "optimizer" and probe["steps_counted"] == 6
            assert [s for s, _ in probe["step_seconds"]] == [1, 2, 3, 4, 5, 6]
        status = json.loads((run_dir / "status.json").read_text())
        assert status["signals"]["precision"] == {"loss": 4, "grad_norm": 4}
        assert status["signals"]["digests"]["ranks"] == 2
        # The environment is the job's, taken inside it by each rank (adapters/environment.py).
        import torch

        job = json.loads((run_dir / "env.json").read_text())["job"]
        assert job["ranks"] == 2 and job["world_size"] == 2 and job["local_world_size"] == 2
        assert job["libraries"]["torch"] == torch.__version__ and "torch" in job["imported"]
        assert status["environment"]["executable"] == job["executable"]
    assert "signals: digests of 39 gradients and 39 parameter values x 2 rank(s), every element" in out
    # Said after the discovery run, which printed one value of each: 4 decimals where a
    # trailing zero shows it, else as printed (the aa runs' own status above says 4).
    assert re.search(r"comparing the printed loss \((4 decimals|as printed)\), "
                     r"grad_norm \((4 decimals|as printed)\)", out), out
    assert "bitwise identical (digests)" in out
    assert result["step_time"] is not None and result["signals"]["order_steps"] == 3
    # Every process closed its manifest (torchrun's agent and both ranks, one file each): a
    # resume takes both runs, and the discovery run, and launches nothing.
    assert all(len(list(d.glob("manifest.*.jsonl"))) == 3 for d in _runs(tmp_path))
    code, again = run_json(tmp_path, "aa", str(_experiment(tmp_path)), "--runs", "2", "--resume")
    out = capsys.readouterr().out
    assert code == 0 and all(run["reused"] for run in again["run_details"]), out
    assert "note: 3 run(s) reused from the journal" in out


def test_a_fault_of_the_jobs_own_is_localized_to_its_target_unit(tmp_path):
    # Each backward prefetch into layers.4 (6 steps x 2 accumulated backward passes, on each
    # of 2 ranks) nudges one random element with chance 0.25: two runs are identical only
    # where neither nudged, at most 0.75**24 (1 in 1,000): a pair is enough (was 4 runs).
    experiment = _experiment(tmp_path, "--fault-target", "layers.4", "--fault-hazard", "0.25")
    code, result = run_json(tmp_path, "aa", str(experiment), "--runs", "2")
    assert code == 1 and result["verdict"] == "diverged"
    where = result["localization"]
    assert where["unit"] == "layers.4" and where["rule"] == "values", where
    loss_first = result["metrics"]["loss"]["first_diff_step"]
    assert loss_first is None or where["step"] <= loss_first
    for run in result["run_details"]:
        if run["localization"] is not None:
            assert run["localization"]["unit"] == "layers.4", run


def test_audit_finds_the_mistargeted_and_the_shadowed_edge_from_the_order_record(tmp_path, capsys):
    experiment = _experiment(tmp_path, "--mistarget", "--depth2", name="audited", steps=3)
    code, result = run_json(tmp_path, "audit", str(experiment))
    out = capsys.readouterr().out
    kinds = {(f["kind"], f["edge"]) for f in result["findings"]}
    assert code == 1, out
    assert ({("never-consumed", "bwd:layers.0->layers.5"), ("late", "bwd:layers.0->layers.5")}
            & kinds), kinds
    assert ("shadowed", "bwd:layers.4->layers.3") in kinds, kinds
    assert "OK" not in out.splitlines()[-1]


@pytest.mark.parametrize(
    ("job_args", "expect"),
    [
        # Two optimizers, each stepped every iteration: still one step each iteration.
        (("--adam-per-group",), {"source": "optimizer", "steps": 4, "code": 0}),
        # No torch.optim at all: steps from the root's backward passes, said once.
        (("--manual-update", "--accumulate", "1"), {"source": "backward", "steps": 4, "code": 0,
                                                     "note": "no optimizer step seen"}),
    ],
)
def test_step_boundaries_without_a_single_optimizer(tmp_path, capsys, job_args, expect):
    experiment = _experiment(tmp_path, *job_args, steps=4)
    code, result = run_json(tmp_path, "aa", str(experiment), "--runs", "2")
    out = capsys.readouterr().out
    assert code == expect["code"], out
    signals = result["signals"]
    assert signals["step_source"] == expect["source"]
    assert set(signals["steps_counted"].values()) == {expect["steps"]}
    if "note" in expect:
        assert any(expect["note"] in note for note in signals["notes"]) and expect["note"] in out


def test_ranks_that_step_different_numbers_of_times_are_never_consistent(tmp_path, capsys):
    experiment = _experiment(tmp_path, "--skip-step-on-rank1", "2", steps=4)
    code, _ = run_json(tmp_path, "aa", str(experiment), "--runs", "2")
    captured = capsys.readouterr()
    assert code == 2
    assert "ranks counted different numbers of training steps (rank 0 4, rank 1 3)" in (
        captured.out + captured.err)
