"""Which torch the FSDP2 adapter takes (adapters/fsdp2_support.py), and a job it refuses.

The check is a pure function of the version and the names it lacks; in a job, a refused torch
stops the job at the import of FSDP with the one line (adapters/__init__.py), past the job's
own `except Exception`, and the line is in the rank's probe. Without a plan the job runs on.
The refusal through the CLI, on a torch job venv, is tests/e2e/test_torch_versions.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bisect_prefetch.adapters.fsdp2_support import NEEDED, lacking, refusal, resolve_name
from bisect_prefetch.vocab import NOT_ACTIVE_KEY

REPO = Path(__file__).resolve().parents[2]
SITE = REPO / "bisect_prefetch" / "adapters" / "site"
GROUP = "torch.distributed.fsdp._fully_shard._fsdp_param_group.FSDPParamGroup"


@pytest.mark.parametrize("version", ["2.8.0", "2.8.0+cu128", "2.13.0+cpu", "2.14.1+cu130",
                                     "2.15.0a0+git1234abc", "2.15.2"])
def test_every_torch_from_2_8_to_2_15_with_its_names_is_taken(version):
    assert refusal(version, []) is None


@pytest.mark.parametrize(("version", "lacks", "line"), [
    ("2.7.1", [], "adapter not active: torch 2.7.1 is outside the supported range 2.8-2.15"),
    ("2.6.0+cu124", [], "adapter not active: torch 2.6.0+cu124 is outside the supported range "
                        "2.8-2.15"),
    ("2.16.0.dev20261201", [], "adapter not active: torch 2.16.0.dev20261201 is outside the "
                               "supported range 2.8-2.15"),
    ("3.0.0", [], "adapter not active: torch 3.0.0 is outside the supported range 2.8-2.15"),
    ("unknown", [], "adapter not active: torch unknown is outside the supported range 2.8-2.15"),
    ("2.10.0", [f"{GROUP}._prefetch_unshard"],
     "adapter not active: torch 2.10.0 lacks FSDPParamGroup._prefetch_unshard"),
    ("2.14.1", ["torch.cpu.Stream.record_event", f"{GROUP}.unshard"],
     "adapter not active: torch 2.14.1 lacks torch.cpu.Stream.record_event, FSDPParamGroup.unshard"),
    ("2.7.1", ["torch.cpu.Stream.record_event"],
     "adapter not active: torch 2.7.1 is outside the supported range 2.8-2.15 and lacks "
     "torch.cpu.Stream.record_event"),
])
def test_a_torch_outside_the_range_or_lacking_a_name_is_refused_in_one_line(version, lacks, line):
    assert refusal(version, lacks) == line


def test_lacking_names_what_does_not_resolve():
    present = {"a.b", "c"}

    def resolve(name):
        if name == "d.e":
            raise AttributeError(name)
        return object() if name in present else None

    assert lacking(["a.b", "x", "c", "d.e"], resolve=resolve) == ["x", "d.e"]


def test_the_names_the_adapter_needs_are_this_torchs():
    torch = pytest.importorskip("torch")
    pytest.importorskip("torch.distributed.fsdp")  # imported, as the job's import has it

    assert lacking(NEEDED) == []
    assert resolve_name("torch.cpu.Stream.record_event") is torch.cpu.Stream.record_event
    assert lacking(["torch.cpu.Stream.no_such_method", "torch.no_such_module.x"]) == [
        "torch.cpu.Stream.no_such_method", "torch.no_such_module.x"]


def _job(tmp_path: Path, body: str, *, plan: bool) -> subprocess.CompletedProcess:
    """A job started as the launcher starts one: sitecustomize first on its path."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SITE), str(REPO)]))
    env.pop("BISECT_PREFETCH_PLAN", None)
    if plan:
        (tmp_path / "plan.json").write_text(json.dumps(
            {"version": 1, "experiment": "t", "run_id": "r", "mask": [], "guard": "none",
             "out_dir": str(tmp_path)}))
        env["BISECT_PREFETCH_PLAN"] = str(tmp_path / "plan.json")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(body)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)


LACKING_JOB = """
    import torch
    del torch.cpu.Stream.record_event  # as torch 2.6 and 2.7 lack it
    try:
        import torch.distributed.fsdp
    except Exception as e:  # a job's own guard does not keep it going
        print("caught", e)
    print("trained")
    """


def test_a_job_whose_torch_lacks_a_name_stops_at_the_import_with_the_line(tmp_path):
    torch = pytest.importorskip("torch")
    done = _job(tmp_path, LACKING_JOB, plan=True)
    line = f"adapter not active: torch {torch.__version__} lacks torch.cpu.Stream.record_event"
    assert done.returncode == 1 and done.stdout == "", done.stderr
    assert done.stderr.strip().splitlines() == [f"bisect-prefetch: {line}"]
    probe = json.loads((tmp_path / "probe.rank0.json").read_text())
    assert probe[NOT_ACTIVE_KEY] == line and probe["edges"] == {}


def test_a_torch_outside_the_range_is_refused_by_its_version(tmp_path):
    pytest.importorskip("torch")
    done = _job(tmp_path, """
        import torch
        torch.__version__ = "2.7.1"  # what an older torch says of itself
        import torch.distributed.fsdp
        print("trained")
        """, plan=True)
    assert done.returncode == 1 and done.stdout == "", done.stderr
    assert ("bisect-prefetch: adapter not active: torch 2.7.1 is outside the supported range "
            "2.8-2.15") in done.stderr.splitlines()


def test_without_a_plan_nothing_is_asked_of_the_adapter_and_the_job_runs_on(tmp_path):
    pytest.importorskip("torch")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("BISECT_PREFETCH_PLAN", None)
    # The adapter installed without a plan (a reference workload's listener does this).
    done = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import torch
        import bisect_prefetch.adapters as adapters
        adapters.install()
        del torch.cpu.Stream.record_event
        import torch.distributed.fsdp
        print("trained")
        """)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (0, "trained\n"), done.stderr
    assert "adapter not active" in done.stderr
