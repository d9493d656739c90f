"""The experiment matrix: cell order, expectations, outputs and exit codes.

Most tests inject a fake group runner: it resolves each cell's mask against
the FSDP2 reference graph and diverges exactly when the mask enables the
planted edge, so the configs' masks are checked for real. The reported
prefetch-subset matrix on the real FSDP2 workload: tests/e2e/test_matrix_on_real_fsdp2.py.
"""

from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from bisect_prefetch.cli import main
from bisect_prefetch.commands import matrix as matrix_mod
from bisect_prefetch.commands.matrix import CellRequest, count_divergences, run_matrix
from bisect_prefetch.experiment import expectation_met, load_matrix
from bisect_prefetch.graph import PrefetchGraph, from_policy
from bisect_prefetch.select import resolve_mask
from tests.conftest import console, parse_markdown_table

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
PLANTED = "bwd:layers.1->layers.0"


def fsdp2_graph(layers: int) -> PrefetchGraph:
    """The FSDP2 workload's discovered graph: the explicit chain plus the root's implicit edge."""
    graph = from_policy("fsdp2-chain", layers)
    graph.add_node("root", kind="root", order=-1)
    graph.add_edge("bwd", "root", f"layers.{layers - 1}", implicit=True)
    return graph


class FakeGroups:
    """Diverges when the cell's mask enables the culprit; records what it was asked."""

    def __init__(self, graph: PrefetchGraph, culprit: str = PLANTED, *, errors=()):
        self.edge_ids = graph.edge_ids()
        self.culprit = culprit
        self.errors = set(errors)
        self.requests: list[CellRequest] = []

    def __call__(self, request: CellRequest) -> dict:
        self.requests.append(request)
        mask = resolve_mask(request.mask, self.edge_ids)
        if request.name in self.errors:
            details = [{"run_id": f"{request.name}-{k}", "outcome": "timeout",
                        "first_diff_step": None} for k in range(request.runs)]
            return {"verdict": "error", "mask": sorted(mask), "runs": request.runs,
                    "metrics": {}, "first_diff_step": None, "run_details": details,
                    "reason": "only 0 usable run(s)"}
        diverged = self.culprit in mask
        runs = 2 if diverged else request.runs  # the group stops at its first divergence
        details = [{"run_id": f"{request.name}-{k}", "outcome": "ok",
                    "first_diff_step": 4 if diverged and k == 1 else None} for k in range(runs)]
        stats = {"first_diff_step": 4 if diverged else None, "mae": 1e-7 if diverged else 0.0,
                 "p95": 2e-7 if diverged else 0.0, "max_abs": 3e-7 if diverged else 0.0,
                 "steps_compared": 20, "steps_differing": 16 if diverged else 0}
        return {"verdict": "diverged" if diverged else "consistent", "mask": sorted(mask),
                "runs": runs, "metrics": {"loss": stats, "grad_norm": dict(stats)},
                "first_diff_step": 4 if diverged else None, "run_details": details}


def write_matrix(tmp_path: Path, cells: list[dict], layers: int = 4) -> Path:
    data = {
        "experiment": {"name": "m", "workload": {"builtin": "fsdp2", "layers": layers,
                                                  "world_size": 2}},
        "cells": cells,
    }
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_expectations():
    assert expectation_met("consistent", "consistent")
    assert not expectation_met("consistent", "diverged")
    assert expectation_met("diverged", "diverged")
    assert not expectation_met("diverged", "consistent")
    assert expectation_met("any", "consistent") and expectation_met("any", "diverged")
    # A cell that could not run says nothing about drift, whatever it expected.
    for expect in ("consistent", "diverged", "any"):
        assert not expectation_met(expect, "error")


def test_divergences_count_runs_that_differ_from_the_reference():
    group = {"verdict": "diverged", "run_details": [
        {"outcome": "ok", "first_diff_step": None},
        {"outcome": "stopped-early", "first_diff_step": 3},
        {"outcome": "error", "first_diff_step": 2},  # unusable: not a divergence
        {"outcome": "ok", "first_diff_step": 7},
    ]}
    assert count_divergences(group) == 2
    assert count_divergences({"verdict": "diverged"}) == 1
    assert count_divergences({"verdict": "consistent"}) == 0


@pytest.mark.parametrize("config, graph", [
    ("matrix-prefetch-subsets.yaml", fsdp2_graph(8)),
    ("matrix-mindspore-prefetch-subsets.yaml", from_policy("mindformers", 4)),
])
def test_reported_pattern_configs_meet_their_expectations(config, graph):
    """Against a drift source on layer1->layer0 backward, each shipped subset matrix passes."""
    matrix = load_matrix(CONFIGS / config)
    culprit = matrix.experiment.workload.fault.edge
    fake = FakeGroups(graph, culprit)
    result = run_matrix(matrix, fake, name="subsets")
    verdicts = {c.name: c.verdict for c in result.cells}
    assert verdicts["all-on"] == "diverged"
    assert verdicts["forward-off"] == "diverged"
    for name, verdict in verdicts.items():
        if name.startswith(("all-off", "backward-off", "keep-only", "drop-only")):
            assert verdict == "consistent", name
    assert result.ok and result.exit_code == 0
    # The tail -> last-layer cell keeps exactly one backward edge into the last layer.
    keep = next(r for r in fake.requests if r.name.startswith("keep-only"))
    (edge,) = resolve_mask(keep.mask, graph.edge_ids())
    assert edge in ("bwd:root->layers.7", "bwd:output_layer->decoder.layers.3")


def test_topology_template_cells_change_the_topology():
    matrix = load_matrix(CONFIGS / "mindformers-topology.yaml")
    seen = {}
    for cell in matrix.cells:
        overrides = matrix.experiment_for(cell).overrides
        tp, cp = overrides["parallel_config.model_parallel"], overrides["parallel_config.context_parallel"]
        assert overrides["parallel_config.data_parallel"] * tp * cp == 8
        assert overrides["seed"] == 42  # the shared settings survive the cell's override
        seen[cell.name] = (tp, cp)
    assert {seen["TP1+CP1"], seen["TP2+CP1"], seen["TP1+CP4"], seen["TP2+CP4"]} == {
        (1, 1), (2, 1), (1, 4), (2, 4)}


def test_cells_run_in_file_order_with_their_settings(tmp_path):
    path = write_matrix(tmp_path, [
        {"name": "z-first", "mask": "all-off", "runs": 3, "expect": "consistent"},
        {"name": "a-second", "mask": ["fwd", PLANTED], "guard": "size-one", "runs": 2,
         "expect": "diverged", "overrides": {"workload.world_size": 1}},
    ])
    fake = FakeGroups(fsdp2_graph(4))
    result = run_matrix(load_matrix(path), fake)
    assert [r.name for r in fake.requests] == ["z-first", "a-second"]
    first, second = fake.requests
    assert first.guard == "none" and second.guard == "size-one"
    assert second.experiment.workload.world_size == 1
    assert first.experiment.workload.world_size == 2
    assert second.mask == ["fwd", PLANTED]
    # Each cell keys its own runs in the run store, so cells never share runs.
    assert first.purpose != second.purpose
    data = result.to_json()
    assert [c["name"] for c in data["cells"]] == ["z-first", "a-second"]
    assert data["cells"][1]["divergences"] == 1 and data["cells"][1]["first_diff_step"] == 4
    assert data["ok"] is True and data["failed"] == []


def test_failed_and_error_cells_make_exit_code_1(tmp_path):
    path = write_matrix(tmp_path, [
        {"name": "wrong", "mask": "all-on", "runs": 2, "expect": "consistent"},
        {"name": "broken", "mask": "all-off", "runs": 2, "expect": "any"},
        {"name": "fine", "mask": "all-off", "runs": 2, "expect": "consistent"},
    ])
    result = run_matrix(load_matrix(path), FakeGroups(fsdp2_graph(4), errors={"broken"}))
    assert result.failed == ["wrong", "broken"]
    assert not result.ok and result.exit_code == 1


class Interrupting(FakeGroups):
    """Ctrl-C while the named cell runs, the first time only."""

    def __init__(self, graph: PrefetchGraph, at: str):
        super().__init__(graph)
        self.at = at

    def __call__(self, request: CellRequest) -> dict:
        if request.name == self.at:
            self.at = None
            raise KeyboardInterrupt
        return super().__call__(request)


CELLS = [
    {"name": "all-on", "mask": "all-on", "runs": 2, "expect": "diverged"},
    {"name": "drop-planted", "mask": f"drop-only:{PLANTED}", "runs": 3, "expect": "consistent"},
    {"name": "forward-off", "mask": "forward-off", "runs": 2, "expect": "diverged"},
]


def run_command(tmp_path, cells, runner, **outputs):
    """The matrix command's exit code (or "interrupted") and its transcript."""
    path = write_matrix(tmp_path, cells)
    out = io.StringIO()
    try:
        code = matrix_mod.matrix(path, state_dir=tmp_path / "state", console=console(out),
                                 run_group=runner, env={}, **outputs)
    except KeyboardInterrupt:
        code = "interrupted"
    return code, [line.rstrip() for line in out.getvalue().replace(str(tmp_path), "TMP").splitlines()]


ALL_MET = """\
matrix m: 3 cells, up to 7 runs, experiment m
cell 1/3 all-on: mask all-on, guard none, up to 2 runs, expect diverged
-> diverged at step 4 (1 of 2 runs diverged); expected diverged: ok
cell 2/3 drop-planted: mask drop-only:bwd:layers.1->layers.0, guard none, up to 3 runs, expect consistent
-> consistent (0 of 3 runs diverged); expected consistent: ok
cell 3/3 forward-off: mask forward-off, guard none, up to 2 runs, expect diverged
-> diverged at step 4 (1 of 2 runs diverged); expected diverged: ok
matrix m
┏━━━━━━━━━━━━━━┳━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━┳━━━━━━━━━━┳━━━━━━━━━━┳━━━━━━━━━━━━━━┳━━━━━━━━━━━━━━━┳━━━━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━┳━━━━━━┳━━━━━━━━━━┳━━━━━━━━━━━━━━━━┓
┃ cell         ┃ verdict    ┃ first diff step ┃ loss MAE ┃ loss P95 ┃ loss max abs ┃ grad_norm MAE ┃ grad_norm P95 ┃ grad_norm max abs ┃ runs ┃ diverged ┃ expect         ┃
┡━━━━━━━━━━━━━━╇━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━╇━━━━━━━━━━╇━━━━━━━━━━╇━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━╇━━━━━━╇━━━━━━━━━━╇━━━━━━━━━━━━━━━━┩
│ all-on       │ diverged   │               4 │    1e-07 │    2e-07 │        3e-07 │         1e-07 │         2e-07 │             3e-07 │    2 │        1 │ diverged: ok   │
│ drop-planted │ consistent │               - │        0 │        0 │            0 │             0 │             0 │                 0 │    3 │        0 │ consistent: ok │
│ forward-off  │ diverged   │               4 │    1e-07 │    2e-07 │        3e-07 │         1e-07 │         2e-07 │             3e-07 │    2 │        1 │ diverged: ok   │
└──────────────┴────────────┴─────────────────┴──────────┴──────────┴──────────────┴───────────────┴───────────────┴───────────────────┴──────┴──────────┴────────────────┘
all 3 expectations met
"""


def test_matrix_transcript_all_met(tmp_path):
    code, lines = run_command(tmp_path, CELLS, FakeGroups(fsdp2_graph(4)))
    assert lines == ALL_MET.splitlines()
    assert code == 0


def test_matrix_transcript_one_expectation_failed_and_its_outputs(tmp_path):
    cells = [*CELLS[:2], {**CELLS[2], "expect": "consistent"}]
    summary = tmp_path / "summary.md"
    files = {k: tmp_path / f"out.{k}" for k in ("xml", "md", "json")}
    path = write_matrix(tmp_path, cells)
    out = io.StringIO()
    code = matrix_mod.matrix(
        path, state_dir=tmp_path / "state", console=console(out), junit=files["xml"],
        markdown=files["md"], json_out=files["json"], run_group=FakeGroups(fsdp2_graph(4)),
        env={"GITHUB_STEP_SUMMARY": str(summary)},
    )
    lines = [line.rstrip() for line in out.getvalue().replace(str(tmp_path), "TMP").splitlines()]
    assert lines == ONE_FAILED.splitlines()
    assert code == 1

    suite = ET.parse(files["xml"]).getroot().find("testsuite")
    assert suite.get("tests") == "3" and suite.get("failures") == "1"
    failed = [c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None]
    assert failed == ["forward-off"]
    rows = parse_markdown_table(files["md"].read_text())
    assert [r["verdict"] for r in rows] == ["diverged", "consistent", "diverged"]
    assert parse_markdown_table(summary.read_text()) == rows
    data = json.loads(files["json"].read_text())
    assert data["failed"] == ["forward-off"]
    saved = json.loads((tmp_path / "state" / "m" / "matrix.json").read_text())
    state = tmp_path / "state"  # the command that reruns it: every option it was given
    assert saved["command"] == (f"bisect-prefetch matrix {path} --state-dir={state} "
                                f"--junit={files['xml']} --markdown={files['md']} "
                                f"--json={files['json']}")


ONE_FAILED = """\
matrix m: 3 cells, up to 7 runs, experiment m
cell 1/3 all-on: mask all-on, guard none, up to 2 runs, expect diverged
-> diverged at step 4 (1 of 2 runs diverged); expected diverged: ok
cell 2/3 drop-planted: mask drop-only:bwd:layers.1->layers.0, guard none, up to 3 runs, expect consistent
-> consistent (0 of 3 runs diverged); expected consistent: ok
cell 3/3 forward-off: mask forward-off, guard none, up to 2 runs, expect consistent
-> diverged at step 4 (1 of 2 runs diverged); expected consistent: FAILED
matrix m
┏━━━━━━━━━━━━━━┳━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━┳━━━━━━━━━━┳━━━━━━━━━━┳━━━━━━━━━━━━━━┳━━━━━━━━━━━━━━━┳━━━━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━┳━━━━━━┳━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━┓
┃ cell         ┃ verdict    ┃ first diff step ┃ loss MAE ┃ loss P95 ┃ loss max abs ┃ grad_norm MAE ┃ grad_norm P95 ┃ grad_norm max abs ┃ runs ┃ diverged ┃ expect             ┃
┡━━━━━━━━━━━━━━╇━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━╇━━━━━━━━━━╇━━━━━━━━━━╇━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━╇━━━━━━╇━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━┩
│ all-on       │ diverged   │               4 │    1e-07 │    2e-07 │        3e-07 │         1e-07 │         2e-07 │             3e-07 │    2 │        1 │ diverged: ok       │
│ drop-planted │ consistent │               - │        0 │        0 │            0 │             0 │             0 │                 0 │    3 │        0 │ consistent: ok     │
│ forward-off  │ diverged   │               4 │    1e-07 │    2e-07 │        3e-07 │         1e-07 │         2e-07 │             3e-07 │    2 │        1 │ consistent: FAILED │
└──────────────┴────────────┴─────────────────┴──────────┴──────────┴──────────────┴───────────────┴───────────────┴───────────────────┴──────┴──────────┴────────────────────┘
1 of 3 expectations FAILED: forward-off
wrote TMP/out.md
wrote TMP/summary.md
wrote TMP/out.xml
wrote TMP/out.json
"""


def test_matrix_transcript_interrupted_then_resumed(tmp_path):
    runner = Interrupting(fsdp2_graph(4), at="drop-planted")
    code, lines = run_command(tmp_path, CELLS, runner)
    assert lines == INTERRUPTED.splitlines()
    assert code == "interrupted"
    assert not (tmp_path / "state" / "m" / "matrix.json").exists()
    code, lines = run_command(tmp_path, CELLS, runner)
    assert lines == ALL_MET.splitlines()
    assert code == 0
    assert [r.name for r in runner.requests] == ["all-on", "all-on", "drop-planted", "forward-off"]


INTERRUPTED = """\
matrix m: 3 cells, up to 7 runs, experiment m
cell 1/3 all-on: mask all-on, guard none, up to 2 runs, expect diverged
-> diverged at step 4 (1 of 2 runs diverged); expected diverged: ok
cell 2/3 drop-planted: mask drop-only:bwd:layers.1->layers.0, guard none, up to 3 runs, expect consistent
interrupted: finished runs are in the journal; to resume, run again:
  bisect-prefetch matrix TMP/m.yaml --resume --state-dir=TMP/state
"""


def test_cli_exit_codes(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(matrix_mod, "engine_group_runner",
                        lambda **_: FakeGroups(fsdp2_graph(4)))
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    good = write_matrix(tmp_path, [
        {"name": "on", "mask": "all-on", "runs": 2, "expect": "diverged"}])
    assert main(["matrix", str(good), "--state-dir", str(tmp_path / "s")]) == 0
    bad = write_matrix(tmp_path, [
        {"name": "on", "mask": "all-on", "runs": 2, "expect": "consistent"}])
    assert main(["matrix", str(bad), "--state-dir", str(tmp_path / "s")]) == 1
    # Input errors are exit 2 with one line: a bad key, a selector that matches nothing.
    broken = write_matrix(tmp_path, [{"name": "on", "mask": "all-on", "runs": 2,
                                      "expect": "maybe"}])
    assert main(["matrix", str(broken)]) == 2
    typo = write_matrix(tmp_path, [{"name": "on", "mask": "keep-only:bwd:layers.9->layers.8",
                                    "runs": 2, "expect": "any"}])
    assert main(["matrix", str(typo), "--state-dir", str(tmp_path / "s")]) == 2
    assert "matches no edge" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "missing")]) == 2


