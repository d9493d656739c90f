"""A real `bisect-prefetch aa` process stopped mid-group, and a second one on the same state.

SIGINT (Ctrl-C) and SIGTERM (a scheduler's or CI's stop) must both stop
cleanly: the run in flight killed with all its processes, every finished
run in the journal, the lock released and the exact resume command printed;
running that command re-runs nothing that finished.
"""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bisect_prefetch.cli import main
from bisect_prefetch.vocab import MANIFEST_FILES
from tests.conftest import NAME, fake_job_experiment, job_processes, snapshot

RESUME_HINT = "interrupted: finished runs are in the journal; to resume, run again:"


def _start_aa(experiment: Path, state: Path, *args: str) -> subprocess.Popen:
    argv = [sys.executable, "-m", "bisect_prefetch.cli", "aa", str(experiment),
            "--state-dir", str(state), *args]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_until(condition, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            out, err = proc.communicate(timeout=10)
            pytest.fail(f"the orchestrator never got there (exit {proc.returncode}):\n{out}\n{err}")
        time.sleep(0.02)


def _run_dirs(state: Path) -> list[Path]:
    runs = state / NAME / "runs"
    return sorted(runs.iterdir()) if runs.exists() else []


def _second_run_is_training(state: Path) -> bool:
    """The first run is journaled and the second has written metrics: it is mid-run."""
    journal = state / NAME / "journal.jsonl"
    dirs = _run_dirs(state)
    return (journal.exists() and journal.read_text().count("\n") >= 1 and len(dirs) >= 2
            and (dirs[1] / "metrics.jsonl").exists())


@pytest.mark.parametrize("sig, exit_code, last_line", [
    (signal.SIGINT, 130, "interrupted"),
    (signal.SIGTERM, 143, "terminated"),
])
def test_stop_signal_mid_group_stops_cleanly_and_resumes(tmp_path, capsys, sig, exit_code,
                                                         last_line):
    state = tmp_path / "state"
    journal = state / NAME / "journal.jsonl"
    experiment = fake_job_experiment(tmp_path, steps=60)
    proc = _start_aa(experiment, state, "--runs", "3", "--mask", "all-off")
    _wait_until(lambda: _second_run_is_training(state), proc)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)

    assert proc.returncode == exit_code, err
    assert "Traceback" not in out + err
    assert err.splitlines()[-1] == last_line
    # The run in flight was killed with every process it had.
    assert job_processes(str(state)) == []
    # The journal holds exactly the finished run, every line whole.
    lines = journal.read_text().splitlines()
    assert len(lines) == 1
    finished = json.loads(lines[0])
    assert finished["outcome"] == "ok" and finished["index"] == 0
    # The exact command to resume, printed last.
    out_lines = out.splitlines()
    assert out_lines[-2] == RESUME_HINT
    resume = shlex.split(out_lines[-1])
    assert resume[:3] == ["bisect-prefetch", "aa", str(experiment)]

    # Running it again reuses the finished run and runs only what is missing.
    result_path = tmp_path / "aa.json"
    assert main([*resume[1:], "--json", str(result_path)]) == 0
    result = json.loads(result_path.read_text())
    assert result["verdict"] == "consistent"
    details = result["run_details"]
    assert [d["reused"] for d in details] == [True, False, False]
    assert details[0]["run_id"] == finished["run_id"]
    again = journal.read_text().splitlines()
    assert len(again) == 3 and again[0] == lines[0]
    assert "reused from the journal" in capsys.readouterr().out


def test_a_second_orchestrator_on_the_same_state_is_refused(tmp_path):
    state = tmp_path / "state"
    experiment = fake_job_experiment(tmp_path, "hang", timeout_s=120)
    first = _start_aa(experiment, state, "--mask", "all-off")
    try:
        # The first holds the lock and its first run is underway (hanging: nothing changes
        # once its process has begun its manifest).
        _wait_until(lambda: len(_run_dirs(state)) == 1
                    and any(_run_dirs(state)[0].glob(MANIFEST_FILES)), first)
        before = snapshot(state)
        second = subprocess.run(
            [sys.executable, "-m", "bisect_prefetch.cli", "aa", str(experiment),
             "--state-dir", str(state), "--mask", "all-off"],
            capture_output=True, text=True, timeout=60,
        )
        assert second.returncode == 2
        err_lines = second.stderr.splitlines()
        assert len(err_lines) == 1, second.stderr
        assert err_lines[0].startswith(f"error: state dir {state / NAME} is in use by another "
                                       f"bisect-prefetch (pid {first.pid})")
        # It wrote nothing, and left the first one's job running.
        assert snapshot(state) == before
        assert job_processes(str(state)) != []
        assert first.poll() is None
    finally:
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=30)
    assert first.returncode == 130
    assert job_processes(str(state)) == []
