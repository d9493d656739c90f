"""The MindFormers reference workload: real MindFormers 1.9 on CPU, in its own venv.

Every test here trains with MindFormers' own trainer (about 10 s a run on one
rank, 30 s on two under msrun). The venv is made by `make test` (the test
target depends on it); without it these tests fail, never skip.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
import yaml

from bisect_prefetch.cli import main
from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.metrics.loading import load_files
from bisect_prefetch.workloads import mindformers

REPO = Path(__file__).resolve().parents[2]
CPU_CONFIG = REPO / "configs" / "mindformers-cpu.yaml"
# MindFormers' per-step line, read here with a pattern of its own to check the parser's numbers.
LOSS_LINE = re.compile(r"step:\[\s*(\d+)/\s*\d+\], loss:\[([0-9.]+)/[0-9.]+\].*global_norm: \[([0-9.]+)\]")


@pytest.fixture(autouse=True)
def mindformers_venv() -> Path:
    try:
        return mindformers.venv_bin()
    except BisectPrefetchError as exc:
        pytest.fail(f"{exc} (`make test` makes it)")


def _experiment(tmp_path: Path, *, name: str = "mf", world_size: int = 1, steps: int = 3,
                extra: str = "") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(textwrap.dedent(f"""
        name: {name}
        workload: {{builtin: mindformers, layers: 2, world_size: {world_size}}}
        metrics: {{format: mindformers, names: [loss, grad_norm], files: "output/log/rank_*/info.log"}}
        steps: {steps}
        seed: 1234
        timeout_s: 240
    """) + textwrap.dedent(extra))
    return path


def _run(tmp_path: Path, *args: str) -> tuple[int, dict | None]:
    out = tmp_path / "result.json"
    out.unlink(missing_ok=True)
    code = main([*args, "--state-dir", str(tmp_path / "state"), "--json", str(out)])
    return code, json.loads(out.read_text()) if out.exists() else None


def _run_dirs(tmp_path: Path, name: str) -> list[Path]:
    return sorted((tmp_path / "state" / name / "runs").iterdir())


def _logged_steps(log: Path) -> dict[int, tuple[float, float]]:
    """step -> (loss, global_norm) from MindFormers' own lines."""
    found = {}
    for line in log.read_text().splitlines():
        m = LOSS_LINE.search(line)
        if m:
            found[int(m.group(1))] = (float(m.group(2)), float(m.group(3)))
    return found


@pytest.fixture(scope="module")
def cpu_config_aa(tmp_path_factory) -> tuple[int, dict, Path]:
    """`aa configs/mindformers-cpu.yaml --runs 2`, once for the tests that read it."""
    tmp_path = tmp_path_factory.mktemp("cpu-config")
    code, result = _run(tmp_path, "aa", str(CPU_CONFIG), "--runs", "2")
    return code, result, tmp_path


def test_aa_of_the_cpu_config_is_consistent_on_every_step(cpu_config_aa):
    """The target: `aa configs/mindformers-cpu.yaml --runs 2` exits 0, every step compared."""
    code, result, tmp_path = cpu_config_aa
    assert code == 0, result
    steps = yaml.safe_load(CPU_CONFIG.read_text())["steps"]
    assert result["verdict"] == "consistent"
    for name in ("loss", "grad_norm"):
        assert result["metrics"][name]["steps_compared"] == steps
        assert result["metrics"][name]["steps_differing"] == 0
    for run_dir in _run_dirs(tmp_path, "mindformers-cpu"):
        # The run's YAML is a real MindFormers YAML with the experiment written in.
        written = yaml.safe_load((run_dir / "llama_tiny.yaml").read_text())
        assert written["seed"] == 1234 and written["runner_config"]["stop_step"] == steps
        assert written["model"]["model_config"]["num_layers"] == 2
        assert written["lr_schedule"]["learning_rate"] == 1e-3  # the file's `overrides`
        # MindFormers' own lines, in its own log and on stdout.
        info = run_dir / "output" / "log" / "rank_0" / "info.log"
        assert sorted(_logged_steps(info)) == list(range(1, steps + 1))
        assert "print_output_info: { Epoch:[" in info.read_text()
        assert _logged_steps(run_dir / "stdout.log") == _logged_steps(info)


def test_parser_reads_both_real_log_forms_of_a_real_run(cpu_config_aa):
    """loss:[step/mean] and global_norm: [x], in info.log's and stdout's prefixes, as logged."""
    _, _, tmp_path = cpu_config_aa
    run_dir = _run_dirs(tmp_path, "mindformers-cpu")[0]
    info = run_dir / "output" / "log" / "rank_0" / "info.log"
    expected = _logged_steps(info)
    assert len(expected) == yaml.safe_load(CPU_CONFIG.read_text())["steps"]
    for log in (info, run_dir / "stdout.log"):
        trajectory = load_files([log], "mindformers", names=["loss", "grad_norm"])
        loss, grad_norm = trajectory["loss"], trajectory["grad_norm"]
        assert {s: (loss[s], grad_norm[s]) for s in loss} == expected, log.name


def test_parser_reads_the_sink_mode_form(tmp_path):
    """`loss: X,` (sink mode). Sink mode on CPU still prints loss:[a/b] in 1.9, so: a fixture line."""
    log = tmp_path / "sink.log"
    log.write_text(
        "2026-11-30 22:53:35,123 - mindformers[mindformers/core/callback/callback.py:747] - INFO - "
        "{ Epoch:[  1/  1], step:[    1/    4], loss: 5.548038, per_step_time: 15ms, lr: 0.001, "
        "overflow cond: False, loss_scale: 1.0, global_norm: [1.4349346], "
        "train_throughput_per_npu: 0.003T\n")
    trajectory = load_files([log], "mindformers", names=["loss", "grad_norm"])
    assert trajectory["loss"][1] == pytest.approx(5.548038)
    assert trajectory["grad_norm"][1] == pytest.approx(1.4349346)


def test_aa_on_two_ranks_under_msrun_is_consistent(tmp_path):
    code, result = _run(tmp_path, "aa", str(_experiment(tmp_path, world_size=2, steps=3)),
                        "--runs", "2")
    assert code == 0, result
    assert result["verdict"] == "consistent"
    assert result["metrics"]["loss"]["steps_compared"] == 3
    run_dir = _run_dirs(tmp_path, "mf")[0]
    written = yaml.safe_load((run_dir / "llama_tiny.yaml").read_text())
    assert written["use_parallel"] is True and written["parallel_config"]["data_parallel"] == 2
    # Each rank trains its own shard of the data: two ranks, two loss curves, one grad norm.
    infos = sorted(run_dir.glob("output/log/rank_*/info.log"))
    assert [p.parent.name for p in infos] == ["rank_0", "rank_1"]
    per_rank = [_logged_steps(p) for p in infos]
    assert per_rank[0][1][0] != per_rank[1][1][0]
    assert per_rank[0][1][1] == per_rank[1][1][1]
    # msrun's worker logs hold the same lines.
    workers = sorted(run_dir.glob("rank_logs/worker_*.log"))
    assert [_logged_steps(p) for p in workers] == per_rank


def test_different_seeds_diverge_at_step_1_through_a_matrix_cell(tmp_path):
    experiment = _experiment(tmp_path, steps=2)
    matrix = tmp_path / "seeds.yaml"
    matrix.write_text(textwrap.dedent(f"""
        experiment: {experiment.name}
        cells:
          - name: seed-per-run
            overrides: {{workload.seed_step: 1}}
            mask: all-on
            runs: 2
            expect: diverged
    """))
    code, result = _run(tmp_path, "matrix", str(matrix))
    assert code == 0, result
    (cell,) = result["cells"]
    assert cell["verdict"] == "diverged" and cell["first_diff_step"] == 1
    seeds = sorted(yaml.safe_load((d / "llama_tiny.yaml").read_text())["seed"]
                   for d in (tmp_path / "state").glob("*/runs/*") if (d / "llama_tiny.yaml").exists())
    assert seeds == [1234, 1235]


def test_unknown_override_key_is_one_line_naming_the_nearest_keys(tmp_path, capsys):
    experiment = _experiment(tmp_path, extra="overrides: {runner_config.stop_stp: 3}\n")
    code, _ = _run(tmp_path, "aa", str(experiment))
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "'runner_config.stop_stp'" in err and "nearest: runner_config.stop_step" in err
    assert not (tmp_path / "state" / "mf" / "runs").exists() or not _run_dirs(tmp_path, "mf")


def test_a_run_that_fails_before_its_first_step_is_an_error_with_its_first_error_line(tmp_path):
    # 64 hidden units do not split into 5 heads: MindFormers stops while building the model.
    experiment = _experiment(tmp_path, extra="overrides: {model.model_config.num_heads: 5}\n")
    code, result = _run(tmp_path, "aa", str(experiment), "--runs", "2")
    assert code != 0
    assert result["verdict"] != "consistent"
    details = result["run_details"]
    assert details and all(d["outcome"] == "error" and d["steps_done"] == 0 for d in details)
    # The first error line of its log, not only an exit code.
    assert details[0]["reason"] == "exit code 1: ValueError: 64 is not divisible by 5", details[0]


def test_graph_says_there_is_no_prefetch_graph_to_find(capsys):
    code = main(["graph", str(CPU_CONFIG)])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {mindformers.NO_PREFETCH_GRAPH}"


def test_a_missing_venv_is_one_line_naming_the_make_target(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(mindformers.VENV_ENV, str(tmp_path / "no-venv"))
    code, _ = _run(tmp_path, "aa", str(_experiment(tmp_path)))
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "make mindformers-venv" in err, err
