"""The launcher with small real jobs: exits, crashes, hangs, stubborn children, early stop."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.runs.job_path import ADAPTER_SITE, PACKAGE_PARENT, write_adapter_tree
from bisect_prefetch.runs.launcher import (
    JobSpec,
    free_port,
    job_env,
    run_job,
)
from bisect_prefetch.runs.procs import kill_leftovers, marked_processes


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


def _job(tmp_path: Path, body: str, **kw) -> JobSpec:
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(body))
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    kw.setdefault("timeout_s", 20)
    kw.setdefault("grace_s", 1.0)
    return JobSpec(argv=[sys.executable, str(script)], run_dir=run_dir, env=dict(os.environ), **kw)


WRITE_METRICS = """
import json, sys
with open("metrics.jsonl", "a") as f:
    for step in range(1, 4):
        f.write(json.dumps({"step": step, "rank": 0, "loss": 1.0 / step}) + "\\n")
print("trained")
"""


def test_ok_job_records_status_and_logs(tmp_path):
    spec = _job(tmp_path, WRITE_METRICS)
    result = run_job(spec)
    assert result.outcome == "ok"
    assert result.exit_code == 0
    assert result.first_progress_s is not None and result.first_progress_s <= result.wall_s
    assert (spec.run_dir / "stdout.log").read_text() == "trained\n"
    status = json.loads((spec.run_dir / "status.json").read_text())
    assert status["outcome"] == "ok" and status["argv"] == spec.argv


def test_crash_is_an_error(tmp_path):
    spec = _job(tmp_path, WRITE_METRICS + "\nraise SystemExit(3)\n")
    result = run_job(spec)
    assert result.outcome == "error"
    assert result.exit_code == 3
    assert "exit code 3" in result.reason


def test_exit_zero_without_metrics_is_an_error(tmp_path):
    result = run_job(_job(tmp_path, "print('nothing to see')\n"))
    assert result.outcome == "error"
    assert result.reason == "no metrics written"


def test_wall_timeout_kills_a_hang(tmp_path):
    spec = _job(tmp_path, "import time\ntime.sleep(60)\n", timeout_s=0.5)
    start = time.monotonic()
    result = run_job(spec)
    assert result.outcome == "timeout"
    assert "timed out" in result.reason
    assert time.monotonic() - start < 5


STUBBORN = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"])
with open("pids", "w") as f:
    f.write(f"{os.getpid()} {child.pid}\\n")
time.sleep(120)
"""


def _pids_written(spec: JobSpec):
    """Progress = the pid file: the hang timer starts once the job has written it, however slow
    its start-up on a loaded machine."""
    pids = spec.run_dir / "pids"
    return lambda: pids.stat().st_size if pids.exists() else 0


def test_timeout_kills_the_whole_group_even_ignoring_sigterm(tmp_path):
    spec = _job(tmp_path, STUBBORN, no_progress_timeout_s=1.0, grace_s=0.3)
    result = run_job(spec, progress=_pids_written(spec))
    assert result.outcome == "timeout"
    pids = [int(p) for p in (spec.run_dir / "pids").read_text().split()]
    assert len(pids) == 2
    assert not any(_alive(p) for p in pids), "a process of the job survived"


ORPHAN = """
import json, os, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
open("pids", "w").write(str(child.pid))
with open("metrics.jsonl", "a") as f:
    f.write(json.dumps({"step": 1, "rank": 0, "loss": 1.0}) + "\\n")
"""


def test_children_left_behind_by_a_finished_job_are_killed(tmp_path):
    spec = _job(tmp_path, ORPHAN)
    result = run_job(spec)
    assert result.outcome == "ok"
    child = int((spec.run_dir / "pids").read_text())
    deadline = time.monotonic() + 2
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def test_no_progress_timeout(tmp_path):
    body = WRITE_METRICS + "\nimport time\ntime.sleep(60)\n"
    spec = _job(tmp_path, body, timeout_s=30, no_progress_timeout_s=1.0)
    result = run_job(spec)
    assert result.outcome == "timeout"
    assert "no progress" in result.reason
    assert result.wall_s < 10


SLOW_STEPS = """
import json, time
for step in range(1, 200):
    with open("metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": step, "rank": 0, "loss": 1.0}) + "\\n")
    time.sleep(0.05)
"""


def test_should_stop_stops_early(tmp_path):
    spec = _job(tmp_path, SLOW_STEPS)
    metrics = spec.run_dir / "metrics.jsonl"

    def lines() -> int:
        return len(metrics.read_text().splitlines()) if metrics.exists() else 0

    result = run_job(spec, should_stop=lambda: lines() >= 3)
    assert result.outcome == "stopped-early"
    time.sleep(0.3)
    assert lines() < 20, "the job kept running after the stop"


def test_command_that_does_not_exist(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    spec = JobSpec(argv=["no-such-command-xyz", "--flag"], run_dir=run_dir,
                   env=dict(os.environ), timeout_s=5)
    with pytest.raises(BisectPrefetchError, match="command not found: no-such-command-xyz"):
        run_job(spec)


def test_run_dir_that_is_not_writable(tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    spec = JobSpec(argv=[sys.executable, "-c", "pass"], run_dir=not_a_dir,
                   env=dict(os.environ), timeout_s=5)
    with pytest.raises(BisectPrefetchError, match="not writable"):
        run_job(spec)


def test_job_env_pins_threads_and_puts_the_adapter_first():
    base = {"PATH": "/bin", "OMP_NUM_THREADS": "8", "PYTHONPATH": "/users/lib"}
    env = job_env(plan_path=Path("/r/plan.json"), experiment_env={}, base=base)
    assert env["OMP_NUM_THREADS"] == "1"
    assert env["BISECT_PREFETCH_PLAN"] == "/r/plan.json"
    assert env["PYTHONPATH"].split(os.pathsep) == [str(ADAPTER_SITE), str(PACKAGE_PARENT), "/users/lib"]


def test_a_users_job_gets_the_adapter_tree_alone(tmp_path):
    tree = write_adapter_tree(tmp_path)
    env = job_env(plan_path=tmp_path / "plan.json", experiment_env={}, base={"PYTHONPATH": "/users/lib"},
                  adapter_paths=[tree])
    assert env["PYTHONPATH"].split(os.pathsep) == [str(tree), "/users/lib"]
    # Only what runs inside the job: the site hook, the package's root files, adapters/.
    files = sorted(str(p.relative_to(tree)) for p in tree.rglob("*") if p.is_file())
    assert "sitecustomize.py" in files and "bisect_prefetch/vocab.py" in files
    assert "bisect_prefetch/adapters/fsdp2.py" in files
    outside = [f for f in files if f != "sitecustomize.py" and not f.startswith(
        ("bisect_prefetch/adapters/", "bisect_prefetch/__init__.py", "bisect_prefetch/vocab.py"))]
    assert outside == []
    assert not any(p.is_symlink() for p in tree.rglob("*"))


def test_job_env_experiment_settings_win_over_pins():
    env = job_env(plan_path=Path("p"), base={"PYTHONPATH": "/shell"},
                  experiment_env={"OMP_NUM_THREADS": "4", "PYTHONPATH": "/exp"})
    assert env["OMP_NUM_THREADS"] == "4"
    assert env["PYTHONPATH"].split(os.pathsep)[2:] == ["/exp"]


def test_free_ports_are_usable():
    port = free_port()
    assert 1024 <= port <= 65535


ESCAPING_CHILD = """
import os, signal, subprocess, sys, time
# Like torchrun's and msrun's workers: a session of its own, deaf to SIGTERM.
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"],
    start_new_session=True)
open("pids", "w").write(str(child.pid))
time.sleep(120)
"""


def _with_plan(spec: JobSpec) -> JobSpec:
    # The launcher marks a run's processes with its plan path; give this job one.
    spec.env["BISECT_PREFETCH_PLAN"] = str(spec.run_dir / "plan.json")
    return spec


def _wait_for(path: Path, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)


def test_workers_in_their_own_session_are_killed_too(tmp_path):
    spec = _with_plan(_job(tmp_path, ESCAPING_CHILD, no_progress_timeout_s=1.0, grace_s=0.3))
    result = run_job(spec, progress=_pids_written(spec))
    assert result.outcome == "timeout"
    child = int((spec.run_dir / "pids").read_text())
    assert not _alive(child), "a worker in its own session survived"


SCRUBBED_CHILD = """
import json, os, subprocess, sys, time
# A child that leaves every trace but the process tree: a session of its own (setsid), an
# empty environment (env -i, so no plan entry), its parent gone at once (sh exits).
sleeper = "import os, time; open('pids', 'w').write(str(os.getpid())); time.sleep(120)"
subprocess.run(["sh", "-c", 'setsid env -i "$0" -c "$1" &', sys.executable, sleeper], check=True)
while not (os.path.exists("pids") and open("pids").read()):
    time.sleep(0.02)
with open("metrics.jsonl", "a") as f:
    f.write(json.dumps({"step": 1, "rank": 0, "loss": 1.0}) + "\\n")
"""


@pytest.mark.parametrize("how", ["finished", "timeout"])
def test_a_child_in_its_own_session_with_a_scrubbed_environment_does_not_outlive_the_run(
        tmp_path, how):
    body = SCRUBBED_CHILD + ("time.sleep(120)\n" if how == "timeout" else "")
    spec = _with_plan(_job(tmp_path, body, no_progress_timeout_s=2.0, grace_s=0.3))
    result = run_job(spec, progress=_pids_written(spec))
    assert result.outcome == ("ok" if how == "finished" else "timeout"), result
    child = int((spec.run_dir / "pids").read_text())
    survived = _alive(child)
    if survived:
        os.kill(child, signal.SIGKILL)  # leave nothing behind for the next test
    assert not survived, "a child in its own session, with no environment, survived"


ORCHESTRATOR = """
import os, sys
from pathlib import Path
from bisect_prefetch.runs.launcher import JobSpec, run_job
run_dir = Path(sys.argv[1])
env = dict(os.environ, BISECT_PREFETCH_PLAN=str(run_dir / "plan.json"))
run_job(JobSpec(argv=[sys.executable, sys.argv[2]], run_dir=run_dir, env=env,
                timeout_s=60, grace_s=0.5))
"""


def test_ctrl_c_of_the_orchestrator_kills_the_job(tmp_path):
    spec = _job(tmp_path, ESCAPING_CHILD)
    orchestrator = tmp_path / "orchestrator.py"
    orchestrator.write_text(ORCHESTRATOR)
    proc = subprocess.Popen([sys.executable, str(orchestrator), str(spec.run_dir), spec.argv[1]],
                            stderr=subprocess.PIPE, text=True)
    _wait_for(spec.run_dir / "pids")
    child = int((spec.run_dir / "pids").read_text())
    assert _alive(child)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert "KeyboardInterrupt" in err
    assert not _alive(child)


def test_leftovers_of_a_killed_orchestrator_are_found_by_their_plan(tmp_path):
    runs = tmp_path / "state" / "runs"
    env = dict(os.environ, BISECT_PREFETCH_PLAN=str(runs / "0001-x" / "plan.json"))
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=env,
                              start_new_session=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                             env=dict(os.environ, BISECT_PREFETCH_PLAN=str(tmp_path / "elsewhere")),
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while orphan.pid not in marked_processes(f"BISECT_PREFETCH_PLAN={runs}/", prefix=True):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        killed = kill_leftovers(f"BISECT_PREFETCH_PLAN={runs}/")
        assert killed == [orphan.pid]
        assert orphan.wait(timeout=10) != 0
        assert other.poll() is None
    finally:
        for p in (orphan, other):
            p.kill()
            p.wait()


def _builtin(tmp_path: Path, workload: str):
    from bisect_prefetch.experiment import load_experiment

    path = tmp_path / "exp.yaml"
    path.write_text(f"name: w\nworkload: {workload}\nseed: 7\n")
    return load_experiment(path)


def test_fsdp2_argv_starts_its_ranks_with_the_fault(tmp_path):
    from bisect_prefetch.runs.workloads import argv_template, render_argv

    exp = _builtin(tmp_path, '{builtin: fsdp2, layers: 4, world_size: 2, '
                             'fault: {edge: "bwd:layers.1->layers.0", hazard: 0.5}}')
    argv = render_argv(argv_template(exp, steps=12), {"port": 29555})
    assert argv[:3] == [sys.executable, "-m", "bisect_prefetch.workloads.local_ranks"]
    assert "--nproc=2" in argv and "--master-port=29555" in argv
    tail = argv[argv.index("bisect_prefetch.workloads.fsdp2") + 1:]
    assert tail == ["--layers", "4", "--steps", "12", "--seed", "7",
                    "--fault-edge", "bwd:layers.1->layers.0", "--fault-hazard", "0.5"]


def test_fsdp2_argv_passes_compute_ms_only_when_set(tmp_path):
    from bisect_prefetch.runs.workloads import argv_template

    timed = _builtin(tmp_path, "{builtin: fsdp2, layers: 2, compute_ms: 30}")
    tail = argv_template(timed, steps=3)
    assert tail[tail.index("--compute-ms") + 1] == "30.0"
    plain = _builtin(tmp_path, "{builtin: fsdp2, layers: 2}")
    assert "--compute-ms" not in argv_template(plain, steps=3)


def test_mindspore_argv_runs_msrun_with_python_module(tmp_path):
    from bisect_prefetch.runs.workloads import argv_template, render_argv, workload_env

    exp = _builtin(tmp_path, "{builtin: mindspore, layers: 2, world_size: 2}")
    argv = render_argv(argv_template(exp, steps=3), {"port": 1234, "rank_log_dir": "/r/logs"})
    assert argv[1:3] == ["-m", "mindspore.parallel.cluster.run"]
    assert "--log_dir=/r/logs" in argv and "--join=True" in argv
    assert any(a.startswith("--cluster_time_out=") for a in argv)
    assert argv[argv.index("python"):argv.index("python") + 3] == [
        "python", "-m", "bisect_prefetch.workloads.mindspore"]
    assert workload_env(exp)["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    one = _builtin(tmp_path, "{builtin: mindspore, world_size: 1}")
    assert argv_template(one, steps=3)[:3] == [sys.executable, "-m", "bisect_prefetch.workloads.mindspore"]


def test_template_values_stay_whole_arguments():
    from bisect_prefetch.runs.workloads import render_argv

    argv = render_argv(["train", "--out={run_dir}/x", "{config}", '{"json": {port}}', "{other}"],
                       {"run_dir": "/a b", "config": "c; rm -rf /", "port": 5})
    assert argv == ["train", "--out=/a b/x", "c; rm -rf /", '{"json": 5}', "{other}"]


def test_template_value_missing_for_this_run():
    from bisect_prefetch.runs.workloads import render_argv

    with pytest.raises(BisectPrefetchError, match=r"uses \{config\}"):
        render_argv(["train", "{config}"], {"port": 1})
