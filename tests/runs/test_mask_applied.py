"""No verdict rests on a run whose mask was not applied, or whose adapter refused the job.

A run whose mask switches an edge off must show that the job applied it: a prefetch through
the adapter's gate on some rank, or a rank's graph (judge/merge.mask_not_applied). A job the
adapter never entered (here: a script with no engine, on a static graph) used to be
"consistent" under all-off; each run is now an error that says why. A job whose adapter
refused its torch (adapters/fsdp2_support.py) is an error whose reason is the adapter's own
line, taken from the probe (judge/first_error.adapter_refusal), and no command gives a verdict.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from bisect_prefetch.cli import main
from tests.conftest import write_experiment

JOBS = Path(__file__).resolve().parents[1] / "jobs"
METRICS_ONLY = """
import json, os
plan = json.load(open(os.environ["BISECT_PREFETCH_PLAN"]))
with open(os.path.join(plan["out_dir"], "metrics.jsonl"), "w") as f:
    for step in range(1, plan["steps"] + 1):
        f.write(json.dumps({"step": step, "rank": 0, "loss": 1.0 / step}) + "\\n")
"""
LACKING_TORCH = """
import torch
del torch.cpu.Stream.record_event  # as torch 2.6 and 2.7 lack it
import torch.distributed.fsdp
print("never here")
"""


def _script(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "job.py"
    script.write_text(body)
    return script


def _aa(tmp_path: Path, experiment: Path, *args: str) -> tuple[int, dict | None]:
    out = tmp_path / "aa.json"
    code = main(["aa", str(experiment), "--runs", "2", "--state-dir", str(tmp_path / "state"),
                 "--json", str(out), *args])
    return code, json.loads(out.read_text()) if out.exists() else None


def test_all_off_on_a_job_the_adapter_never_entered_is_no_verdict(tmp_path, capsys):
    experiment = write_experiment(tmp_path, [sys.executable, str(_script(tmp_path, METRICS_ONLY))],
                                  steps=3)
    code, result = _aa(tmp_path, experiment, "--mask", "all-off")
    out = capsys.readouterr().out
    assert code == 2 and result["verdict"] != "consistent", out
    assert [d["outcome"] for d in result["run_details"]] == ["error", "error"]
    assert {d["reason"] for d in result["run_details"]} == {
        "its mask was not applied: no rank acknowledged the plan (no probe; did the job run "
        "under the adapter?)"}
    # A mask that switches nothing off needs no adapter: the same job is compared under all-on.
    code, result = _aa(tmp_path, experiment, "--mask", "all-on")
    assert code == 0 and result["verdict"] == "consistent", capsys.readouterr().out


def test_the_same_job_under_an_engine_whose_prefetches_go_through_the_gate_is_judged(tmp_path,
                                                                                    capsys):
    script = _script(tmp_path, METRICS_ONLY)
    experiment = write_experiment(tmp_path, [sys.executable, str(JOBS / "gated.py"), str(script)],
                                  steps=3)
    code, result = _aa(tmp_path, experiment, "--mask", "all-off")
    assert code == 0 and result["verdict"] == "consistent", capsys.readouterr().out
    probe = json.loads((tmp_path / "state" / "fake" / "runs" / result["run_details"][0]["run_id"]
                        / "probe.json").read_text())
    assert {edge: counts["masked"] for edge, counts in probe["edges"].items()} == {
        "fwd:layers.0->layers.1": 1, "bwd:layers.1->layers.0": 1}


def test_a_refused_torch_fails_every_run_with_the_adapters_line_and_no_verdict(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    line = f"adapter not active: torch {torch.__version__} lacks torch.cpu.Stream.record_event"
    script = _script(tmp_path, LACKING_TORCH)
    experiment = write_experiment(tmp_path, [sys.executable, str(script)], steps=3, timeout_s=120)
    code, result = _aa(tmp_path, experiment, "--mask", "all-on")
    out = capsys.readouterr().out
    assert code == 2 and result["verdict"] not in ("consistent", "diverged"), out
    assert [(d["outcome"], d["reason"]) for d in result["run_details"]] == [("error", line)] * 2
    assert f"run 1/2 error ({line})" in out

    # bisect: its golden run fails with the line, once (a retry would be refused the same way).
    code = main(["bisect", str(experiment), "--state-dir", str(tmp_path / "state")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "failed 1 times" in err[0] and line in err[0], err

    # A runtime graph: the discovery run fails with the line, before any search.
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    experiment.write_text(experiment.read_text().replace(
        "{source: static, policy: fsdp2-chain, layers: 2}", "{source: runtime}"))
    code = main(["bisect", str(experiment), "--state-dir", str(runtime)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and line in err[0], err
