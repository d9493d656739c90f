"""Runs of earlier commands are never taken by default, and with --reuse only where the checks
see everything that changed, or the note names what they cannot see.

Each case is a user's job (tests/jobs/hostile_job.py, under `command:`, importing nothing of
ours) whose runs turn from consistent to diverged when the user changes one input the way the
job reads it: a data dir named only by a variable, a path in a config, a shell variable, a
retargeted symlink, a forked worker's read, `cat`, SQLite, a memmap opened r+, a read after
step 1 by a job that ends with os._exit, the 10,001st file, an override file or module
created later, PYTHONPATH pointed at another checkout, an installed module edited in place,
an edit that keeps size and mtime. After the change, `aa` (default) runs afresh and says
diverged; `aa --reuse` says diverged too, with the change as its reason, except for the kinds
the note names as unseen, where it says consistent under that note.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bisect_prefetch.cli import main
from bisect_prefetch.runs.reuse import UNSEEN

JOB = Path(__file__).resolve().parent.parent / "jobs" / "hostile_job.py"


def _flags(path: Path, noise: int, **extra) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"noise": noise, **extra}))


def _set_flag(path: Path) -> None:
    _flags(path, 1)


def _symlink(project: Path, _outside: Path, _env) -> None:
    for run, noise in (("run1", 0), ("run2", 1)):
        _flags(project / "data" / run / "flags.json", noise)
    (project / "data" / "latest").symlink_to("run1")


def _retarget(project: Path, _outside: Path, _env) -> None:
    (project / "data" / "latest").unlink()
    (project / "data" / "latest").symlink_to("run2")


def _sqlite(project: Path, noise: int) -> None:
    with sqlite3.connect(project / "flags.db") as db:
        db.execute("create table if not exists flags (noise integer)")
        db.execute("delete from flags")
        db.execute("insert into flags values (?)", (noise,))


def _keep_size_and_mtime(path: Path) -> None:
    info = path.stat()
    _flags(path, 1)  # {"noise": 0} -> {"noise": 1}: the same size
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))


def _many_files(project: Path, *_: object) -> None:
    files = project / "files"
    files.mkdir()
    for i in range(10_001):
        (files / f"f{i}").write_text("0")


def _checkouts(project: Path, outside: Path, env) -> None:
    for name, noise in (("checkout-a", 0), ("checkout-b", 1)):
        (outside / name).mkdir()
        (outside / name / "hostile_flag.py").write_text(f"NOISE = {noise}\n")
    env.setenv("PYTHONPATH", str(outside / "checkout-a"))


def _site(project: Path) -> Path:
    return next((project.parent / "venv").glob("lib/python*/site-packages"))


def _installed(project: Path, *_: object) -> None:
    (_site(project) / "hostile_flag.py").write_text("NOISE = 0\n")


def _edit_installed(project: Path, *_: object) -> None:
    (_site(project) / "hostile_flag.py").write_text("NOISE = 1\n")


FLAGS = "flags.json"
# way -> (set up with the flag off, turn it on, the reason --reuse gives, or None: unseen)
WAYS = {
    "env-dir": (lambda p, o, env: (_flags(o / FLAGS, 0), env.setenv("HOSTILE_DATA", str(o))),
                lambda p, o, env: _set_flag(o / FLAGS), None),
    "config-value": (lambda p, o, env: (_flags(o / FLAGS, 0),
                                        (p / "conf.json").write_text(json.dumps({"flags": str(o / FLAGS)}))),
                     lambda p, o, env: _set_flag(o / FLAGS), None),
    "shell-var": (lambda p, o, env: env.delenv("HOSTILE_NOISE", raising=False),
                  lambda p, o, env: env.setenv("HOSTILE_NOISE", "1"),
                  r"the variable HOSTILE_NOISE is set now"),
    "symlink": (_symlink, _retarget, r"project/data/latest/flags\.json now leads to "
                                     r"project/data/run2/flags\.json \(was project/data/run1/"),
    "fork": (lambda p, o, env: _flags(p / FLAGS, 0), lambda p, o, env: _set_flag(p / FLAGS),
             r"project/flags\.json changed"),
    "cat": (lambda p, o, env: _flags(p / FLAGS, 0), lambda p, o, env: _set_flag(p / FLAGS), None),
    "sqlite": (lambda p, o, env: _sqlite(p, 0), lambda p, o, env: _sqlite(p, 1), None),
    "memmap": (lambda p, o, env: (p / "flags.bin").write_bytes(b"\0"),
               lambda p, o, env: (p / "flags.bin").write_bytes(b"\1"), r"project/flags\.bin changed"),
    "exit-after-step-1": (lambda p, o, env: _flags(p / FLAGS, 0),
                          lambda p, o, env: _set_flag(p / FLAGS), r"project/flags\.json changed"),
    "many-files": (_many_files, lambda p, o, env: (p / "files" / "f10000").write_text("1"),
                   r"run 0001-aa-k0 finished at \d\d:\d\d: process \d+ \(rank 0\) opened more files "
                   r"than a manifest keeps \(10000\): its manifest is not complete"),
    "override-file": (lambda p, o, env: None, lambda p, o, env: _set_flag(p / "override.json"),
                      r"project/override\.json was created"),
    "override-module": (lambda p, o, env: None,
                        lambda p, o, env: (p / "hostile_override.py").write_text("NOISE = 1\n"),
                        r"project/hostile_override\.py was created"),
    "module": (_checkouts, lambda p, o, env: env.setenv("PYTHONPATH", str(o / "checkout-b")),
               r"PYTHONPATH \S+/checkout-a -> \S+/checkout-b"),
    "installed": (_installed, _edit_installed, r"venv/lib/python[\d.]+/site-packages/hostile_flag\.py \(installed\) changed"),
    "size-mtime": (lambda p, o, env: _flags(p / FLAGS, 0),
                   lambda p, o, env: _keep_size_and_mtime(p / FLAGS), None),
}


def _experiment(tmp_path: Path, way: str) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(JOB, project / "train.py")
    python = sys.executable
    if way == "installed":  # a venv of its own, its site-packages holding the module
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")],
                       check=True)
        python = str(tmp_path / "venv" / "bin" / "python")
    (tmp_path / "exp.yaml").write_text(textwrap.dedent(f"""
        name: hostile
        command: {json.dumps([python, "project/train.py", "module" if way == "installed" else way])}
        metrics: {{format: jsonl, names: [loss]}}
        graph: {{source: static, policy: fsdp2-chain, layers: 2}}
        steps: 3
    """))
    return project


def _aa(capsys, state: str, *extra: str) -> tuple[int, str]:
    code = main(["aa", "exp.yaml", "--mask", "all-off", "--state-dir", state, *extra])
    return code, capsys.readouterr().out


@pytest.mark.parametrize("way", list(WAYS))
def test_a_change_the_job_sees_is_never_hidden_by_runs_of_earlier_commands(
        way, tmp_path, tmp_path_factory, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    outside = tmp_path_factory.mktemp("outside")  # not under the job's directories
    project = _experiment(tmp_path, way)
    setup, change, reason = WAYS[way]
    setup(project, outside, monkeypatch)
    assert _aa(capsys, "state")[0] == 0
    change(project, outside, monkeypatch)
    code, out = _aa(capsys, "state", "--reuse")
    if reason is None:  # what no check sees: the old runs answer, under the note that says so
        assert code == 0, out
        assert "note: 2 run(s) reused from the journal" in out and f"note: {UNSEEN}" in out
    else:
        assert code == 1, out
        assert re.search(r"2 run\(s\) of the journal run again: " + reason, out), out
    # By default no run of an earlier command is taken: the job as it is now answers.
    code, out = _aa(capsys, "state")
    assert code == 1 and "reused" not in out, out
    assert "run again: runs of earlier commands are taken again only with --reuse" in out


def test_runs_that_failed_are_run_again_never_taken_as_evidence(
        tmp_path, tmp_path_factory, monkeypatch, capsys):
    """Runs that failed on an NCCL timeout are no evidence for the next aa, even with
    --reuse: it runs them again (and no longer says "no verdict" again, running nothing)."""
    monkeypatch.chdir(tmp_path)
    outside = tmp_path_factory.mktemp("network")
    monkeypatch.setenv("HOSTILE_DATA", str(outside))
    (outside / "down").touch()
    _experiment(tmp_path, "transient-failure")
    assert main(["aa", "exp.yaml", "--mask", "all-off", "--state-dir", "state"]) == 2
    assert "no verdict" in capsys.readouterr().err
    (outside / "down").unlink()
    code, out = _aa(capsys, "state", "--reuse")
    assert code == 0, out
    assert re.search(r"2 run\(s\) of the journal run again: run 0001-aa-k0 finished at \d\d:\d\d "
                     r"ended error \(.*\): a failed, errored or truncated run is never taken again",
                     out), out


def _readme_job(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(JOB, project / "train.py")
    for run, scale in (("run1", 1.0), ("run2", 1.5)):
        _flags(project / "data" / run / "flags.json", 0, scale=scale)
    (project / "data" / "latest").symlink_to("run1")
    (tmp_path / "exp.yaml").write_text(textwrap.dedent(f"""
        name: readme
        command: {json.dumps([sys.executable, "project/train.py", "symlink-scale"])}
        metrics: {{format: jsonl, names: [loss]}}
        graph: {{source: static, policy: fsdp2-chain, layers: 2}}
        steps: 4
    """))


@pytest.mark.parametrize("reuse", [[], ["--reuse"]])
def test_the_readme_workflow_with_a_moved_latest_link_finds_the_culprit(
        tmp_path, monkeypatch, capsys, reuse):
    """`aa --mask all-off`, then `bisect`, the data's `latest` link moved in between: the
    all-off runs of the old data are no golden run for the new (they would make every run
    differ: not-prefetch for a job whose only drift is its culprit edge)."""
    monkeypatch.chdir(tmp_path)
    _readme_job(tmp_path)
    assert main(["aa", "exp.yaml", "--mask", "all-off", "--runs", "3", "--state-dir", "s"]) == 0
    (tmp_path / "project" / "data" / "latest").unlink()
    (tmp_path / "project" / "data" / "latest").symlink_to("run2")
    capsys.readouterr()
    code = main(["bisect", "exp.yaml", "--state-dir", "s", "--json", "out.json", *reuse])
    out = capsys.readouterr().out
    data = json.loads((tmp_path / "out.json").read_text())
    assert code == 1 and data["verdict"] == "culprit-found", out
    assert data["minimal_set"] == ["bwd:layers.1->layers.0"]
    assert data["earlier_all_off"] == [{"golden": None, "controls": []}]
    assert "all-off runs of earlier commands" not in out
    if reuse:
        assert "project/data/latest/flags.json now leads to project/data/run2/flags.json" in out
