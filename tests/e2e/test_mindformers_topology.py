"""configs/mindformers-topology.yaml, run here up to the parts only a cluster has.

The template's launch path runs as written (msrun and its flags, {config} with
the template's override keys, the worker logs as metrics, its `--mode`) with
these replaced: 2 CPU ranks instead of 8 devices, the reference workload's
entry point and YAML instead of the user's run_mindformer.py and training
YAML, and a step count that YAML makes. Real MindFormers 1.9 on CPU, in its
own venv (`make test` makes it; without it this fails, never skips).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from bisect_prefetch.cli import main
from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.experiment import load_matrix
from bisect_prefetch.metrics.loading import load_files
from bisect_prefetch.workloads import mindformers

TEMPLATE = Path(__file__).resolve().parents[2] / "configs" / "mindformers-topology.yaml"
STEPS = 3
RANKS = 2


def _on_this_machine(tmp_path: Path) -> tuple[dict, dict]:
    """The template's first cell as an experiment file for this machine, and what was replaced."""
    try:
        venv_bin = mindformers.venv_bin()
    except BisectPrefetchError as exc:
        pytest.fail(f"{exc} (`make test` makes it)")
    matrix = load_matrix(TEMPLATE)
    cell = matrix.cells[0]
    experiment = matrix.experiment_for(cell).model_dump(mode="json", exclude_unset=True)
    config = tmp_path / "train.yaml"
    shutil.copy(mindformers.DEFAULT_CONFIG, config)
    replaced = {
        "command": [
            {"--worker_num=8": f"--worker_num={RANKS}", "--local_worker_num=8": f"--local_worker_num={RANKS}",
             "run_mindformer.py": str(mindformers.TRAIN_SCRIPT)}.get(arg, arg)
            for arg in experiment["command"]
        ],
        "config": str(config),
        "overrides": {**experiment["overrides"], "parallel_config.data_parallel": RANKS,
                      "use_parallel": True, "runner_config.stop_step": STEPS},
        "steps": STEPS,
        "graph": {"source": "static", "policy": "mindformers", "layers": 2},
        "env": {**experiment["env"], "PATH": os.pathsep.join([str(venv_bin), os.environ["PATH"]])},
        "timeout_s": 300,
        "no_progress_timeout_s": 120,
    }
    return {**experiment, **replaced}, replaced


def test_the_topology_template_launch_path_runs_on_two_cpu_ranks(tmp_path, monkeypatch):
    experiment, replaced = _on_this_machine(tmp_path)
    template = load_matrix(TEMPLATE).experiment
    # What stays as the user copies it: the launcher and its flags, the mode, the override
    # keys, the metrics (format, names, and which log is read).
    kept = [a for a in template.command if a not in ("--worker_num=8", "--local_worker_num=8", "run_mindformer.py")]
    assert [a for a in experiment["command"] if a in kept] == kept
    assert experiment["command"][0] == "msrun" and "--log_dir={rank_log_dir}" in kept
    assert experiment["metrics"] == template.metrics.model_dump(mode="json", exclude_none=True)
    assert set(template.overrides) <= set(experiment["overrides"])

    path = tmp_path / "topology-here.yaml"
    path.write_text(yaml.safe_dump(experiment, sort_keys=False))
    monkeypatch.chdir(tmp_path)  # a command runs where the tool was started, as the user's would
    out = tmp_path / "aa.json"
    code = main(["aa", str(path), "--runs", "2", "--state-dir", str(tmp_path / "state"),
                 "--json", str(out)])
    result = json.loads(out.read_text())
    assert code == 0, result
    assert result["verdict"] == "consistent"
    for name in ("loss", "grad_norm"):
        assert result["metrics"][name]["steps_compared"] == STEPS
    assert all(d["steps_done"] == STEPS for d in result["run_details"])

    run_dir = sorted((tmp_path / "state" / template.name / "runs").iterdir())[0]
    # The config the run got: the user's YAML with the template's overrides written in.
    written = yaml.safe_load((run_dir / "train.yaml").read_text())
    assert written["seed"] == 42 and written["train_precision_sync"] is True
    assert written["runner_config"]["epochs"] == 1
    assert written["parallel_config"]["data_parallel"] == RANKS
    # Which log is read: msrun's worker logs in the run dir, one per rank.
    workers = sorted(run_dir.glob("rank_logs/worker_*.log"))
    assert [p.name for p in workers] == [f"worker_{r}.log" for r in range(RANKS)]
    trajectory = load_files(workers, "mindformers", names=["loss", "grad_norm"])
    assert trajectory.ranks == list(range(RANKS))
    assert list(trajectory["loss"]) == list(range(1, STEPS + 1))
