"""The local executor: slots that run at once, each with its own device set.

Real processes; the slurm executor's tests run against a real Slurm in
test_slurm.py.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.experiment import ExecutorConfig, Experiment, load_experiment
from bisect_prefetch.runs.executors import LocalExecutor, make_executor, with_executor
from bisect_prefetch.runs.executors.base import Job
from bisect_prefetch.runs.launcher import JobSpec, job_env

JOB = """
import json, os, sys, time
time.sleep(float(sys.argv[1]))
with open("metrics.jsonl", "w") as f:
    f.write(json.dumps({"step": 1, "loss": 1.0}) + "\\n")
with open("devices.json", "w") as f:
    json.dump({k: os.environ.get(k) for k in
               ("CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES", "OMP_NUM_THREADS")}, f)
"""


def job(tmp_path: Path, name: str, seconds: float) -> Job:
    run_dir = tmp_path / name
    run_dir.mkdir()
    plan = run_dir / "plan.json"
    plan.write_text("{}")
    env = job_env(plan_path=plan, experiment_env={})
    return Job(spec=JobSpec(argv=[sys.executable, "-c", JOB, str(seconds)], run_dir=run_dir,
                            env=env, timeout_s=60))


def wait(executor: LocalExecutor, job_ids: list[str]) -> dict:
    results = {}
    while len(results) < len(job_ids):
        for job_id in job_ids:
            if job_id not in results and (result := executor.poll(job_id)) is not None:
                results[job_id] = result
        time.sleep(0.02)
    return results


def test_two_slots_run_at_once_each_with_its_own_devices(tmp_path):
    executor = LocalExecutor(slots=2, devices_per_slot=2)
    start = time.monotonic()
    ids = [executor.submit(job(tmp_path, f"r{i}", 1.5)) for i in range(2)]
    results = wait(executor, ids)
    wall = time.monotonic() - start
    assert [r.outcome for r in results.values()] == ["ok", "ok"]
    assert wall < 2 * 1.5, f"the two jobs did not overlap ({wall:.1f}s)"
    seen = [json.loads((tmp_path / f"r{i}" / "devices.json").read_text()) for i in range(2)]
    assert seen[0] == {"CUDA_VISIBLE_DEVICES": "0,1", "ASCEND_RT_VISIBLE_DEVICES": "0,1",
                       "OMP_NUM_THREADS": "1"}
    assert seen[1]["CUDA_VISIBLE_DEVICES"] == "2,3" == seen[1]["ASCEND_RT_VISIBLE_DEVICES"]
    assert seen[1]["OMP_NUM_THREADS"] == "1"  # the same pins in every slot


def test_a_freed_slot_takes_the_next_job_and_cancel_is_an_error(tmp_path):
    executor = LocalExecutor(slots=1)
    first = executor.submit(job(tmp_path, "a", 30))
    executor.cancel(first)
    result = executor.poll(first)
    assert result.outcome == "error" and result.reason == "cancelled"
    second = executor.submit(job(tmp_path, "b", 0))  # the slot is free again
    assert wait(executor, [second])[second].outcome == "ok"


def test_executor_flags_replace_the_experiment_keys():
    exp = Experiment(name="x", command=["true"],
                     executor=ExecutorConfig(kind="slurm", slots=4, partition="gpu"))
    assert with_executor(exp, slots=2).executor.partition == "gpu"
    assert with_executor(exp, slots=2).executor.slots == 2
    local = with_executor(exp, kind="local")
    assert local.executor.kind == "local" and local.executor.slots == 4
    assert make_executor(local.executor).slots == 4


def test_slurm_keys_on_a_local_executor_are_an_error(tmp_path):
    path = tmp_path / "e.yaml"
    path.write_text("name: x\ncommand: [\"true\"]\nexecutor: {kind: local, partition: gpu}\n")
    with pytest.raises(BisectPrefetchError, match="partition.*local"):
        load_experiment(path)


def test_an_aa_group_runs_over_the_local_slots_at_once(tmp_path):
    from bisect_prefetch.drivers.group import run_group
    from bisect_prefetch.runs.execute import Runner
    from bisect_prefetch.runs.store import StateDir
    from tests.conftest import fake_job_experiment

    # 40 steps of 20 ms: about a second a run, most of it in the job.
    exp = load_experiment(fake_job_experiment(tmp_path, steps=40))
    walls = {}
    for slots in (1, 3):
        experiment = with_executor(exp, kind="local", slots=slots)
        with StateDir(tmp_path / f"state{slots}", exp.name) as state:
            start = time.monotonic()
            group = run_group(Runner(experiment, state).open(), mask=frozenset(), runs=3, steps=40,
                              guard="none")
            walls[slots] = time.monotonic() - start
            assert group.verdict == "consistent", group.reason
            assert [run.outcome for run in group.runs] == ["ok", "ok", "ok"]
            assert len(state.records()) == 3
    assert walls[3] < walls[1] * 0.8, walls


def test_a_matrix_file_may_give_the_executor_of_its_cells(tmp_path):
    from bisect_prefetch.experiment import load_matrix

    path = tmp_path / "m.yaml"
    path.write_text("experiment: {name: x, command: [\"true\"]}\n"
                    "executor: {kind: slurm, slots: 6, partition: gpu}\n"
                    "cells: [{name: a, mask: all-on, runs: 2, expect: consistent}]\n")
    matrix = load_matrix(path)
    assert matrix.experiment.executor.kind == "slurm"
    assert matrix.experiment.executor.slots == 6 and matrix.experiment.executor.partition == "gpu"


def test_a_bisection_on_three_slots_names_the_edge_and_replays_exactly(tmp_path):
    import subprocess

    from tests.conftest import fake_job_experiment

    exp = fake_job_experiment(tmp_path)
    state = tmp_path / "state"

    def bisect(*extra: str) -> dict:
        out = tmp_path / f"out{len(extra)}.json"
        done = subprocess.run([sys.executable, "-m", "bisect_prefetch.cli", "bisect", str(exp),
                               "--slots", "3", "--state-dir", str(state), "--json", str(out),
                               *extra], cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert done.returncode == 1, done.stdout + done.stderr
        said.append(done.stdout)
        return json.loads(out.read_text())

    said: list[str] = []
    first = bisect()
    # The slots path narrates as the serial one: each step's `->` verdict line (naming its
    # step: steps interleave here), and "run N" is the N-th run line.
    assert "  -> checking that all-on diverges: diverged at run " in said[0]
    assert "  -> ruling out drift without prefetch as strong as the answer's" in said[0]
    from tests.commands.test_stress import assert_runs_named_by_their_lines
    assert_runs_named_by_their_lines(said[0])
    assert first["verdict"] == "culprit-found"
    assert first["minimal_set"] == ["bwd:layers.1->layers.0"]  # the fake job's random edge
    again = bisect("--resume")
    # Finished runs come back in the order they finished: the same decisions, no new run.
    assert again["runs_launched"] == 0
    assert again["evidence"] == first["evidence"]
    assert again["minimal_set"] == first["minimal_set"]
