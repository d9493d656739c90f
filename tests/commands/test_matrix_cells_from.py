"""A matrix whose cells come from a bisection's verdict (`cells_from: bisect.json`).

Through the CLI, on the stand-in job (tests/jobs/fake_job.py, mode two-causes: two backward
edges each make runs drift alone, on a static graph of 3 layers): each cause dropped alone
still diverges, all dropped is consistent. A verdict of one set (a bisect.json from before
`culprit_sets`, only `minimal_set`) makes the one cell "all dropped", which here fails, as it
should: the other cause is still on. Bad input is one line and exit 2, before any run.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from bisect_prefetch.cli import main
from bisect_prefetch.experiment.verdict_cells import runs_to_see
from tests.conftest import FAKE_JOB

FIRST, SECOND = "bwd:layers.1->layers.0", "bwd:layers.2->layers.1"


def write_files(tmp_path: Path, verdict: dict, cells: str = "") -> Path:
    """An experiment on the stand-in job, the bisect.json, and a matrix taking cells from it."""
    argv = [sys.executable, str(FAKE_JOB), "two-causes"]
    (tmp_path / "exp.yaml").write_text(textwrap.dedent(f"""
        name: fake
        command: {json.dumps(argv)}
        metrics: {{format: jsonl, names: [loss]}}
        graph: {{source: static, policy: fsdp2-chain, layers: 3}}
        steps: 6
        timeout_s: 30
    """))
    (tmp_path / "bisect.json").write_text(json.dumps(verdict))
    matrix = tmp_path / "from-verdict.yaml"
    matrix.write_text("experiment: exp.yaml\ncells_from: bisect.json\n" + cells)
    return matrix


def culprit_set(*edges: str, chance: float | None = 0.8) -> dict:
    return {"edges": list(edges), "confidence": 0.97, "per_run_chance": chance,
            "keep_only_runs": [3]}


def run(tmp_path: Path, matrix: Path, capsys) -> tuple[int, dict | None, str]:
    out = tmp_path / "matrix.json"
    code = main(["matrix", str(matrix), "--state-dir", str(tmp_path / "state"),
                 "--json", str(out)])
    captured = capsys.readouterr()
    return code, (json.loads(out.read_text()) if out.exists() else None), captured.out + captured.err


def cells_of(result: dict) -> list[tuple]:
    return [(c["name"], c["mask_spec"], c["runs"] if c["verdict"] == "consistent" else None,
             c["expect"], c["verdict"]) for c in result["cells"]]


def test_each_cause_dropped_alone_diverges_and_all_dropped_is_consistent(tmp_path, capsys):
    verdict = {"experiment": "fake", "verdict": "culprit-found", "minimal_set": [FIRST],
               "culprit_sets": [culprit_set(FIRST), culprit_set(SECOND, chance=0.5)]}
    code, result, out = run(tmp_path, write_files(tmp_path, verdict), capsys)
    assert code == 0, out
    # Dropped alone, a cause leaves the other on; the runs a cell may take follow the weakest
    # other cause's per-run chance (0.5: 5 runs; 0.8: 2), all dropped the weakest of all.
    assert cells_of(result) == [
        ("cause-1-dropped", [f"drop-only:{FIRST}"], None, "diverged", "diverged"),
        ("cause-2-dropped", [f"drop-only:{SECOND}"], None, "diverged", "diverged"),
        ("all-causes-dropped", [f"drop-only:{FIRST},{SECOND}"], 5, "consistent", "consistent")]
    assert "cell 1/3 cause-1-dropped: mask drop-only:bwd:layers.1->layers.0" in out
    assert "up to 5 runs, expect diverged" in out  # cause 1 dropped: cause 2 (0.5) is left
    assert "cell 2/3 cause-2-dropped" in out and "up to 2 runs, expect diverged" in out
    assert sorted(result["cells"][2]["mask"]) == ["fwd:layers.0->layers.1", "fwd:layers.1->layers.2"]


def test_a_verdict_below_the_confidence_asked_meets_no_expectation(tmp_path, capsys):
    """The cells run and agree with the verdict, yet the verdict itself was never reached at
    the confidence asked (confidence_met false): every cell built from it fails, saying so."""
    verdict = {"experiment": "fake", "verdict": "culprit-found", "minimal_set": [FIRST],
               "culprit_sets": [culprit_set(FIRST), culprit_set(SECOND)],
               "confidence": 0.947, "confidence_asked": 0.95, "confidence_met": False}
    code, result, out = run(tmp_path, write_files(tmp_path, verdict), capsys)
    assert code == 1, out
    assert [c["verdict"] for c in result["cells"]] == ["diverged", "diverged", "consistent"]
    assert not any(c["expectation_met"] for c in result["cells"])
    assert out.count("FAILED (the verdict it checks (culprit-found) holds at confidence 0.947, "
                     "below the 0.95 asked)") == 3, out


def test_a_single_set_verdict_checks_only_all_dropped_and_here_misses_a_cause(tmp_path, capsys):
    """Only `minimal_set` (no culprit_sets): one cell, every cause dropped, expected consistent;
    the stand-in has a second cause the verdict did not name, so the cell fails (exit 1)."""
    verdict = {"experiment": "fake", "verdict": "culprit-found", "minimal_set": [FIRST],
               "calibration": {"per_run_chance": 0.6}}  # 0.4^4 <= 0.05 < 0.4^3: 4 runs
    matrix = write_files(tmp_path, verdict,
                         "cells:\n  - {name: all-on, mask: all-on, runs: 2, expect: diverged}\n")
    code, result, out = run(tmp_path, matrix, capsys)
    assert code == 1, out
    assert [(c["name"], c["mask_spec"], c["runs"], c["expect"], c["verdict"])
            for c in result["cells"]] == [
        ("all-causes-dropped", [f"drop-only:{FIRST}"], 2, "consistent", "diverged"),  # stopped
        ("all-on", ["all-on"], 2, "diverged", "diverged")]
    assert result["failed"] == ["all-causes-dropped"]
    assert "all-causes-dropped: mask drop-only:bwd:layers.1->layers.0, guard none, up to 4 runs" in out


@pytest.mark.parametrize("verdict, words", [
    ({"experiment": "fake", "verdict": "no-drift-reproduced", "minimal_set": []},
     "the verdict (no-drift-reproduced) names no culprit set, so there is nothing to drop"),
    ({"experiment": "fake", "verdict": "inconclusive", "minimal_set": [], "culprit_sets": []},
     "the verdict (inconclusive) names no culprit set"),
    ({"experiment": "fake", "culprit_sets": [{"edges": "bwd:layers.1->layers.0"}]},
     "edges must be a list of edge ids, not 'bwd:layers.1->layers.0'"),
    ({"experiment": "fake", "culprit_sets": [culprit_set(FIRST, chance=1.5)]},
     "per_run_chance 1.5 is not in (0, 1]"),
    ({"experiment": "other", "minimal_set": [FIRST]},
     "a bisection of experiment 'other', not of this matrix's 'fake'"),
    ({"verdict": "culprit-found", "culprit_sets": [culprit_set(FIRST), culprit_set(SECOND)]},
     None),  # no experiment named (a hand-written file): taken as it is; the cells' names clash
])
def test_a_bisect_json_without_sets_or_of_another_job_is_refused_before_any_run(
        tmp_path, capsys, verdict, words):
    clash = "cells:\n  - {name: all-causes-dropped, mask: all-on, runs: 2, expect: diverged}\n"
    code, result, out = run(tmp_path, write_files(tmp_path, verdict, clash), capsys)
    assert code == 2 and result is None, out
    expected = words or "cell name 'all-causes-dropped' is used twice (cells_from names its cells so)"
    assert expected in " ".join(out.split()), out
    assert not (tmp_path / "state" / "fake" / "runs").exists()


def test_a_verdict_whose_edges_are_not_in_the_graph_is_refused_naming_where_they_came_from(
        tmp_path, capsys):
    verdict = {"experiment": "fake", "verdict": "culprit-found",
               "culprit_sets": [culprit_set("bwd:layers.7->layers.6"), culprit_set(SECOND)]}
    code, result, out = run(tmp_path, write_files(tmp_path, verdict), capsys)
    assert code == 2 and result is None, out
    text = " ".join(out.split())
    assert ("cell 'cause-1-dropped' (a cell of cells_from " in text
            and "bisect.json: its edges are not in the graph): selector 'bwd:layers.7->layers.6' "
                "matches no edge" in text), out
    assert not list((tmp_path / "state" / "fake" / "runs").glob("*matrix*"))  # no cell ran


def test_unreadable_verdict_and_a_matrix_without_cells(tmp_path, capsys):
    matrix = write_files(tmp_path, {})
    (tmp_path / "bisect.json").write_text("{not json")
    code, _, out = run(tmp_path, matrix, capsys)
    assert code == 2 and "bisect.json: not a readable bisect.json" in " ".join(out.split()), out
    matrix.write_text("experiment: exp.yaml\n")
    code, _, out = run(tmp_path, matrix, capsys)
    assert code == 2 and "a matrix needs cells, or cells_from a bisect.json" in out, out


def test_runs_a_cell_takes_follow_the_weakest_per_run_chance():
    assert runs_to_see([0.5]) == 5  # 0.5^5 = 0.03 <= 0.05 < 0.5^4
    assert runs_to_see([0.8, 0.3]) == 9  # 0.7^9 = 0.04
    assert runs_to_see([1.0]) == 2 and runs_to_see([0.9]) == 2
    assert runs_to_see([None]) == 4 and runs_to_see([]) == 4  # no chance measured: the default
    assert runs_to_see([0.01]) == 12  # capped
