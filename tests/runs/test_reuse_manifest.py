"""Reuse keyed on what the job read: with --reuse (or --resume, its own), a finished run is
taken only while every file its job read (a module beside the script, a package installed
editable, a config found by a computed path), its packages and the variables it started with
are the same; the command says why not. Without either, no run of an earlier command is taken.

The job (tests/jobs/reading_job) is a user's script under `command:` that imports nothing of
ours. Its editable package is installed the way setuptools' editable install lays it out in
the job's venv: an `__editable__.mylib-0.1.pth` naming the source dir and a dist-info whose
direct_url.json says editable (pip is not run: no index here).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bisect_prefetch.cli import main

JOB = Path(__file__).resolve().parent.parent / "jobs" / "reading_job"


def _venv_with_editable(tmp_path: Path, source: Path, version: str = "0.1") -> Path:
    env = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    site = next(env.glob("lib/python*/site-packages"))
    (site / f"__editable__.mylib-{version}.pth").write_text(f"{source}\n")
    info = site / f"mylib-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: mylib\nVersion: {version}\n")
    (info / "direct_url.json").write_text(json.dumps(
        {"url": source.as_uri(), "dir_info": {"editable": True}}))
    return env / "bin" / "python"


@pytest.fixture
def project(tmp_path, monkeypatch):
    """The job copied into tmp_path/project, its venv, and the experiment file."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    root = tmp_path / "project"
    shutil.copytree(JOB, root)
    python = _venv_with_editable(tmp_path, root / "mylib_src")
    (tmp_path / "exp.yaml").write_text(textwrap.dedent(f"""
        name: reading
        command: {json.dumps([str(python), "project/train.py"])}
        metrics: {{format: jsonl, names: [loss]}}
        graph: {{source: static, policy: fsdp2-chain, layers: 1}}  # no edge: no mask to apply
        steps: 3
    """))
    return root


def _aa(capsys, *extra: str) -> tuple[int, str]:
    code = main(["aa", "exp.yaml", "--mask", "all-off", "--state-dir", "state", *extra])
    return code, capsys.readouterr().out


def _edit(path: Path, old: str, new: str) -> None:
    path.write_text(path.read_text().replace(old, new))


def _dist_upgrade(root: Path) -> None:
    site = next((root.parent / "venv").glob("lib/python*/site-packages"))
    info = site / "mylib-0.1.dist-info"
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mylib\nVersion: 0.2\n")
    info.rename(site / "mylib-0.2.dist-info")


CHANGES = {
    "sibling module": (lambda root: _edit(root / "model.py", "1.0", "1.25"),
                       r"project/model\.py changed since run 0001-aa-k0 finished at \d\d:\d\d"),
    "editable package": (lambda root: _edit(root / "mylib_src/mylib/core.py", "0.5", "0.75"),
                         r"project/mylib_src/mylib/core\.py changed since run 0001-aa-k0"),
    "computed config path": (lambda root: _edit(root / "conf/settings.json", "1.0", "2.0"),
                             r"project/conf/settings\.json changed since run 0001-aa-k0"),
    "numerics variable": (None, r"CUBLAS_WORKSPACE_CONFIG unset -> :4:8"),  # set by the test
    "package upgraded": (_dist_upgrade, r"mylib 0\.1 -> 0\.2"),
    "deleted config": (lambda root: (root / "conf/settings.json").unlink(),
                       r"project/conf/settings\.json was deleted since run 0001-aa-k0"),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_change_to_what_the_job_read_runs_afresh_and_says_why(project, capsys, monkeypatch,
                                                                 change):
    assert _aa(capsys)[0] == 0
    edit, reason = CHANGES[change]
    if edit is None:  # a shell variable the job reads, as a user would export it
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4:8")
    else:
        edit(project)
    code, out = _aa(capsys, "--reuse")
    assert "reused from the journal" not in out
    # said for the group and for the command, with the first reason
    assert re.search(r"  2 run\(s\) of the journal run again: " + reason, out), out
    assert re.search(r"note: 2 run\(s\) of the journal run again, first because: " + reason, out)
    if change == "deleted config":
        assert code == 2  # the job itself fails now: no old run stands in for it
    else:
        assert code == 0
        assert len(list((project.parent / "state/reading/runs").iterdir())) == 4


def test_an_edit_that_adds_noise_is_found_not_hidden_by_old_runs(project, capsys):
    """The held-out case: runs of the old code said consistent; the edited job is not."""
    assert _aa(capsys)[0] == 0
    _edit(project / "conf/settings.json", "false", "true")
    code, out = _aa(capsys, "--reuse")
    assert code == 1 and "-> diverged at step 1" in out


def test_a_touched_file_and_unchanged_job_are_reused(project, capsys):
    assert _aa(capsys)[0] == 0
    for name in ("model.py", "mylib_src/mylib/core.py", "conf/settings.json"):
        os.utime(project / name)  # a new mtime, the same bytes: hashed again, still the same
    code, out = _aa(capsys, "--reuse")
    assert code == 0
    assert "  2 run(s) reused from the journal\n" in out
    assert "run again" not in out
    manifest = json.loads((project.parent / "state/reading/journal.jsonl").read_text()
                          .splitlines()[0])["manifest"]
    root = project.resolve()
    read = {Path(p).relative_to(root).as_posix() for p in manifest["files"] if Path(p).is_relative_to(root)}
    assert os.path.realpath(sys.executable) in manifest["files"]  # the interpreter, by its file
    assert read == {"train.py", "model.py", "mylib_src/mylib/__init__.py",
                    "mylib_src/mylib/core.py", "conf/settings.json"}
    assert manifest["dists"]["mylib"] == "0.1"


def test_no_reuse_runs_everything_afresh(project, capsys):
    assert _aa(capsys)[0] == 0
    code, out = _aa(capsys, "--no-reuse")
    assert code == 0
    assert "2 run(s) of the journal run again: runs of earlier commands are taken again only " in out
    assert len(list((project.parent / "state/reading/runs").iterdir())) == 4


def test_a_run_journaled_without_a_manifest_is_not_reused(project, capsys):
    assert _aa(capsys)[0] == 0
    journal = project.parent / "state/reading/journal.jsonl"
    records = [json.loads(line) for line in journal.read_text().splitlines()]
    journal.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "manifest"}) + "\n"
                               for r in records))
    code, out = _aa(capsys, "--reuse")
    assert code == 0
    assert "run again: run 0001-aa-k0 finished at" in out
    assert "without a manifest of what it read" in out


def test_a_deleted_run_dir_is_run_again_and_said(project, capsys):
    assert _aa(capsys)[0] == 0
    shutil.rmtree(project.parent / "state/reading/runs/0001-aa-k0")
    code, out = _aa(capsys, "--reuse")
    assert code == 0
    # the first run's dir is gone; the second was compared with it: both run again
    assert re.search(r"2 run\(s\) of the journal run again: the run dir of run 0001-aa-k0 "
                     r"finished at \d\d:\d\d was deleted", out), out


def test_a_resumed_bisect_says_which_runs_it_runs_again_and_why(project, capsys):
    # A bisection needs edges, and masks the job applies: the script under a stand-in engine.
    experiment = project.parent / "exp.yaml"
    python = json.loads(experiment.read_text().split("command: ", 1)[1].split("\n", 1)[0])[0]
    experiment.write_text(experiment.read_text().replace(
        json.dumps([python, "project/train.py"]),
        json.dumps([python, str(JOB.parent / "gated.py"), "project/train.py"])).replace(
        "layers: 1}", "layers: 2}"))

    def bisect(*extra: str) -> str:
        main(["bisect", "exp.yaml", "--max-runs", "2", "--state-dir", "state", *extra])
        return capsys.readouterr().out

    first = bisect()
    assert "resuming" not in first
    again = bisect("--resume")
    assert re.search(r"resuming: (\d+) finished run\(s\) in the journal are reused\n", again)
    _edit(project / "model.py", "1.0", "1.5")
    edited = bisect("--resume")
    assert re.search(r"resuming: 0 finished run\(s\) in the journal are reused; \d+ run again, "
                     r"first because: project/model\.py changed since run 0", edited), edited


def test_a_run_whose_manifest_hit_its_bound_is_not_reused(project, capsys):
    assert _aa(capsys)[0] == 0
    journal = project.parent / "state/reading/journal.jsonl"
    records = [json.loads(line) for line in journal.read_text().splitlines()]
    for record in records:
        record["manifest"]["opened_truncated"] = True
    journal.write_text("".join(json.dumps(r) + "\n" for r in records))
    code, out = _aa(capsys, "--reuse")
    assert code == 0 and "reused from the journal" not in out
    assert re.search(r"2 run\(s\) of the journal run again: run 0001-aa-k0 finished at "
                     r"\d\d:\d\d: its manifest is not complete", out), out


def test_reuse_and_resume_on_a_matrix(project, capsys):
    (project.parent / "m.yaml").write_text(
        "experiment: exp.yaml\ncells: [{name: quiet, mask: all-off, runs: 2, expect: consistent}]\n")
    assert main(["matrix", "m.yaml", "--state-dir", "state"]) == 0
    capsys.readouterr()
    assert main(["matrix", "m.yaml", "--state-dir", "state"]) == 0  # no reuse by default
    assert "2 run(s) of the journal run again: runs of earlier commands" in capsys.readouterr().out
    assert main(["matrix", "m.yaml", "--state-dir", "state", "--resume"]) == 0  # its own, last
    out = capsys.readouterr().out
    assert "note: 2 run(s) reused from the journal" in out
    saved = json.loads((project.parent / "state/reading/matrix.json").read_text())
    assert saved["command"] == "bisect-prefetch matrix m.yaml --resume --state-dir=state"
    assert main(["matrix", "m.yaml", "--state-dir", "state", "--reuse"]) == 0
    assert "note: 2 run(s) reused from the journal" in capsys.readouterr().out
