"""Runs as job steps of the Slurm allocation the tool runs in (real Slurm: tests/slurm_cluster.py).

Inside `salloc -N1 -n2` on the single-node Slurm (where a batch job per run used to wait
for the CPUs the allocation held): a bisection submits no batch job, every run (the golden
run and the search's) is a step of the allocation, and the edge is named. A tool killed hard
leaves its steps running under their sruns; the resumed tool stops them before it runs
again, and a SIGTERM scancels the steps in flight. On two nodes (each slurmd in a network
namespace of its own), `salloc -N2 --no-kill`: the stand-in job is bisected (golden run
and search, each a step); the second node dies mid-search (every process of it killed, its
slurmd first among them): its run is lost, journaled and run again on the first node, and
the edge is named. (Real FSDP2 over two nodes: tests/e2e/test_slurm_two_nodes.py; a node's
loss is the orchestrator's to handle, whatever the job trains.) A node taken down
under a run of two nodes leaves too few: the tool stops in one line, and --resume finishes
in a new allocation. Bad input inside an allocation is one line and exit 2, before any run.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.runs.executors import slurm
from bisect_prefetch.runs.executors.slurm import SlurmExecutor, SlurmOptions
from bisect_prefetch.runs.store import RunKey
from bisect_prefetch.vocab import USABLE_OUTCOMES
from tests.conftest import FAKE_JOB
from tests.slurm_cluster import TwoNodeCluster, running_two_node_cluster

RACY_EDGE = "bwd:layers.1->layers.0"  # the stand-in job's planted drift (tests/jobs/fake_job.py)
# A user's wrapper that notes which step of which allocation ran the command, on which node.
STEP_NOTE = "slurm_step"
RECORD_STEP = ["sh", "-c", f'echo "$SLURM_JOB_ID.$SLURM_STEP_ID $SLURMD_NODENAME" > "$0/{STEP_NOTE}" '
               '&& exec "$@"', "{run_dir}"]
GRANTED = re.compile(r"Granted job allocation (\d+)")
SEARCH_RUN = re.compile(r"-search-[ks]\d")  # a run of the search (not its golden run)


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "bisect_prefetch.cli", *args]


def experiment(tmp_path: Path, command: list[str], *, steps: int = 8, executor: str = "{kind: slurm}",
               name: str = "fake", graph: str = "{source: static, policy: fsdp2-chain, layers: 2}",
               metrics: str = "{format: jsonl, names: [loss]}") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(textwrap.dedent(f"""
        name: {name}
        command: {json.dumps(command)}
        metrics: {metrics}
        graph: {graph}
        steps: {steps}
        timeout_s: 240
        executor: {executor}
    """))
    return path


def records(state: Path, name: str = "fake") -> list[dict]:
    path = state / name / "journal.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def steps_of(state: Path, name: str, runs: list[dict]) -> list[tuple[str, str, str]]:
    """(allocation, step, node) each run's command noted."""
    notes = [(state / name / "runs" / r["run_id"] / STEP_NOTE).read_text().split() for r in runs]
    return [(*note[0].split("."), note[1]) for note in notes]


def tool_lines(stderr: str) -> list[str]:
    return [line for line in stderr.strip().splitlines() if not line.startswith("salloc:")]


def test_a_bisect_inside_salloc_runs_every_run_as_a_step_and_no_batch_job(slurm_cluster, tmp_path):
    exp = experiment(tmp_path, [*RECORD_STEP, sys.executable, str(FAKE_JOB), "clean"])
    state, out = tmp_path / "state", tmp_path / "out.json"
    done = subprocess.run(["salloc", "-N1", "-n2", *cli("bisect", str(exp), "--state-dir", str(state),
                                                         "--json", str(out))],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr  # 1: a culprit found
    data = json.loads(out.read_text())
    assert data["verdict"] == "culprit-found" and data["minimal_set"] == [RACY_EDGE]
    allocation = GRANTED.search(done.stderr).group(1)
    assert f"runs are job steps of Slurm allocation {allocation}" in done.stdout
    runs = records(state)
    assert any("-golden" in r["variant"] for r in runs) and len(runs) == data["runs_launched"]
    steps = steps_of(state, "fake", runs)
    assert {job for job, _, _ in steps} == {allocation}
    assert len({step for _, step, _ in steps}) == len(runs)  # a step of its own each
    # No batch job: neither a run nor the shared-filesystem check (a step too) was sbatch'd.
    shown = subprocess.run(["scontrol", "show", "job", "-o"], capture_output=True, text=True)
    later = [int(m) for m in re.findall(r"JobId=(\d+)", shown.stdout) if int(m) > int(allocation)]
    assert later == [], shown.stdout
    assert not (state / "fake" / "slurm-check" / "check.sbatch").exists()


def _steps_now(allocation: str) -> list[str]:
    """The allocation's run steps now (the shared-filesystem check step, which ends by
    itself within a second, left out)."""
    shown = subprocess.run(["squeue", "--steps", "-h", "-j", allocation, "-o", "%i %j"],
                           capture_output=True, text=True)
    return [line.split()[1] for line in shown.stdout.splitlines()
            if "bisect-prefetch-" in line and not line.endswith("-slurm-check")]


def _wait_for(condition, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if found := condition():
            return found
        time.sleep(0.1)
    raise AssertionError(f"{what} not seen within {seconds:g}s")


def test_a_killed_tool_s_steps_stop_on_resume_and_sigterm_scancels_steps(slurm_cluster, tmp_path):
    held = subprocess.run(["salloc", "--no-shell", "-N1"], capture_output=True, text=True, timeout=60)
    allocation = GRANTED.search(held.stderr).group(1)
    env = {**os.environ, "SLURM_JOB_ID": allocation}  # what salloc's shell holds
    exp = experiment(tmp_path, [sys.executable, str(FAKE_JOB), "clean"], steps=600)
    argv = cli("aa", str(exp), "--runs", "2", "--state-dir", str(tmp_path / "state"))
    try:
        first = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        running = _wait_for(lambda: _steps_now(allocation), 60, "the first run's step")
        first.kill()
        first.wait()
        time.sleep(1)
        assert _steps_now(allocation) == running  # its srun lives on, and so does the step

        second = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
        # The killed tool's srun is stopped before a run starts; the new run is a step of its own.
        _wait_for(lambda: (now := _steps_now(allocation)) and running[0] not in now, 60,
                  "the new run's step alone")
        second.send_signal(signal.SIGTERM)
        said = second.communicate(timeout=60)[0]
        assert second.returncode == 143, said
        assert re.search(r"killed \d+ process\(es\) left running by an earlier orchestrator", said)
        assert "to resume, run again:" in said
        _wait_for(lambda: _steps_now(allocation) == [], 10, "no step left")  # scancelled
    finally:
        subprocess.run(["scancel", allocation], capture_output=True)
    assert not (tmp_path / "state" / "fake" / "journal.jsonl").exists() or all(
        "submitted" not in r for r in records(tmp_path / "state"))  # steps journal no submission


# -- two nodes ---------------------------------------------------------------------------
def _inside(cluster: TwoNodeCluster, argv: list[str], tmp_path: Path) -> subprocess.Popen:
    """argv on the first node, as a user starts it there."""
    return subprocess.Popen(cluster.inside(argv), cwd=tmp_path, text=True,
                            env={**os.environ, **cluster.env, "OMP_NUM_THREADS": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _squeue_steps(cluster: TwoNodeCluster) -> list[list[str]]:
    shown = subprocess.run(cluster.inside(["squeue", "--steps", "-h", "-o", "%i %j %N"]),
                           env={**os.environ, **cluster.env}, capture_output=True, text=True)
    return [line.split() for line in shown.stdout.splitlines() if "bisect-prefetch-" in line]


def _node_of(run_dir: Path) -> str:
    """The node a run's step was placed on (its srun line), checked against the host its
    rank recorded where the run got that far."""
    node, = re.findall(r"--nodelist=(\S+)", (run_dir / "job.srun").read_text())
    if (env := run_dir / "env.rank0.json").exists():
        assert json.loads(env.read_text())["host"] == node
    return node


def test_a_node_lost_mid_search_costs_one_run_and_too_few_nodes_stop_until_resumed(tmp_path):
    with running_two_node_cluster(tmp_path / "slurm", slurmd_timeout_s=10) as cluster:
        # 1. One node a run, 6 edges: the second node dies under a search run. The golden
        # run and the search are steps of the allocation. 400 steps of 20 ms: a clean run
        # lasts about 8 s: the node is called failed about 25 s after its death, and the search
        # must still want the lost run then (3 s runs let it reach its verdict without it).
        exp = experiment(tmp_path, [sys.executable, str(FAKE_JOB), "clean"], steps=400,
                         name="lost", graph="{source: static, policy: fsdp2-chain, layers: 4}")
        state = tmp_path / "state"
        tool = _inside(cluster, ["salloc", "-N2", "--no-kill", *cli(
            "bisect", str(exp), "--state-dir", str(state), "--segments", "off",
            "--json", str(tmp_path / "lost.json"))], tmp_path)

        def clean_run_on_second_node() -> list[str] | None:
            # A run without the planted edge goes its full length: it is still running when
            # the node dies (a run that diverged is stopped at once, decided).
            for step in _squeue_steps(cluster):
                run_dir = state / "lost" / "runs" / step[1].removeprefix("bisect-prefetch-")
                if SEARCH_RUN.search(step[1]) and step[2] == cluster.nodes[1]:
                    if RACY_EDGE not in json.loads((run_dir / "plan.json").read_text())["mask"]:
                        return step
            return None

        victim = _wait_for(clean_run_on_second_node, 240, "a clean search run on the second node")
        cluster.kill_node(1)
        said, err = tool.communicate(timeout=600)
        assert tool.returncode == 1, said + err
        data = json.loads((tmp_path / "lost.json").read_text())
        assert data["verdict"] == "culprit-found" and data["minimal_set"] == [RACY_EDGE], said
        runs = records(state, "lost")
        lost = [r for r in runs if r["reason"].startswith("lost: node failure")]
        assert [r["run_id"] for r in lost] == [victim[1].removeprefix("bisect-prefetch-")], said
        assert cluster.nodes[1] in lost[0]["reason"] and len(data["runs_lost"]) == 1
        again = replace(RunKey.from_record(lost[0]), attempt=lost[0]["attempt"] + 1)
        retry = [r for r in runs if RunKey.from_record(r) == again]
        assert len(retry) == 1 and retry[0]["outcome"] in USABLE_OUTCOMES, said
        # Nothing lost from the journal: every run that started is there.
        started = sorted(p.name for p in (state / "lost" / "runs").iterdir())
        assert sorted(r["run_id"] for r in runs) == started
        host = {r["run_id"]: _node_of(state / "lost" / "runs" / r["run_id"]) for r in runs}
        assert host[retry[0]["run_id"]] == cluster.nodes[0]
        assert set(host.values()) == set(cluster.nodes)  # both nodes ran runs before the loss
        assert all(host[r["run_id"]] == cluster.nodes[0] for r in runs
                   if r["finished_at"] > lost[0]["finished_at"])

        # 2. Runs of two nodes: a node taken down leaves too few; --resume in a new allocation.
        cluster.start_slurmd(1)
        on_first = ["sh", "-c", 'if [ "$SLURM_NODEID" = 0 ]; then exec "$@"; else sleep 1; fi',
                    "sh", sys.executable, str(FAKE_JOB), "clean"]
        exp = experiment(tmp_path, on_first, steps=100, name="fake", executor="{kind: slurm, nodes: 2}")
        state = tmp_path / "state2"
        bisect = ["salloc", "-N2", "--no-kill", *cli("bisect", str(exp), "--state-dir", str(state))]
        tool = _inside(cluster, bisect, tmp_path)
        _wait_for(lambda: any(SEARCH_RUN.search(s[1]) for s in _squeue_steps(cluster)), 300,
                  "a search run")
        subprocess.run(cluster.inside(["scontrol", "update", f"nodename={cluster.nodes[1]}",
                                       "state=down", "reason=test"]),
                       env={**os.environ, **cluster.env}, check=True)
        said, err = tool.communicate(timeout=300)
        assert tool.returncode == 2, said + err
        line, = tool_lines(err)
        assert "holds 1 node(s) now (failed: bpnode2), too few for a run of 2" in line, line
        assert "to resume in a new allocation, run again: bisect-prefetch bisect" in line
        assert "--resume" in line
        assert records(state)[-1]["reason"].startswith("lost: node failure (bpnode2 left")
        # Back in service (ReturnToService=2 may have done it already, when `resume` fails);
        # the new allocation waits for it.
        subprocess.run(cluster.inside(["scontrol", "update", f"nodename={cluster.nodes[1]}",
                                       "state=resume"]), env={**os.environ, **cluster.env},
                       capture_output=True)
        tool = _inside(cluster, [*bisect, "--resume"], tmp_path)
        said, err = tool.communicate(timeout=300)
        assert tool.returncode == 1 and f"cause 1: {RACY_EDGE} (" in said, said + err
        assert "resuming: " in said


# -- bad input, one line each ------------------------------------------------------------
def test_bad_input_inside_an_allocation_is_one_line_and_exit_2(slurm_cluster, tmp_path):
    job = [sys.executable, str(FAKE_JOB), "clean"]
    for executor, words in (("{kind: slurm, nodes: 2}", "a run needs 2 nodes (executor.nodes) but "
                                                        "Slurm allocation"),
                            ("{kind: slurm, partition: gpu}", "executor.partition is gpu but Slurm "
                                                               "allocation"),
                            ("{kind: slurm, account: proj}", "executor.account is proj but Slurm "
                                                              "allocation")):
        exp = experiment(tmp_path, job, executor=executor)
        done = subprocess.run(["salloc", "-N1", *cli("aa", str(exp), "--state-dir",
                                                     str(tmp_path / "state"))],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stdout + done.stderr
        line, = tool_lines(done.stderr)
        assert words in line, line
        assert not (tmp_path / "state" / "fake" / "journal.jsonl").exists()
    # --executor local: refused where the tool is not on a node of the allocation (a login
    # node: here a host name of its own), taken on one.
    exp = experiment(tmp_path, job, executor="{kind: local}")
    aa = cli("aa", str(exp), "--runs", "2", "--mask", "all-off", "--state-dir", str(tmp_path / "state"))
    done = subprocess.run(["salloc", "-N1", "unshare", "--uts", "sh", "-c",
                           'hostname login-1 && exec "$@"', "sh", *aa],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    line, = tool_lines(done.stderr)
    assert "runs on login-1, which is not one of its nodes: --executor local would train here" in line
    assert not (tmp_path / "state" / "fake" / "journal.jsonl").exists()
    done = subprocess.run(["salloc", "-N1", *aa], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_check_job_that_never_started_is_said_as_that(slurm_cluster, tmp_path, monkeypatch):
    """Without an allocation (one batch job a run): the shared-filesystem check job waits
    behind a job that holds the whole node."""
    holder = subprocess.run(["sbatch", "--parsable", "--exclusive", "-N1", "-o", os.devnull,
                             "--wrap", "sleep 600"],
                            capture_output=True, text=True, check=True).stdout.strip()
    try:
        _wait_for(lambda: "RUNNING" in subprocess.run(
            ["scontrol", "show", "job", "-o", holder], capture_output=True, text=True).stdout,
            60, "the job that holds the node")
        # Pending past its limit: cancelled, and said as that.
        monkeypatch.setattr(slurm, "CHECK_TIMEOUT_S", 2.0)
        with pytest.raises(BisectPrefetchError, match=r"the Slurm check job \d+ did not start "
                                                      r"within 2s \(pending: Resources\)"):
            SlurmExecutor(SlurmOptions()).check(tmp_path / "pending")
        # Cancelled from outside before it started: said as that, not as a filesystem fault.
        exp = experiment(tmp_path, [sys.executable, str(FAKE_JOB), "clean"])
        tool = subprocess.Popen(cli("aa", str(exp), "--state-dir", str(tmp_path / "state")),
                                cwd=tmp_path, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

        def check_job() -> str | None:
            shown = subprocess.run(["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True)
            return next((line.split()[0] for line in shown.stdout.splitlines()
                         if line.endswith("bisect-prefetch-check")), None)

        subprocess.run(["scancel", _wait_for(check_job, 60, "the check job")], check=True)
        said, err = tool.communicate(timeout=60)
        assert tool.returncode == 2, said + err
        assert re.fullmatch(r"error: the Slurm check job \d+ ended before it started \(Slurm "
                            r"state CANCELLED\): nothing was checked; run the command again",
                            err.strip()), err
    finally:
        subprocess.run(["scancel", holder], capture_output=True)
