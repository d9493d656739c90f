"""Reuse is asked for and safe: a run of an earlier command is taken only with --reuse, and
then only for the same job, its code files, interpreter and installed packages included; the
command says how many runs it reused, from when, what it checked and what it cannot see.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from bisect_prefetch.cli import main

SCRIPT = """
import json, os
out = json.load(open(os.environ["BISECT_PREFETCH_PLAN"]))["out_dir"]
with open(os.path.join(out, "metrics.jsonl"), "w") as f:
    for step in range(1, 4):
        f.write(json.dumps({"step": step, "loss": LOSS}) + "\\n")
"""


def _setup(tmp_path: Path, python: str = sys.executable) -> tuple[Path, Path]:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT).replace("LOSS", "1.0"))
    path = tmp_path / "exp.yaml"
    path.write_text(textwrap.dedent(f"""
        name: reuse
        command: {json.dumps([python, "train.py"])}
        metrics: {{format: jsonl, names: [loss]}}
        graph: {{source: static, policy: fsdp2-chain, layers: 1}}  # no edge: no mask to apply
        steps: 3
    """))
    return path, script


def _aa(tmp_path: Path, experiment: Path, capsys, *extra: str) -> tuple[int, str]:
    code = main(["aa", str(experiment), "--mask", "all-off", "--state-dir", str(tmp_path / "state"),
                 *extra])
    return code, capsys.readouterr().out


def test_same_job_is_reused_and_said(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    experiment, _ = _setup(tmp_path)
    assert _aa(tmp_path, experiment, capsys)[0] == 0
    code, out = _aa(tmp_path, experiment, capsys, "--reuse")
    assert code == 0
    assert "note: 2 run(s) reused from the journal, finished 20" in out
    assert "checked unchanged: the experiment and its program, every file" in out
    assert "note: reuse cannot see: files reached only through an environment variable" in out
    # Without --reuse (the default, or --no-reuse) none is taken, and the note says how.
    for extra in ((), ("--no-reuse",)):
        code, out = _aa(tmp_path, experiment, capsys, *extra)
        assert code == 0 and "reused from the journal" not in out
        assert ("note: 2 run(s) of the journal run again, first because: runs of earlier "
                "commands are taken again only with --reuse") in out


def test_an_edited_training_script_runs_afresh(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    experiment, script = _setup(tmp_path)
    assert _aa(tmp_path, experiment, capsys)[0] == 0
    script.write_text(script.read_text().replace('"loss": 1.0', '"loss": 2.0'))
    code, out = _aa(tmp_path, experiment, capsys, "--reuse")
    assert code == 0
    assert "reused" not in out
    assert len(list((tmp_path / "state" / "reuse" / "runs").iterdir())) == 4


def test_a_newly_installed_package_runs_afresh(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    experiment, _ = _setup(tmp_path, python=str(env / "bin" / "python"))
    assert _aa(tmp_path, experiment, capsys)[0] == 0
    site = next(env.glob("lib/python*/site-packages"))
    (site / "newlib-1.0.dist-info").mkdir()  # what `pip install newlib` leaves
    (site / "newlib-1.0.dist-info" / "METADATA").write_text("Name: newlib\nVersion: 1.0\n")
    code, out = _aa(tmp_path, experiment, capsys, "--reuse")
    assert code == 0
    assert "reused" not in out
