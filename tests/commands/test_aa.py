"""`bisect-prefetch aa` end to end on small stand-in jobs (tests/jobs/fake_job.py): verdicts,
errors, resume, interrupts, drift, the graph command. On real FSDP2:
tests/e2e/test_aa_on_real_fsdp2.py."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from bisect_prefetch.cli import main
from bisect_prefetch.drivers.group import run_group
from bisect_prefetch.experiment import load_experiment
from bisect_prefetch.runs.envprint import ENV_FILE
from bisect_prefetch.runs.execute import Runner, write_config
from bisect_prefetch.runs.sessions import Scope
from bisect_prefetch.runs.store import StateDir
from tests.conftest import job_processes
from tests.jobs.fake_job import RANDOM_EDGE

FAKE_JOB = Path(__file__).resolve().parents[1] / "jobs" / "fake_job.py"


def _experiment(tmp_path: Path, mode: str = "clean", *, steps: int = 8, timeout_s: float = 30,
                name: str = "fake", extra: str = "") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(textwrap.dedent(f"""
        name: {name}
        command: [{json.dumps(sys.executable)}, {json.dumps(str(FAKE_JOB))}, {mode}]
        metrics: {{format: jsonl, names: [loss]}}
        graph: {{source: static, policy: fsdp2-chain, layers: 2}}
        steps: {steps}
        timeout_s: {timeout_s}
    """) + extra)
    return path


def _aa(tmp_path: Path, experiment: Path, *args: str) -> tuple[int, dict | None]:
    out = tmp_path / "aa.json"
    out.unlink(missing_ok=True)
    code = main(["aa", str(experiment), "--state-dir", str(tmp_path / "state"),
                 "--json", str(out), *args])
    return code, json.loads(out.read_text()) if out.exists() else None


def _run_dirs(tmp_path: Path, name: str = "fake") -> list[Path]:
    runs = tmp_path / "state" / name / "runs"
    return sorted(runs.iterdir()) if runs.exists() else []


def test_clean_group_is_consistent(tmp_path, capsys):
    code, result = _aa(tmp_path, _experiment(tmp_path), "--mask", "drop-only:" + RANDOM_EDGE)
    assert code == 0
    assert result["verdict"] == "consistent"
    assert result["outcomes"] == {"ok": 2, "error": 0, "timeout": 0, "stopped-early": 0,
                                  "truncated": 0}
    assert result["metrics"]["loss"]["first_diff_step"] is None
    assert result["metrics"]["loss"]["steps_compared"] == 8
    assert result["mask"] == ["fwd:layers.0->layers.1"]
    assert "-> consistent (2 runs" in capsys.readouterr().out


def test_relative_state_dir(tmp_path, monkeypatch):
    experiment = _experiment(tmp_path)
    monkeypatch.chdir(tmp_path)
    code = main(["aa", str(experiment), "--state-dir", "rel-state", "--mask", "all-off"])
    assert code == 0
    assert len(list((tmp_path / "rel-state" / "fake" / "runs").iterdir())) == 2


def test_random_drift_diverges_and_stops_the_run_and_the_group(tmp_path, capsys):
    code, result = _aa(tmp_path, _experiment(tmp_path, steps=100), "--runs", "3")
    assert code == 1
    assert result["verdict"] == "diverged"
    assert result["first_diff_step"] == 3
    assert result["metrics"]["loss"]["first_diff_step"] == 3
    # Decided by the second run: it was stopped, and the third never ran.
    assert result["runs"] == 2 and result["runs_requested"] == 3
    second = result["run_details"][1]
    assert second["outcome"] == "stopped-early"
    assert second["steps_done"] < 100
    assert "-> diverged at step 3" in capsys.readouterr().out


def test_crashing_runs_are_an_error_not_consistent(tmp_path, capsys):
    code, result = _aa(tmp_path, _experiment(tmp_path, "crash"))
    assert code == 2
    assert result["verdict"] == "error"
    assert result["outcomes"]["error"] == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no verdict: only 0 usable run(s)") and "exit code 3" in err


def test_hanging_runs_time_out_as_errors(tmp_path):
    code, result = _aa(tmp_path, _experiment(tmp_path, "hang", timeout_s=1))
    assert code == 2
    assert result["verdict"] == "error"
    assert result["outcomes"]["timeout"] == 2


def test_ranks_that_disagree_on_the_graph_make_the_run_unusable(tmp_path):
    code, result = _aa(tmp_path, _experiment(tmp_path, "rank-graphs-differ"))
    assert code == 2
    reason = result["run_details"][0]["reason"]
    assert "ranks disagree on the prefetch graph: rank(s) 1 differ from rank 0" in reason


def test_a_rank_with_another_plan_makes_the_run_unusable(tmp_path):
    code, result = _aa(tmp_path, _experiment(tmp_path, "wrong-plan-hash"))
    assert code == 2
    assert "rank(s) 1 ran a different plan" in result["run_details"][0]["reason"]


def test_a_resume_reuses_the_journal_and_launches_nothing(tmp_path, capsys):
    experiment = _experiment(tmp_path, steps=100)
    first_code, first = _aa(tmp_path, experiment, "--runs", "3")
    dirs = _run_dirs(tmp_path)
    journal = (tmp_path / "state" / "fake" / "journal.jsonl").read_text()
    capsys.readouterr()
    code, again = _aa(tmp_path, experiment, "--runs", "3", "--resume")
    assert (code, again["verdict"], again["first_diff_step"]) == (
        first_code, first["verdict"], first["first_diff_step"])
    assert _run_dirs(tmp_path) == dirs
    assert (tmp_path / "state" / "fake" / "journal.jsonl").read_text() == journal
    assert all(run["reused"] for run in again["run_details"])
    assert "reused from the journal" in capsys.readouterr().out


def test_sigkill_of_the_orchestrator_loses_no_finished_run(tmp_path, capsys):
    experiment = _experiment(tmp_path, steps=100)
    journal = tmp_path / "state" / "fake" / "journal.jsonl"
    args = ["aa", str(experiment), "--state-dir", str(tmp_path / "state"), "--runs", "3",
            "--mask", "all-off"]
    proc = subprocess.Popen([sys.executable, "-m", "bisect_prefetch.cli", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # Kill it hard once the first run is journaled and the second has started.
        deadline = time.monotonic() + 60
        while not (journal.exists() and journal.read_text().count("\n") >= 1
                   and len(_run_dirs(tmp_path)) >= 2):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        proc.kill()
    finally:
        proc.wait(timeout=10)
    first_run = json.loads(journal.read_text().splitlines()[0])["run_id"]
    code, result = _aa(tmp_path, experiment, "--runs", "3", "--mask", "all-off", "--resume")
    assert code == 0 and result["verdict"] == "consistent"
    details = result["run_details"]
    assert details[0]["run_id"] == first_run and details[0]["reused"]
    assert [d["reused"] for d in details[1:]] == [False, False]
    assert len(journal.read_text().splitlines()) == 3
    assert job_processes(str(tmp_path / "state")) == []


def test_second_orchestrator_on_the_same_state_is_refused(tmp_path, capsys):
    with StateDir(tmp_path / "state", "fake"):
        code, _ = _aa(tmp_path, _experiment(tmp_path))
    assert code == 2
    assert "is in use by another bisect-prefetch" in capsys.readouterr().err


def test_command_that_does_not_exist(tmp_path, capsys):
    path = tmp_path / "nocmd.yaml"
    path.write_text("name: nocmd\ncommand: [no-such-trainer-xyz]\n"
                    "graph: {source: static, policy: fsdp2-chain, layers: 2}\n")
    code, _ = _aa(tmp_path, path)
    assert code == 2
    assert "command not found: no-such-trainer-xyz" in capsys.readouterr().err


def test_environment_drift_is_reported_apart(tmp_path):
    experiment = load_experiment(_experiment(tmp_path))
    kwargs = {"mask": frozenset(), "runs": 2, "steps": 8, "guard": "none"}
    with StateDir(tmp_path / "state", "fake") as state:
        first = run_group(Runner(experiment, state).open(), **kwargs)
        assert first.verdict == "consistent" and first.environment_drift == []
        env_path = state.run_dir(first.runs[1].run_id) / ENV_FILE
        env = json.loads(env_path.read_text())
        env["orchestrator"]["variables"]["OMP_NUM_THREADS"] = "2"  # a job with no framework: no print of its own
        env_path.write_text(json.dumps(env))
        # The first group's runs taken again (--reuse), their prints compared with the new.
        again = run_group(Runner(experiment, state, scope=Scope("aa", earlier=True)).open(),
                          **kwargs)
    assert len(again.environment_drift) == 1
    assert again.environment_drift[0].startswith("variables.OMP_NUM_THREADS:")


def test_graph_command_discovers_the_graph_of_the_job_as_it_is_now(tmp_path, capsys):
    experiment = _experiment(tmp_path, extra="").read_text().replace(
        "{source: static, policy: fsdp2-chain, layers: 2}", "{source: runtime}")
    path = tmp_path / "runtime.yaml"
    path.write_text(experiment)
    args = ["graph", str(path), "--format", "json", "--state-dir", str(tmp_path / "state")]
    assert main(args) == 0
    first = capsys.readouterr()
    # Narration on stderr, so stdout is the graph alone: pipe-able JSON.
    assert "discovering the prefetch graph" in first.err
    assert [n["name"] for n in json.loads(first.out)["nodes"]] == ["layers.0", "layers.1"]
    assert main(args) == 0  # no run of an earlier command is taken: the job may have changed
    assert "discovering the prefetch graph" in capsys.readouterr().err
    assert len(_run_dirs(tmp_path)) == 2


def test_failed_discovery_is_a_clear_error(tmp_path, capsys):
    text = _experiment(tmp_path, "crash").read_text().replace(
        "{source: static, policy: fsdp2-chain, layers: 2}", "{source: runtime}")
    path = tmp_path / "runtime.yaml"
    path.write_text(text)
    assert main(["graph", str(path), "--state-dir", str(tmp_path / "state")]) == 2
    err = capsys.readouterr().err
    assert "graph discovery run 0001-discover ended in error (exit code 3)" in err


def test_config_is_copied_with_overrides(tmp_path):
    (tmp_path / "train.yaml").write_text("training:\n  seed: 1\n  steps: 5\nmodel: {layers: 2}\n")
    path = tmp_path / "cfg.yaml"
    path.write_text("name: cfg\ncommand: [train, --config, '{config}']\nconfig: train.yaml\n"
                    "overrides: {training.seed: 42, model.dropout: 0.0}\n"
                    "graph: {source: static, policy: fsdp2-chain, layers: 2}\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    copied = write_config(load_experiment(path), run_dir, steps=5)
    import yaml

    assert yaml.safe_load(copied.read_text()) == {
        "training": {"seed": 42, "steps": 5}, "model": {"layers": 2, "dropout": 0.0}}
    assert (tmp_path / "train.yaml").read_text().startswith("training:\n  seed: 1")
