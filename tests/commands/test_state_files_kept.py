"""No output of any command lands on any state dir's journal or lock: not another
experiment's, not one a running command holds, not through a link. A journal is known by
its records, a lock by its marker line, an old one by its name beside the other and runs/.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
from pathlib import Path

import pytest

from bisect_prefetch.cli import main
from bisect_prefetch.files import LOCK_MARKER, state_file
from tests.conftest import write_experiment

JOB = Path(__file__).resolve().parent.parent / "jobs" / "fake_job.py"


@pytest.fixture(scope="module")
def other_state(tmp_path_factory):
    """A state dir of another experiment, with two finished runs."""
    root = tmp_path_factory.mktemp("other")
    exp = write_experiment(root, [sys.executable, str(JOB), "clean"])
    assert main(["aa", str(exp), "--mask", "all-off", "--state-dir", str(root / "state")]) == 0
    return root / "state" / "fake"


def _forget_this_process_protections(monkeypatch):
    """As in a new process: only the files themselves say what they are."""
    from bisect_prefetch import files

    monkeypatch.setattr(files, "_protected", {})


def _outputs(tmp_path: Path, state: Path, target: Path) -> dict[str, list[str]]:
    exp = write_experiment(tmp_path, [sys.executable, str(JOB), "clean"])
    runs = sorted((state / "runs").iterdir())
    return {
        "aa --json": ["aa", str(exp), "--mask", "all-off", "--state-dir", str(tmp_path / "s"),
                      "--json", str(target)],
        "report --html": ["report", str(state), "--html", str(target)],
        "graph --out": ["graph", "--policy", "fsdp2-chain", "--layers", "2", "--out", str(target)],
        "graph --format png --out": ["graph", "--policy", "fsdp2-chain", "--layers", "2",
                                     "--format", "png", "--out", str(target)],
        "compare --json": ["compare", str(runs[0]), str(runs[1]), "--json", str(target)],
        "simulate --json": ["simulate", "--policy", "fsdp2-chain", "--layers", "2", "--culprit",
                            "bwd:layers.1->layers.0", "--hazard", "0.3", "--steps", "5", "--trials", "1",
                            "--json", str(target)],
        "init --out --force": ["init", "--out", str(target), "--force", "--log", str(runs[0] / "metrics.jsonl"),
                               "--", sys.executable, str(JOB)],
    }


@pytest.mark.parametrize("which", ["journal.jsonl", "lock", "link to the journal"])
@pytest.mark.parametrize("command", ["aa --json", "report --html", "graph --out",
                                     "graph --format png --out", "compare --json",
                                     "simulate --json", "init --out --force"])
def test_no_output_replaces_a_journal_or_a_lock(tmp_path, capsys, monkeypatch, other_state, which,
                                               command):
    _forget_this_process_protections(monkeypatch)
    target = other_state / which.replace("link to the journal", "journal.jsonl")
    if which.startswith("link"):
        (tmp_path / "out.json").symlink_to(target)
        given = tmp_path / "out.json"
    else:
        given = target
    before = target.read_bytes()
    code = main(_outputs(tmp_path, other_state, given)[command])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "refusing to write" in err and ("journal of" in err or "lock of" in err), err
    assert target.read_bytes() == before


def test_the_lock_of_a_command_in_flight_is_known_while_held(tmp_path):
    state = tmp_path / "state" / "x"
    state.mkdir(parents=True)
    lock = state / "lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, f"{os.getpid()}\n{LOCK_MARKER}\n".encode())
    try:
        assert main(["graph", "--policy", "fsdp2-chain", "--layers", "2", "--out", str(lock)]) == 2
        assert lock.read_text().splitlines()[1] == LOCK_MARKER
    finally:
        os.close(fd)


def test_an_old_lock_and_an_empty_journal_are_known_by_their_place(tmp_path):
    (tmp_path / "runs").mkdir()
    (tmp_path / "lock").write_text("123\n")  # a lock of before the marker line
    (tmp_path / "journal.jsonl").write_text("")
    assert "lock" in state_file(tmp_path / "lock")
    assert "journal" in state_file(tmp_path / "journal.jsonl")
    (tmp_path / "notes.json").write_text(json.dumps({"v": 1}) + "\n")
    assert state_file(tmp_path / "notes.json") is None


def test_a_png_output_with_another_suffix_is_a_png(tmp_path):
    out = tmp_path / "graph.out"
    assert main(["graph", "--policy", "fsdp2-chain", "--layers", "2", "--format", "png",
                 "--out", str(out)]) == 0
    assert out.read_bytes().startswith(b"\x89PNG")
