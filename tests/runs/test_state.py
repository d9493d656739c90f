"""runs/state.py, the start every command shares: lock, repairs, leftovers, graph."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest

from bisect_prefetch.adapters.plan import PLAN_ENV
from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.experiment import load_experiment
from bisect_prefetch.runs.execute import Runner
from bisect_prefetch.runs.state import open_state
from bisect_prefetch.runs.store import StateDir
from tests.conftest import (
    NAME,
    console,
    fake_job_experiment,
    job_processes,
    snapshot,
    write_experiment,
)


def test_a_clean_state_dir_says_nothing_and_finds_the_static_graph(tmp_path):
    experiment = load_experiment(fake_job_experiment(tmp_path))
    out = io.StringIO()
    with open_state(experiment, tmp_path / "state", console=console(out)) as opened:
        assert opened.path == (tmp_path / "state" / NAME).resolve()
        assert opened.graph().edge_ids() == [
            "fwd:layers.0->layers.1", "bwd:layers.1->layers.0"]
    assert out.getvalue() == ""


def test_repairs_and_killed_leftovers_are_reported(tmp_path):
    experiment = load_experiment(fake_job_experiment(tmp_path))
    state_dir = tmp_path / "state"
    with open_state(experiment, state_dir):
        pass
    journal = state_dir / NAME / "journal.jsonl"
    journal.write_text('{"v": 1, "variant": "aa@x", "mask"')  # a kill tore the only line
    # A job of an orchestrator that was SIGKILLed: still running, its plan under this state dir.
    plan = state_dir / NAME / "runs" / "0001-aa" / "plan.json"
    leftover = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                env={PLAN_ENV: str(plan)})
    try:
        out = io.StringIO()
        with open_state(experiment, state_dir, console=console(out)) as opened:
            assert opened.runner.killed_leftovers == [leftover.pid]
        assert leftover.wait(timeout=10) != 0
    finally:
        leftover.kill()
    assert out.getvalue().splitlines() == [
        "note: the journal's last line was torn by a kill and was dropped",
        "note: killed 1 process(es) left running by an earlier orchestrator that was killed",
    ]
    assert journal.read_text() == ""
    assert job_processes(str(state_dir)) == []


def test_a_second_holder_is_refused(tmp_path):
    experiment = load_experiment(fake_job_experiment(tmp_path))
    with open_state(experiment, tmp_path / "state"):
        with pytest.raises(BisectPrefetchError, match="is in use by another bisect-prefetch"):
            with open_state(experiment, tmp_path / "state"):
                pass


def test_a_runner_does_nothing_until_it_is_opened(tmp_path):
    """Making a Runner neither kills leftovers nor checks the command nor writes a file;
    open() does all of that, and a run cannot be keyed before it."""
    experiment = load_experiment(write_experiment(tmp_path, ["no-such-trainer-xyz"]))
    with StateDir(tmp_path / "state", experiment.name) as state:
        plan = state.runs_path / "0001-aa" / "plan.json"
        leftover = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                    env={PLAN_ENV: str(plan)})
        try:
            before = snapshot(state.path)
            runner = Runner(experiment, state)
            assert snapshot(state.path) == before
            assert leftover.poll() is None  # still running: nothing was stopped
            with pytest.raises(RuntimeError, match="open"):
                runner.key("aa", mask=None, guard="none", steps=8, index=0)
            with pytest.raises(BisectPrefetchError, match="command not found: no-such-trainer-xyz"):
                runner.open()
            assert runner.killed_leftovers == [leftover.pid]
            assert leftover.wait(timeout=10) != 0
        finally:
            leftover.kill()
