"""A user's job sharded by hyper-parallel, through ``command:``. Where the adapter finds no
tensor to digest on a rank, ``aa`` never says "bitwise identical" and its signals line names
the rank and why. The job (tests/jobs/hp_tensorless_job.py) imports nothing of ours; its
hyper-parallel is a stand-in build (tests/jobs/hp_standin) whose parameters keep their
tensors under names no lineage uses. A build whose parameters have neither lineage's early
gather is refused in one line naming what is missing and the version found (exit 2).
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from bisect_prefetch.cli import main

pytest.importorskip("torch")
JOBS = Path(__file__).resolve().parents[1] / "jobs"


def _experiment(tmp_path: Path, **env: str) -> Path:
    """The job through command:, its hyper_parallel the stand-in build (env: more of it)."""
    argv = [sys.executable, str(JOBS / "hp_tensorless_job.py"), "{steps}"]
    env = {"PYTHONPATH": str(JOBS / "hp_standin"), **env}
    experiment = tmp_path / "hp.yaml"
    experiment.write_text(textwrap.dedent(f"""
        name: hp
        command: {json.dumps(argv)}
        env: {json.dumps(env)}
        metrics: {{format: torchtitan, names: [loss, grad_norm]}}
        graph: {{source: runtime}}
        steps: 3
        timeout_s: 120
    """))
    return experiment


def test_a_rank_with_nothing_digested_gets_the_printed_precision_wording(tmp_path, capsys):
    experiment = _experiment(tmp_path)
    out_json = tmp_path / "aa.json"
    code = main(["aa", str(experiment), "--runs", "2", "--state-dir", str(tmp_path / "state"),
                 "--json", str(out_json)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "bitwise identical" not in out
    assert "identical at the printed precision" in out
    assert ("rank 0: 0 tensors digested: the adapter found no parameter tensors in "
            "hyper-parallel's units") in out
    result = json.loads(out_json.read_text())
    assert [row["rank"] for row in result["signals"]["digests"]["nothing_digested"]] == [0]


def test_a_hyper_parallel_version_neither_lineage_fits_is_one_line_and_exit_2(tmp_path, capsys):
    experiment = _experiment(tmp_path, HP_STANDIN_BUILD="unknown")
    code = main(["graph", str(experiment), "--state-dir", str(tmp_path / "state")])
    captured = capsys.readouterr()
    assert code == 2
    errors = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, captured.err  # progress lines aside, one line says why
    assert ("hyper-parallel 0.0.0+standin is not a version the adapter recognizes: missing "
            "parameter.unshard (fully_shard), parameter.prefetch_unsharded (hsdp)") in errors[0]
