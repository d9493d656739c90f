"""`bisect-prefetch init` on a user's plain FSDP2 script (examples/fsdp2_train.py, which imports
and calls nothing of ours) under torchrun, 2 CPU ranks: the port, the graph, the metrics and
the all-off A/A it says, and `aa` on the file it writes. The argument finder, the log reader
and bad input on small jobs: tests/commands/test_init.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bisect_prefetch.experiment import load_experiment
from tests.commands.test_init import _aa, _init  # the init and aa CLI calls, one copy

USER_JOB = Path(__file__).resolve().parents[2] / "examples" / "fsdp2_train.py"


def test_init_on_a_plain_torchrun_fsdp2_script_then_aa_on_the_file(tmp_path, capsys):
    pytest.importorskip("torch")
    code, path = _init(tmp_path, "--steps", "2", "--", sys.executable, "-m",
                       "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                       str(USER_JOB), "--steps", "4", "--seed", "3")
    out = capsys.readouterr().out
    assert code == 0, out
    assert "port: torchrun --standalone picks a free one itself" in out
    assert "your job: 7 FSDP units, 6 prefetch edges" in out
    assert "-> metrics: torchtitan lines in the job's stdout.log: loss, grad_norm" in out
    assert "-> all-off A/A: bitwise identical (digests) over 2 steps (2 runs)" in out
    experiment = load_experiment(path)
    assert experiment.command[-4:] == ["--steps", "{steps}", "--seed", "{seed}"]
    assert (experiment.steps, experiment.seed) == (4, 3)
    code, result = _aa(tmp_path, path, "--runs", "2", "--steps", "2")
    assert code == 0 and result["verdict"] == "consistent", result["reason"]
