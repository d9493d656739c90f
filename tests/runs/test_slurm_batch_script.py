"""The slurm executor without a cluster: the batch script it writes (one srun a job, every
word of the command as given, only expand_env's names expanded on the node), and what is
refused before any job: sbatch missing, executor strings that would break the script, a
state dir Slurm cannot take. Against a real Slurm: tests/e2e/test_slurm.py."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.runs.executors.slurm import SlurmExecutor, SlurmOptions
from tests.conftest import HOSTILE_WORDS


def bad_input(tmp_path: Path, executor: str, **env: str) -> subprocess.CompletedProcess:
    """`aa` on an experiment with this executor, refused before any run."""
    path = tmp_path / "exp.yaml"
    path.write_text("name: e2e\nworkload:\n  builtin: fsdp2\n  layers: 4\n  world_size: 1\n"
                    f"steps: 10\nseed: 7\ntimeout_s: 240\nno_progress_timeout_s: 120\n"
                    f"executor: {executor}\n")
    return subprocess.run([sys.executable, "-m", "bisect_prefetch.cli", "aa", str(path),
                           "--state-dir", str(tmp_path / "state")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})


def test_missing_sbatch_is_one_line_and_exit_2(tmp_path):
    done = bad_input(tmp_path, "{kind: slurm}", PATH=str(Path(sys.executable).parent))
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: sbatch not found on PATH: the slurm executor needs Slurm's client commands"]
    assert not (tmp_path / "state" / "e2e" / "journal.jsonl").exists()


def test_multi_node_script_runs_the_command_once_per_node_under_srun(tmp_path):
    from bisect_prefetch.runs.executors.base import Job
    from bisect_prefetch.runs.launcher import JobSpec

    executor = SlurmExecutor(SlurmOptions(nodes=2, ntasks_per_node=1, gpus_per_node=8,
                                          partition="gpu", time="01:00:00", account="proj",
                                          expand_env=("MASTER_ADDR",)))
    argv = ["printf", "%s\\n", "--rdzv_endpoint=$MASTER_ADDR:29500", "two words", 'a "quote"']
    spec = JobSpec(argv=argv, run_dir=tmp_path, timeout_s=600,
                   env={**os.environ, "BISECT_PREFETCH_PLAN": "/x/plan.json"})
    script = executor.script(Job(spec=spec)).splitlines()
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --partition=gpu", "#SBATCH --time=01:00:00", "#SBATCH --account=proj",
                 "export BISECT_PREFETCH_PLAN=/x/plan.json"):
        assert line in script
    srun = [shlex.split(line) for line in script if line.startswith("srun ")]
    assert len(srun) == 1 and srun[0][:4] == ["srun", "--kill-on-bad-exit=1", "bash", "-c"]
    # On each node bash expands $MASTER_ADDR (expand_env); every other word arrives as given.
    words = subprocess.run(["bash", "-c", srun[0][4]], capture_output=True, text=True, check=True,
                           env={"MASTER_ADDR": "node7", "PATH": os.environ["PATH"]})
    assert words.stdout.splitlines() == ["--rdzv_endpoint=node7:29500", "two words", 'a "quote"']


@pytest.mark.parametrize("nodes", [1, 2])
def test_the_batch_script_passes_every_word_exactly(tmp_path, nodes):
    """A job under Slurm receives exactly the argv a local run receives; only the
    names in expand_env expand on the node."""
    from bisect_prefetch.runs.executors.base import Job
    from bisect_prefetch.runs.launcher import JobSpec

    out = tmp_path / "words"
    argv = [sys.executable, "-c", "import sys, json; open(sys.argv[1], 'w').write(json.dumps(sys.argv[2:]))",
            str(out), *HOSTILE_WORDS, "--addr=${SLURM_NODEID}:1"]
    executor = SlurmExecutor(SlurmOptions(nodes=nodes, expand_env=("SLURM_NODEID",)))
    spec = JobSpec(argv=argv, run_dir=tmp_path, timeout_s=60, env=dict(os.environ))
    script = tmp_path / "job.sbatch"
    script.write_text(executor.script(Job(spec=spec)))
    # The script as a node runs it; srun here only runs its command once (scontrol is absent:
    # MASTER_ADDR comes out empty, which these words do not use).
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/sh\nshift\nexec "$@"\n')
    (bin_dir / "srun").chmod(0o755)
    subprocess.run(["bash", str(script)], cwd=tmp_path, check=True, capture_output=True,
                   env={"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_NODEID": "3"})
    assert json.loads(out.read_text()) == [*HOSTILE_WORDS, "--addr=3:1"]
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("executor", ["{kind: slurm, partition: \"a\\nb\"}",
                                      "{kind: slurm, expand_env: [\"A-B\"]}"])
def test_executor_strings_that_would_break_the_script_are_refused(tmp_path, executor):
    done = bad_input(tmp_path, executor)
    assert done.returncode == 2, done.stdout + done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_state_dir_slurm_cannot_take_is_one_line(tmp_path):
    # slurmd fails a job whose --output path holds a backslash: said before any job.
    executor = SlurmExecutor(SlurmOptions())
    with pytest.raises(BisectPrefetchError, match="holds a backslash"):
        executor.check(tmp_path / "back\\slash")
