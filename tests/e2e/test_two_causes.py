"""End to end: a user's own FSDP2 job with two independent causes of drift, each enough alone
(tests/jobs/two_causes_job.py on 4 layers: its own one-ulp nudge on the backward prefetch into
layers.2 and into layers.1; it imports nothing of ours, sets its own step count, and the tool
is not told).
`bisect` must name both, each as its own set, and only then say culprit-found (one mask a run:
segments cannot lengthen a run whose command fixes its steps), with the next steps of each.
A matrix built from such a verdict (`cells_from`): tests/commands/test_matrix_cells_from.py;
drop-only and keep-only masks on real FSDP2 runs: tests/e2e/test_matrix_on_real_fsdp2.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")
JOB = Path(__file__).resolve().parents[1] / "jobs" / "two_causes_job.py"
CAUSES = {"bwd:layers.3->layers.2", "bwd:layers.2->layers.1"}


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "bisect_prefetch.cli", *args]


def write_experiment(tmp_path: Path) -> Path:
    # 4 backward edges; 6 steps; a cause's nudge comes with chance 0.5 a step, so its
    # per-run chance is about 0.98 (layers are not the point here, two causes are).
    # The command sets its own step count (no {steps}), as many users' scripts do.
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            str(JOB), "--steps", "6", "--seed", "{seed}", "--layers", "4",
            "--fault-targets", "layers.2,layers.1", "--fault-hazard", "0.5"]
    path = tmp_path / "two.yaml"
    path.write_text(textwrap.dedent(f"""
        name: two
        command: {json.dumps(argv)}
        metrics: {{format: torchtitan, names: [loss, grad_norm]}}
        graph: {{source: runtime}}
        steps: 6
        seed: 1
        timeout_s: 180
        search: {{max_runs: 60}}
    """))
    return path


def test_bisect_names_both_causes_each_as_its_own_set(tmp_path):
    experiment, state = write_experiment(tmp_path), tmp_path / "state"
    done = subprocess.run(cli("bisect", str(experiment), "--state-dir", str(state),
                              "--json", str(tmp_path / "bisect.json")),
                          cwd=tmp_path, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 1, done.stdout + done.stderr
    # Segments (the default) cannot lengthen its runs: one mask a run, said once.
    assert done.stdout.count("segments: the command sets its own step count") == 1, done.stdout
    result = json.loads((tmp_path / "bisect.json").read_text())
    sets = result.get("culprit_sets")
    assert sets is not None, done.stdout  # the verdict names every cause it found
    assert sorted(tuple(s["edges"]) for s in sets) == sorted((edge,) for edge in CAUSES), done.stdout
    assert result["verdict"] == "culprit-found", done.stdout
    assert result["minimal_set"] == sets[0]["edges"]
    for found in sets:
        assert found["keep_only_runs"], found  # each set diverged alone
        assert found["per_run_chance"] is None or 0 < found["per_run_chance"] <= 1
        # numbered as the transcript's run lines, as run_details says them
        assert all(result["run_details"][n - 1]["run"] == n for n in found["keep_only_runs"])
        assert found["size_one"] is False  # 2 ranks shard every unit: no guard step below
    # Next steps: each cause alone, the whole fix, each explained; in the state dir given.
    assert [(s["step"], s["cause"]) for s in result["next_steps"]] == [
        ("reproduce", 1), ("reproduce", 2), ("fix", None), ("explain", 1), ("explain", 2)]
    assert all(s["command"].endswith(f"--state-dir={state}") for s in result["next_steps"])
