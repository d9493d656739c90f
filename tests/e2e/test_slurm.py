"""The slurm executor against a real single-node Slurm (tests/slurm_cluster.py).

A bisection through `executor: slurm` (of the stand-in job, tests/jobs/fake_job.py) names
the edge, and survives a SIGKILL of its orchestrator (`--resume` re-attaches to the job in
flight and submits no run twice). On the stand-in job too (what Slurm does with a run does
not depend on the engine inside it; real FSDP2 under Slurm: tests/e2e/test_slurm_two_nodes.py):
SIGTERM scancels the jobs in flight, a job cancelled from outside is retried and never
counted. Bad input fails in one line with exit 2 and an untouched journal. Never skipped:
`make test` installs slurm-wlm and munge first.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from bisect_prefetch.drivers.oracle import RealOracle
from bisect_prefetch.experiment import load_experiment
from bisect_prefetch.runs.execute import Runner
from bisect_prefetch.runs.store import RunKey, StateDir
from tests.conftest import HOSTILE_WORDS, oracle_run
from tests.jobs.fake_job import RANDOM_EDGE

QUIET_EDGE = "bwd:layers.2->layers.1"  # an edge of the stand-in's graph that drifts nothing
FAKE_JOB = Path(__file__).resolve().parents[1] / "jobs" / "fake_job.py"


def write_experiment(tmp_path: Path, *, executor: str) -> Path:
    """The FSDP2 workload through EXECUTOR, for input refused before any run."""
    path = tmp_path / "exp.yaml"
    path.write_text(
        "name: e2e\nworkload:\n  builtin: fsdp2\n  layers: 4\n  world_size: 1\n"
        f"steps: 10\nseed: 7\ntimeout_s: 240\nno_progress_timeout_s: 120\nexecutor: {executor}\n"
    )
    return path


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "bisect_prefetch.cli", *args]


def journal(state: Path) -> list[dict]:
    path = state / "e2e" / "journal.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def key_of(record: dict) -> RunKey:
    # The journal's own identity of a run: its steps too (the golden run is run again, longer,
    # when segments need it as long as the longest run) and a run of several masks' schedule.
    return RunKey.from_record(record)


def in_flight(records: list[dict]) -> list[dict]:
    finished = {r["run_id"] for r in records if "submitted" not in r}
    return [r for r in records if "submitted" in r and r["run_id"] not in finished]


def stand_in_experiment(tmp_path: Path, *, steps: int = 100, slots: int = 2) -> Path:
    """The stand-in job (tests/jobs/fake_job.py: its numbers drift while RANDOM_EDGE is on,
    20 ms a step) on a static 4-layer graph, through `executor: slurm`: what Slurm
    does with a search's runs does not depend on the engine inside them (real FSDP2 under
    Slurm: tests/e2e/test_slurm_two_nodes.py)."""
    argv = [sys.executable, str(FAKE_JOB), "clean"]
    path = tmp_path / "exp.yaml"
    path.write_text(f"name: e2e\ncommand: {json.dumps(argv)}\n"
                    "metrics: {format: jsonl, names: [loss]}\n"
                    "graph: {source: static, policy: fsdp2-chain, layers: 4}\n"
                    f"steps: {steps}\nseed: 7\ntimeout_s: 240\n"
                    f"executor: {{kind: slurm, slots: {slots}}}\n")
    return path


def test_bisect_through_slurm_resumes_after_sigkill_and_names_the_edge(slurm_cluster, tmp_path):
    exp = stand_in_experiment(tmp_path)
    state = tmp_path / "state"
    first = subprocess.Popen(cli("bisect", str(exp), "--state-dir", str(state), "--slots", "2"),
                             cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    deadline = time.monotonic() + 400
    # Kill hard while a search run's job is in flight, after a few runs finished.
    killed_during: list[dict] = []
    most_in_flight = 0  # the search keeps both slots busy
    while time.monotonic() < deadline and first.poll() is None:
        if (state / "e2e" / "journal.jsonl").exists():
            records = journal(state)
            finished = [r for r in records
                        if "submitted" not in r and r["variant"].startswith("search")]
            pending = [r for r in in_flight(records) if r["variant"].startswith("search")]
            most_in_flight = max(most_in_flight, len(pending))
            if len(finished) >= 3 and pending and most_in_flight >= 2:
                killed_during = pending
                break
        time.sleep(0.1)
    assert first.poll() is None, first.communicate()[0]
    os.kill(first.pid, signal.SIGKILL)
    first.wait(timeout=30)
    assert killed_during and most_in_flight == 2

    second = subprocess.run(cli("bisect", str(exp), "--state-dir", str(state), "--resume",
                                "--slots", "2", "--json", str(tmp_path / "out.json")),
                            cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert second.returncode == 1, second.stdout + second.stderr  # 1: a culprit found
    data = json.loads((tmp_path / "out.json").read_text())
    assert data["verdict"] == "culprit-found", second.stdout
    assert data["minimal_set"] == [RANDOM_EDGE]

    records = journal(state)
    submissions = [r for r in records if "submitted" in r]
    finished = [r for r in records if "submitted" not in r]
    # Every run was submitted once: no key and no job twice, and every run has one.
    twice = [key for key, n in Counter(key_of(r) for r in submissions).items() if n > 1]
    assert not twice, twice
    assert len({r["job_id"] for r in submissions}) == len(submissions)
    # A run in flight when the verdict came is cancelled, never journaled as finished.
    # So is a job of the killed orchestrator that the resumed search did not ask for again.
    unfinished = {r["run_id"] for r in submissions} - {r["run_id"] for r in finished}
    assert len(unfinished - {p["run_id"] for p in killed_during}) <= 1, unfinished
    # A job in flight at the kill was re-attached and collected, not run again (the
    # resumed search asks for the same runs: the journal replays its decisions).
    collected = [r for r in finished if r["run_id"] in {p["run_id"] for p in killed_during}]
    assert collected and all(key_of(r) in {key_of(p) for p in killed_during} for r in collected)
    assert "submitted by an earlier orchestrator have not been collected" in second.stdout
    # No job outlives the command: re-attached, collected, or cancelled.
    queue = subprocess.run(["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True)
    assert "bisect-prefetch" not in queue.stdout, queue.stdout
    assert data["runs_reused"] >= 3


def test_sigterm_scancels_the_jobs_in_flight_and_prints_the_resume_command(slurm_cluster,
                                                                           tmp_path):
    exp = stand_in_experiment(tmp_path, steps=1000)  # 20 s a run: both still running at the SIGTERM
    state = tmp_path / "state"
    proc = subprocess.Popen(cli("aa", str(exp), "--runs", "2", "--state-dir", str(state)),
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    deadline = time.monotonic() + 300
    pending: list[dict] = []
    while time.monotonic() < deadline and proc.poll() is None and len(pending) < 2:
        if (state / "e2e" / "journal.jsonl").exists():
            pending = [r for r in in_flight(journal(state)) if r["variant"].startswith("aa+")]
        time.sleep(0.1)
    assert len(pending) == 2, proc.communicate()[0]  # both runs in flight on the 2 slots
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 143, out
    assert "to resume, run again:" in out and "bisect-prefetch aa" in out
    queue = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True)
    assert not {r["job_id"] for r in pending} & set(queue.stdout.split()), queue.stdout


# A run cancelled once it reported steps: 200 steps of the stand-in, 4 s.
CANCELLED_STEPS = 200


def test_a_job_cancelled_from_outside_is_retried_and_never_counted(slurm_cluster, tmp_path):
    exp = load_experiment(stand_in_experiment(tmp_path, steps=CANCELLED_STEPS, slots=1))
    mask = frozenset({QUIET_EDGE})  # a clean run
    results = []
    with StateDir(tmp_path / "state", exp.name) as state:
        oracle = RealOracle(Runner(exp, state).open(), steps=CANCELLED_STEPS, guard="none",
                            max_retries=1)
        oracle.run_golden()
        worker = threading.Thread(target=lambda: results.append(oracle_run(oracle, mask)))
        worker.start()
        cancelled = None
        deadline = time.monotonic() + 120
        while cancelled is None and time.monotonic() < deadline:
            pending = [r for r in in_flight(journal(tmp_path / "state"))
                       if r["variant"].startswith("search+") and r["attempt"] == 0]
            if pending and (Path(state.run_dir(pending[0]["run_id"])) / "metrics.jsonl").exists():
                cancelled = pending[0]
                subprocess.run(["scancel", cancelled["job_id"]], check=True)
            time.sleep(0.1)
        worker.join(timeout=300)
    assert cancelled is not None
    runs = [r for r in journal(tmp_path / "state")
            if "submitted" not in r and r["variant"].startswith("search+")]
    assert [r["attempt"] for r in runs] == [0, 1]
    # Lost, not finished: an error (or truncated, when it had reported some steps).
    assert runs[0]["outcome"] in ("error", "truncated") and "CANCELLED" in runs[0]["reason"]
    assert runs[1]["outcome"] == "ok"
    assert results and results[0].outcome == "ok" and not results[0].diverged
    assert oracle.runs_launched == 3  # golden, the cancelled run and its retry
    assert len(oracle.runs_lost) == 1 and "CANCELLED" in oracle.runs_lost[0]


def test_an_aa_run_cancelled_from_outside_is_run_again(slurm_cluster, tmp_path):
    exp = stand_in_experiment(tmp_path, steps=CANCELLED_STEPS)
    state = tmp_path / "state"
    proc = subprocess.Popen(cli("aa", str(exp), "--runs", "2", "--state-dir", str(state),
                                "--mask", f"drop-only:{RANDOM_EDGE}",  # the stand-in's drift off
                                "--json", str(tmp_path / "aa.json")),
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    deadline = time.monotonic() + 300
    cancelled = None
    while cancelled is None and time.monotonic() < deadline and proc.poll() is None:
        if (state / "e2e" / "journal.jsonl").exists():
            for r in in_flight(journal(state)):
                if r["variant"].startswith("aa+") and (state / "e2e" / "runs" / r["run_id"] /
                                                       "metrics.jsonl").exists():
                    cancelled = r
                    subprocess.run(["scancel", r["job_id"]], check=True)
                    break
        time.sleep(0.1)
    out = proc.communicate(timeout=400)[0]
    assert cancelled is not None, out
    assert proc.returncode == 0, out  # consistent, from the two runs that were not lost
    data = json.loads((tmp_path / "aa.json").read_text())
    lost = [r for r in data["run_details"] if "lost: Slurm state CANCELLED" in r["reason"]]
    assert [r["run_id"] for r in lost] == [cancelled["run_id"]]
    assert lost[0]["outcome"] in ("error", "truncated")
    assert sum(r["outcome"] == "ok" for r in data["run_details"]) == 2


def test_a_failed_job_is_an_error_with_its_exit_code(slurm_cluster, tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(f"name: crash\ncommand: [{sys.executable}, -c, 'raise SystemExit(3)']\n"
                    "graph: {source: static, policy: fsdp2-chain, layers: 2}\nsteps: 2\n"
                    "timeout_s: 60\nexecutor: {kind: slurm}\n")
    exp = load_experiment(path)
    with StateDir(tmp_path / "state", exp.name) as state:
        runner = Runner(exp, state).open()
        out = runner.run(runner.key("aa", mask=None, guard="none", steps=2, index=0), label="x")
    assert out.outcome == "error" and out.exit_code == 3, out
    assert out.reason == "Slurm state FAILED, exit code 3"


def bad_input(tmp_path: Path, executor: str, **env: str) -> subprocess.CompletedProcess:
    exp = write_experiment(tmp_path, executor=executor)
    return subprocess.run(cli("aa", str(exp), "--state-dir", str(tmp_path / "state")),
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})


@pytest.mark.parametrize("executor, words", [
    ("{kind: slurm, partition: nosuchpartition}", "nosuchpartition"),
    ("{kind: slurm, nodes: 9}", "never start"),  # more nodes than the cluster has
])
def test_a_job_slurm_rejects_is_one_line_and_exit_2(slurm_cluster, tmp_path, executor, words):
    done = bad_input(tmp_path, executor)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], done.stderr
    assert not (tmp_path / "state" / "e2e" / "journal.jsonl").exists()


def test_a_state_dir_the_nodes_do_not_see_is_one_line_and_exit_2(slurm_cluster, tmp_path):
    # The orchestrator runs in a mount namespace of its own with a tmpfs over the
    # state dir: the job (started by slurmd, outside) cannot write where it reads.
    if subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode != 0:
        pytest.skip("this machine does not allow mount namespaces (unshare --mount)")
    exp = write_experiment(tmp_path, executor="{kind: slurm}")
    state = tmp_path / "state"
    state.mkdir()
    inner = shlex.join(cli("aa", str(exp), "--state-dir", str(state)))
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                           f"mount -t tmpfs tmpfs {shlex.quote(str(state))} && exec {inner}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "is not shared with the Slurm nodes" in lines[0], done.stderr
    assert str(state / "e2e") in lines[0]
    assert list(state.iterdir()) == []  # nothing reached the real state dir either


ARGV_JOB = """
import json, os, sys
out = json.load(open(os.environ["BISECT_PREFETCH_PLAN"]))["out_dir"]
with open(os.path.join(out, "argv.json"), "w") as f:
    json.dump(sys.argv[1:], f)
with open(os.path.join(out, "metrics.jsonl"), "w") as f:
    for step in (1, 2):
        f.write(json.dumps({"step": step, "loss": 1.0}) + "\\n")
"""
ARGV_WORDS = [*HOSTILE_WORDS, "--out={run_dir}/out dir", "tab\there", "back\\\\slash\\",
              "$HOME ${HOME} $(id) `id` $$ $? $!", "*", "~", "a;b&&c|d>e", "'", '"', "\\"]


def test_a_job_under_slurm_receives_exactly_the_argv_a_local_run_receives(slurm_cluster, tmp_path):
    """The same words (`$`, `$(...)`, `${...}`, quotes, backslashes, spaces,
    newlines) reach the job under Slurm as locally, and so does a state dir path full of
    them, through {run_dir}: nothing runs or expands on the node."""
    script = tmp_path / "argv_job.py"
    script.write_text(ARGV_JOB)
    received = {}
    for kind in ("local", "slurm"):
        root = tmp_path / kind / "state $(touch pwned) 'q' \"d\" ${HOME} `id` #x 100%j"
        path = tmp_path / f"{kind}.yaml"
        path.write_text(
            f"name: argv\ncommand: {json.dumps([sys.executable, str(script), *ARGV_WORDS])}\n"
            "metrics: {format: jsonl, names: [loss]}\n"
            "graph: {source: static, policy: fsdp2-chain, layers: 2}\n"
            f"steps: 2\ntimeout_s: 120\nexecutor: {{kind: {kind}}}\n")
        exp = load_experiment(path)
        with StateDir(root, exp.name) as state:
            runner = Runner(exp, state).open()
            out = runner.run(runner.key("aa", mask=None, guard="none", steps=2, index=0),
                             label=kind)
            assert out.outcome == "ok", out
            run_dir = str(state.run_dir(out.run_id).resolve())
            got = json.loads((state.run_dir(out.run_id) / "argv.json").read_text())
        received[kind] = [word.replace(run_dir, "<run_dir>") for word in got]
    assert received["local"] == [w.replace("{run_dir}", "<run_dir>") for w in ARGV_WORDS]
    assert received["slurm"] == received["local"]
    assert not list(tmp_path.rglob("pwned"))


