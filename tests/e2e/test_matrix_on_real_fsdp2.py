"""The reported prefetch-subset matrix (configs/matrix-prefetch-subsets.yaml, shortened) on the
real FSDP2 workload: every cell's expectation met, JUnit and Markdown written, resumed from
the journal with no run launched again, then reported. Cells, expectations and outputs with
a fake group runner: tests/commands/test_matrix.py."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import yaml

from bisect_prefetch.cli import main
from tests.conftest import parse_markdown_table

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_reported_matrix_on_the_fsdp2_workload(tmp_path, monkeypatch, capsys):
    """The shipped subset matrix, shortened, on real FSDP2 runs; then resumed; then reported."""
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    data = yaml.safe_load((CONFIGS / "matrix-prefetch-subsets.yaml").read_text())
    exp = data["experiment"]
    exp["steps"] = 6
    # 4 layers, not the shipped 8: the pattern is the point, not the scale.
    exp["workload"]["layers"] = 4
    exp["workload"]["fault"]["hazard"] = 0.5  # a run misses the fault with chance 1/64
    data["cells"] = [dict(c, runs=2) for c in data["cells"] if c["expect"] != "any"]
    for cell in data["cells"]:  # the root's prefetch of the last layer, of 4
        cell["mask"] = cell["mask"].replace("bwd:root->layers.7", "bwd:root->layers.3")
    path = tmp_path / "subsets.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    state = tmp_path / "state"
    junit, md = tmp_path / "junit.xml", tmp_path / "m.md"

    code = main(["matrix", str(path), "--junit", str(junit), "--markdown", str(md),
                 "--state-dir", str(state)])
    first = capsys.readouterr().out
    assert code == 0, first
    rows = {r["cell"]: r["verdict"] for r in parse_markdown_table(md.read_text())}
    assert rows == {"all-on": "diverged", "all-off": "consistent", "backward-off": "consistent",
                    "keep-only-root-to-last": "consistent",
                    "drop-only-layer1-to-layer0": "consistent", "forward-off": "diverged"}
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite.get("tests") == "6" and suite.get("failures") == "0"

    # Resumed: every run comes from the journal, none is launched again.
    journal = state / exp["name"] / "journal.jsonl"
    lines_before = journal.read_text().count("\n")
    assert main(["matrix", str(path), "--state-dir", str(state), "--resume"]) == 0
    assert journal.read_text().count("\n") == lines_before
    assert "reused from the journal" in capsys.readouterr().out

    html_path = tmp_path / "r.html"
    assert main(["report", str(state / exp["name"]), "--html", str(html_path)]) == 0
    page = html_path.read_text()
    assert "all 6 expectations met" in page
    assert "keep-only-root-to-last" in page
    # A run stopped at its first differing digest may have no metric line to plot: its
    # digests are plotted then.
    report_dir = state / exp["name"] / "report"
    assert list(report_dir.glob("run-*.png")) or list(report_dir.glob("digests-*.png"))
