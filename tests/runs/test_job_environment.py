"""The job's own environment: its path gets the adapter alone, and its fingerprint is
taken inside the job, per rank, as the job sees it (runs/job_path.py,
adapters/environment.py, runs/envprint.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from bisect_prefetch.adapters import environment
from bisect_prefetch.cli import main
from bisect_prefetch.runs import envprint
from bisect_prefetch.runs.job_path import PACKAGE_PARENT
from tests.conftest import write_experiment

TOOL_ONLY = ("numpy", "pydantic", "typer", "rich", "networkx", "yaml", "tests", "benchmarks",
             "bisect_prefetch.runs", "bisect_prefetch.search")

JOB = """
    import importlib.util, json, os, sys
    TOOL_ONLY = TOOL_ONLY_HERE
    run_dir, steps = sys.argv[1], int(sys.argv[2])
    found = {}
    for name in TOOL_ONLY + ("bisect_prefetch.adapters",):
        try:
            spec = importlib.util.find_spec(name)
        except ImportError:
            spec = None
        found[name] = spec.origin if spec is not None else None
    seen = {"found": found, "path": sys.path, "prefix": sys.prefix,
            "adapter_loaded": "bisect_prefetch.adapters" in sys.modules}
    with open(os.path.join(run_dir, "imports.json"), "w") as f:
        json.dump(seen, f)
    with open(os.path.join(run_dir, "metrics.jsonl"), "a") as f:
        for step in range(1, steps + 1):
            f.write(json.dumps({"step": step, "loss": 1.0 / step}) + "\\n")
"""


def test_a_job_in_its_own_venv_imports_nothing_of_the_tools(tmp_path):
    venv = tmp_path / "jobvenv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(JOB).replace("TOOL_ONLY_HERE", repr(TOOL_ONLY)))
    exp = write_experiment(tmp_path, [str(venv / "bin" / "python"), str(script), "{run_dir}", "{steps}"],
                           steps=2)
    assert main(["aa", str(exp), "--runs", "2", "--state-dir", str(tmp_path / "state")]) == 0
    runs = sorted((tmp_path / "state" / "fake" / "runs").iterdir())
    assert runs
    for run_dir in runs:
        seen = json.loads((run_dir / "imports.json").read_text())
        assert seen["prefix"] == str(venv)
        assert seen["adapter_loaded"], "the site hook installed the adapter"
        assert seen["found"]["bisect_prefetch.adapters"].startswith(str(run_dir.resolve() / "adapter"))
        leaked = {name: origin for name, origin in seen["found"].items()
                  if name in TOOL_ONLY and origin is not None}
        assert leaked == {}
        tool_prefix, root = Path(sys.prefix).resolve(), PACKAGE_PARENT
        for entry in seen["path"]:
            resolved = Path(entry or ".").resolve()
            assert resolved != root and tool_prefix not in resolved.parents, entry


def test_the_in_job_fingerprint_is_the_jobs(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    print_ = environment.job_fingerprint(1)
    assert print_["rank"] == 1 and print_["world_size"] == 4 and print_["local_world_size"] == 2
    assert print_["executable"] == sys.executable and print_["prefix"] == sys.prefix
    assert print_["variables"]["OMP_NUM_THREADS"] == "3"
    assert print_["libraries"]["numpy"] is not None  # installed where this test runs
    assert print_["installed"]["count"] > 10 and len(print_["installed"]["hash"]) == 16
    import numpy  # noqa: F401  (imported: its distribution is listed)

    assert "numpy" in environment.job_fingerprint(0)["imported"]


def _rank_print(run_dir: Path, rank: int, **changes) -> None:
    base = {"rank": rank, "python": "3.12.3", "executable": "/job/venv/bin/python",
            "libraries": {"torch": "2.13.0", "numpy": "2.4.6"}, "host": f"node{rank // 2}",
            "installed": {"count": 80, "hash": "abc"}, "world_size": 2}
    (run_dir / f"env.rank{rank}.json").write_text(json.dumps({**base, **changes}))


def test_ranks_are_merged_and_drift_is_the_jobs(tmp_path):
    runs = {}
    for name, numpy in (("a", "2.4.6"), ("b", "2.4.6"), ("c", "2.5.0")):
        run_dir = tmp_path / name
        run_dir.mkdir()
        # The orchestrator's print differs in every run (its python): that is not drift.
        envprint.write_env(run_dir, {"python": f"3.11.{len(runs)}"})
        for rank in range(4):
            _rank_print(run_dir, rank, libraries={"torch": "2.13.0", "numpy": numpy})
        job = envprint.add_job_print(run_dir)
        assert job["ranks"] == 4 and job["libraries"]["numpy"] == numpy
        assert job["by_rank"] == {"host": {"0": "node0", "1": "node0", "2": "node1", "3": "node1"}}
        runs[name] = envprint.read_env(run_dir)
        assert runs[name]["orchestrator"]["python"].startswith("3.11")
    assert envprint.drift({k: runs[k] for k in ("a", "b")}) == []
    assert envprint.drift(runs) == ["libraries.numpy: a='2.4.6', b='2.4.6', c='2.5.0'"]
    summary = envprint.summary(runs["c"]["job"])
    assert summary["libraries"] == {"torch": "2.13.0", "numpy": "2.5.0"} and summary["ranks"] == 4
