"""The built-in workloads' rank starter (workloads/local_ranks.py), on real processes:
torchrun's variables for one node, a failing rank stops its peers, signals reach the ranks."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

STARTER = [sys.executable, "-m", "bisect_prefetch.workloads.local_ranks"]
REPO = Path(__file__).resolve().parents[2]


def start(tmp_path: Path, nproc: int, code: str) -> subprocess.Popen:
    return subprocess.Popen([*STARTER, f"--nproc={nproc}", "--master-port=29111", "--",
                             "-c", code], cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(REPO)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_every_rank_gets_torchruns_variables_for_one_node(tmp_path):
    code = ("import os; names = ('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE', "
            "'GROUP_RANK', 'MASTER_ADDR', 'MASTER_PORT'); "
            "open('rank' + os.environ['RANK'], 'w').write(' '.join(os.environ[k] for k in names))")
    proc = start(tmp_path, 3, code)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    for rank in range(3):
        assert (tmp_path / f"rank{rank}").read_text() == f"{rank} {rank} 3 3 0 127.0.0.1 29111"


def test_a_failing_rank_stops_its_peers_and_its_code_is_the_jobs(tmp_path):
    # Rank 1 fails at once; rank 0 would wait for an hour (a peer stuck in a collective).
    code = ("import os, sys, time; r = int(os.environ['RANK'])\n"
            "if r == 0: open('rank0.pid', 'w').write(str(os.getpid())); time.sleep(3600)\n"
            "while not os.path.exists('rank0.pid'): time.sleep(0.01)\n"
            "sys.exit(7)")
    began = time.monotonic()
    proc = start(tmp_path, 2, code)
    proc.communicate(timeout=60)
    assert proc.returncode == 7
    assert time.monotonic() - began < 30
    pid = int((tmp_path / "rank0.pid").read_text())
    assert not Path(f"/proc/{pid}").exists()  # stopped, and reaped by the starter


def test_sigterm_is_passed_on_to_every_rank(tmp_path):
    code = ("import os, signal, sys, time; r = os.environ['RANK']\n"
            "signal.signal(signal.SIGTERM, lambda *_: (open(f'got{r}', 'w').close(), sys.exit(0)))\n"
            "open(f'ready{r}', 'w').close(); time.sleep(3600)")
    proc = start(tmp_path, 2, code)
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"ready{r}").exists() for r in (0, 1)):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    assert (tmp_path / "got0").exists() and (tmp_path / "got1").exists()


def test_no_arguments_is_a_usage_error():
    proc = subprocess.run([*STARTER, "--nproc=2", "--master-port=1"], capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 2 and "the rank's python arguments" in proc.stderr
