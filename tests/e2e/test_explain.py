"""`explain` on a user's own FSDP2 job whose drift is not prefetch: one layer's forward adds
noise from a clock-seeded generator from step 3 on (tests/jobs/noisy_layer_job.py, which
imports nothing of ours). With every edge off, the traced A/A pair names that random op in
that layer's forward at step 3, kind origin, on every rank. And on the MindSpore reference
workload, which does not drift: traced at Cell granularity, nothing to explain, exit 0."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from bisect_prefetch.cli import main

pytest.importorskip("torch")
JOB = Path(__file__).resolve().parents[1] / "jobs" / "noisy_layer_job.py"
pytestmark = pytest.mark.slow


def test_explain_names_the_random_op_in_the_noisy_layer_at_step_3(tmp_path, capsys):
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            str(JOB), "--steps", "{steps}"]
    experiment = tmp_path / "noisy.yaml"
    experiment.write_text(textwrap.dedent(f"""
        name: noisy
        command: {json.dumps(argv)}
        metrics: {{format: torchtitan, names: [loss, grad_norm]}}
        graph: {{source: runtime}}
        steps: 3
        timeout_s: 180
    """))
    out = tmp_path / "explain.json"
    code = main(["explain", str(experiment), "--mask", "all-off", "--steps", "2-3",
                 "--state-dir", str(tmp_path / "state"), "--json", str(out)])
    text = capsys.readouterr().out
    assert code == 1, text
    result = json.loads(out.read_text())
    assert result["verdict"] == "explained" and result["mask"] == []
    first = result["first"]
    assert (first["step"], first["phase"], first["module"], first["op"], first["kind"]) == (
        3, "forward", "layers.1", "aten.randn", "origin"), first
    noise_line = next(k for k, line in enumerate(JOB.read_text().splitlines(), 1)
                      if "torch.randn" in line)
    assert first["stack"].endswith(f"noisy_layer_job.py:{noise_line}")
    assert [(r["rank"], r["kind"], r["op"], r["step"]) for r in result["ranks"]] == [
        (0, "origin", "aten.randn", 3), (1, "origin", "aten.randn", 3)]
    assert result["overhead"]["ops_per_step"] > 100 and result["overhead"]["bytes_per_step"] > 0
    assert ("first divergence: rank 0, step 3, forward of layers.1: aten.randn (origin: inputs "
            "matched, output differed)") in text
    assert "rank 1: the same op" in text
    # The state dir keeps the result; its HTML report shows the op among its neighbours.
    state = tmp_path / "state" / "noisy"
    saved = json.loads((state / "explain.json").read_text())
    assert saved["first"] == first and any(n["first"] for n in saved["neighbours"])
    assert "First differing op" in (state / "report.html").read_text()


def test_explain_on_mindspore_traces_cells_and_finds_nothing_to_explain(tmp_path, capsys):
    pytest.importorskip("mindspore")
    experiment = tmp_path / "ms.yaml"
    experiment.write_text(textwrap.dedent("""
        name: ms
        workload: {builtin: mindspore, layers: 3, world_size: 1}
        metrics: {format: jsonl, names: [loss, grad_norm]}
        graph: {source: runtime}
        steps: 3
        timeout_s: 300
    """))
    out = tmp_path / "explain.json"
    code = main(["explain", str(experiment), "--runs", "2", "--state-dir",
                 str(tmp_path / "state"), "--json", str(out)])
    text = capsys.readouterr().out
    assert code == 0, text
    result = json.loads(out.read_text())
    assert result["verdict"] == "consistent" and result["first"] is None
    assert result["overhead"]["granularity"] == "cell" and result["overhead"]["ops_per_step"] > 10
    assert "-> consistent: nothing to explain (2 runs" in text
