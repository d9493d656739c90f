"""The folder decides speed: every test under tests/e2e is slow, every other test fast
(tests/conftest.py marks them by folder and runs the fast ones first); no test is marked
slow by hand, and a fast test that starts a real training run fails."""

from __future__ import annotations

import re
import sys

from tests.conftest import E2E, REPO, in_e2e, starts_training, training_scripts

TESTS = REPO / "tests"
HAND_MARK = re.compile(r"\bmark\.slow\b|pytestmark\s*=.*\bslow\b")


def test_no_test_file_marks_a_test_slow_by_hand():
    marked = [str(path.relative_to(REPO)) for path in sorted(TESTS.rglob("*.py"))
              if path.name != "conftest.py" and HAND_MARK.search(path.read_text())]
    assert marked == [], "the folder decides speed: move slow tests into tests/e2e"


def test_the_collected_tests_are_slow_exactly_under_tests_e2e(request):
    items = request.session.items
    slow = [item.nodeid for item in items if item.get_closest_marker("slow")]
    assert slow == [item.nodeid for item in items if in_e2e(item.path)]
    # the fast tests first, then tests/e2e
    order = [in_e2e(item.path) for item in items]
    assert order == sorted(order)


def test_a_real_training_run_is_told_from_other_commands(tmp_path):
    scripts = training_scripts()
    python = sys.executable
    assert starts_training([python, "-m", "torch.distributed.run", "--nproc_per_node=2",
                            "job.py"], scripts)
    assert starts_training(["torchrun", "--standalone", "train.py"], scripts)
    assert starts_training([python, "-m", "bisect_prefetch.workloads.local_ranks", "--nproc=2",
                            "--", "-m", "bisect_prefetch.workloads.fsdp2", "--layers", "4"],
                           scripts)
    assert starts_training([python, "-m", "mindspore.parallel.cluster.run", "--worker_num=2",
                            "python", "-m", "bisect_prefetch.workloads.mindspore"], scripts)
    assert starts_training([python, str(REPO / "examples" / "fsdp2_train.py")], scripts)
    assert starts_training([python, str(TESTS / "jobs" / "two_causes_job.py")], scripts)
    assert not starts_training([python, str(TESTS / "jobs" / "fake_job.py"), "clean"], scripts)
    assert not starts_training([python, "-m", "bisect_prefetch.cli", "aa", "exp.yaml"], scripts)
    assert not starts_training("sbatch --parsable job.sbatch", scripts)
    stand_in = tmp_path / "bin" / "msrun"  # a test's own msrun, as tests/commands/test_init.py has
    stand_in.parent.mkdir()
    stand_in.write_text("import os, subprocess, sys\n")
    assert not starts_training([python, str(stand_in), "--worker_num=2", "job.py"], scripts)
    installed = stand_in.with_name("torchrun")
    installed.write_text("import sys\nfrom torch.distributed.run import main\n")
    assert starts_training([str(installed), "--nproc_per_node=2", "job.py"], scripts)
    assert E2E.name == "e2e" and in_e2e(E2E / "test_slurm.py") and not in_e2e(TESTS / "x.py")
