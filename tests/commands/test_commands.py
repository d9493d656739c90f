"""Commands not covered by their own transcript tests, through the CLI: simulate, graph errors."""

from __future__ import annotations

import json

import pytest

from bisect_prefetch.cli import main


def test_simulate_narrates_scores_and_writes_json(tmp_path, capsys):
    out = tmp_path / "sim.json"
    code = main(["simulate", "--policy", "fsdp2-chain", "--layers", "3",
                 "--culprit", "bwd:layers.2->layers.1", "--hazard", "0.05", "--steps", "20",
                 "--trials", "3", "--seed", "7", "--json", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "simulating 3 searches on fsdp2-chain x 3 layers, culprit "
        "bwd:layers.2->layers.1, hazard 0.05 over 20 steps, seed 7...",
        f"per-run divergence chance q = {data['per_run_chance']:.3f} ({data['edges']} edges)",
        f"accuracy {data['accuracy']:.3f} (claimed confidence {data['claimed_confidence']:.3f})",
        f"runs: median {data['runs_median']:g}, p90 {data['runs_p90']:g}; "
        f"steps: median {data['steps_median']:g}",
        "runs by stage (mean): " + ", ".join(
            f"{step} {runs:.1f}" for step, runs in data["runs_by_step_mean"].items() if runs),
        f"wall-clock on 1 slot: median {data['rounds_median']:.1f}, p90 {data['rounds_p90']:.1f} "
        "full runs",
        f"wrote {out}",
    ]
    assert data["trials"] == 3 and len(data["results"]) == 3
    assert sum(data["runs_by_step_mean"].values()) == pytest.approx(
        sum(r["runs"] for r in data["results"]) / 3)


def test_usage_errors_of_graph_are_one_line_and_exit_2(capsys):
    assert main(["graph"]) == 2
    assert capsys.readouterr().err == "error: give an experiment file, or --policy NAME and --layers N\n"
    assert main(["graph", "--policy", "fsdp2-chain", "--layers", "2", "--format", "png"]) == 2
    assert capsys.readouterr().err == "error: --format png needs --out FILE\n"
