"""Reports read back: JUnit through xml.etree, Markdown through a table parser, PNGs opened.

Nothing here compares whole strings: each test parses what was written and
checks the facts it must carry.
"""

from __future__ import annotations

import base64
import io
import json
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import matplotlib.image as mpimg
import pytest
from rich.console import Console

from bisect_prefetch.cli import main
from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.graph import from_policy
from bisect_prefetch.metrics.digests import DigestRecord
from bisect_prefetch.report import junit, markdown, plots, table
from bisect_prefetch.report.html import build_report, journal_groups
from bisect_prefetch.report.progress import RunProgress, fmt_duration
from bisect_prefetch.runs.store import RunKey, StateDir, read_journal
from bisect_prefetch.search.protocol import mask_name
from tests.conftest import parse_markdown_table


def _cell(name, verdict, expect, met, *, first=None, runs=3, divergences=0, mae=0.0,
          seconds=1.5):
    stats = {"first_diff_step": first, "mae": mae, "p95": mae * 2, "max_abs": mae * 4,
             "steps_compared": 20, "steps_differing": 0 if first is None else 20 - first}
    return {"name": name, "verdict": verdict, "expect": expect, "expectation_met": met,
            "first_diff_step": first, "runs": runs, "divergences": divergences,
            "mask": ["bwd:layers.1->layers.0"], "seconds": seconds,
            "metrics": {"loss": stats, "grad_norm": dict(stats, mae=mae / 2)}}


@pytest.fixture
def result():
    return {
        "matrix": "subsets",
        "cells": [
            _cell("all-on", "diverged", "diverged", True, first=4, divergences=2, mae=1.25e-7),
            _cell("all|off", "consistent", "consistent", True),
            _cell("forward-off", "consistent", "diverged", False),
            _cell("broken", "error", "any", False, runs=1),
        ],
    }


# -- Markdown ---------------------------------------------------------------
def test_markdown_table_parses_back(result):
    rows = parse_markdown_table(markdown.matrix_markdown(result))
    assert [r["cell"] for r in rows] == ["all-on", "all|off", "forward-off", "broken"]
    first = rows[0]
    assert first["verdict"] == "diverged"
    assert first["first diff step"] == "4"
    assert float(first["loss MAE"]) == pytest.approx(1.25e-7)
    assert float(first["loss max abs"]) == pytest.approx(5e-7)
    assert float(first["grad_norm MAE"]) == pytest.approx(6.25e-8)
    assert first["runs"] == "3" and first["diverged"] == "2"
    assert rows[1]["first diff step"] == "-"
    assert rows[2]["expect"].endswith("FAILED")
    assert rows[0]["expect"].endswith("ok")


def test_markdown_appends_to_step_summary(tmp_path, result):
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step output\n")
    out = tmp_path / "matrix.md"
    written = markdown.publish_markdown(result, out, env={"GITHUB_STEP_SUMMARY": str(summary)})
    assert written == [out, summary]
    text = summary.read_text()
    assert text.startswith("earlier step output\n")
    assert len(parse_markdown_table(text)) == 4
    assert parse_markdown_table(out.read_text()) == parse_markdown_table(text)


def test_markdown_without_summary_env_writes_only_the_file(tmp_path, result):
    out = tmp_path / "m.md"
    assert markdown.publish_markdown(result, out, env={}) == [out]
    assert markdown.publish_markdown(result, None, env={}) == []


# -- JUnit ------------------------------------------------------------------
def test_junit_one_case_per_cell_with_failures_and_properties(tmp_path, result):
    path = tmp_path / "junit.xml"
    junit.write_junit(result, path)
    root = ET.parse(path).getroot()
    suite = root.find("testsuite")
    assert suite.get("tests") == "4"
    assert suite.get("failures") == "1" and suite.get("errors") == "1"
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert list(cases) == ["all-on", "all|off", "forward-off", "broken"]
    props = {p.get("name"): p.get("value") for p in cases["all-on"].iter("property")}
    assert props["runs"] == "3"
    assert props["divergences"] == "2"
    assert props["first_diff_step"] == "4"
    assert cases["all-on"].find("failure") is None and cases["all-on"].find("error") is None
    failure = cases["forward-off"].find("failure")
    assert failure is not None
    assert "expected diverged" in failure.get("message")
    assert cases["broken"].find("error") is not None
    assert float(suite.get("time")) == pytest.approx(6.0)


# -- terminal table ---------------------------------------------------------
def test_terminal_table_has_every_cell_and_the_summary(result):
    out = io.StringIO()
    table.print_matrix(result, Console(file=out, width=250, color_system=None))
    text = out.getvalue()
    for name in ("all-on", "all|off", "forward-off", "broken"):
        assert name in text
    assert "2 of 4 expectations FAILED: forward-off, broken" in text
    headers, rows = table.matrix_rows(result)
    assert headers[:3] == ["cell", "verdict", "first diff step"]
    assert all(len(r) == len(headers) for r in rows)


def test_table_rows_are_never_cut_in_ci_logs(result):
    """Off a terminal the table is printed whole, however narrow the console says it is."""
    out = io.StringIO()
    result["cells"][0]["name"] = "drop-only-layer1-to-layer0-with-a-long-name"
    table.print_matrix(result, Console(file=out, width=60, color_system=None))
    lines = out.getvalue().splitlines()
    row = next(line for line in lines if "drop-only-layer1-to-layer0-with-a-long-name" in line)
    assert "1.25e-07" in row and "diverged: ok" in row
    assert "…" not in out.getvalue()


def test_number_format():
    assert table.fmt_number(None) == "-"
    assert table.fmt_number(0.0) == "0"
    assert table.fmt_number("inf") == "inf"
    assert table.fmt_number(float("nan")) == "nan"
    assert float(table.fmt_number(1.2345e-8)) == pytest.approx(1.23e-8)


# -- plots ------------------------------------------------------------------
def test_group_plot_png_has_the_expected_size(tmp_path):
    a = {"loss": {s: 10.0 / s for s in range(1, 21)}, "grad_norm": {s: 1.0 for s in range(1, 21)}}
    b = {"loss": {s: 10.0 / s + (1e-7 * s if s >= 6 else 0.0) for s in range(1, 21)},
         "grad_norm": dict(a["grad_norm"])}
    path = plots.plot_group(a, b, tmp_path / "g.png", title="all-on")
    image = mpimg.imread(path)
    width, height = plots.group_figure_size(2)
    assert image.shape[:2] == (height, width)
    assert plots.first_differing_step(a["loss"], b["loss"]) == 6
    assert plots.first_differing_step(a["grad_norm"], b["grad_norm"]) is None


def test_digest_heatmap_marks_where_digests_differ(tmp_path):
    params = ["layers.0.w", "layers.1.w"]
    a = [DigestRecord(s, r, p, "x") for s in range(1, 6) for r in (0, 1) for p in params]
    b = [DigestRecord(s, r, p, "y" if (s >= 3 and p == "layers.1.w") or s >= 5 else "x")
         for s in range(1, 6) for r in (0, 1) for p in params]
    steps, rows, grid = plots.digest_difference_matrix(a, b)
    assert steps == [1, 2, 3, 4, 5]
    # Rows that differ first come first: layers.1.w differs from step 3 on both ranks.
    assert rows[:2] == [(0, "layers.1.w"), (1, "layers.1.w")]
    assert grid[0] == [0.0, 0.0, 1.0, 1.0, 1.0]
    assert grid[2] == [0.0, 0.0, 0.0, 0.0, 1.0]
    path = plots.plot_digest_heatmap(a, b[:-1], tmp_path / "h.png")
    image = mpimg.imread(path)
    width, height = plots.heatmap_figure_size(4, 5)
    assert image.shape[:2] == (height, width)
    # The record only run A has is marked apart from a difference.
    _, rows, grid = plots.digest_difference_matrix(a, b[:-1])
    assert grid[rows.index((1, "layers.1.w"))][-1] == 0.5


def _texts(fig) -> list[str]:
    fig.canvas.draw()
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    texts += [ax.get_title() for ax in fig.axes]
    ticks = [label.get_text() for ax in fig.axes
             for label in ax.get_yticklabels() + ax.get_xticklabels()]
    return texts + ticks


def test_a_run_of_several_masks_is_drawn_with_each_segment_and_its_mask():
    a = {"loss": {s: 10.0 / s for s in range(1, 61)}}
    b = {"loss": {s: 10.0 / s + (1e-6 * s if s >= 45 else 0.0) for s in range(1, 61)}}
    segments = [(1, 20, "backward-off"), (21, 40, "keep-only:bwd:layers.2->layers.1"),
                (41, 60, "all-off")]
    fig = plots.group_figure(a, b, segments=segments, title="run 4: 3 masks by step")
    said = _texts(fig) + [t.get_text() for t in fig.texts]
    assert [t for t in said if t.startswith("segment ")] == [
        "segment 1", "segment 2", "segment 3",  # over each segment's steps
        "segment 1, steps 1-20: backward-off",  # the key under the plots
        "segment 2, steps 21-40: keep-only:bwd:layers.2->layers.1", "segment 3, steps 41-60: all-off"]
    assert fig.get_size_inches()[1] * plots.DPI == plots.group_figure_size(1, 3)[1]
    boundaries = sorted({line.get_xdata()[0] for line in fig.axes[0].get_lines()
                         if line.get_linestyle() == "-" and len(set(line.get_xdata())) == 1})
    assert boundaries == [20.5, 40.5]
    # Log-axis ticks in plain text: no mathtext left raw for mathtext is off.
    assert not any("$" in text or "mathdefault" in text for text in said), said


def test_a_run_stopped_at_a_digest_says_so_rather_than_identical():
    a = {"loss": {s: 10.0 / s for s in range(1, 31)}}
    b = {"loss": {s: 10.0 / s for s in range(1, 13)}}  # stopped at step 12, metrics unmoved
    said = _texts(plots.group_figure(a, b, stopped_at=12))
    assert ("stopped at step 12 on a parameter digest;\nthe printed metrics had not moved"
            in said) and "identical" not in said
    assert "identical" in _texts(plots.group_figure(a, a))


def test_digest_heatmap_rows_are_the_differing_parameters_and_their_unit():
    params = ["layers.0.w", "layers.0.b", "layers.1.w", "layers.1.b", "other"]
    a = [DigestRecord(s, 0, p, "x") for s in range(1, 6) for p in params]
    b = [DigestRecord(s, 0, p, "y" if s >= 3 and p == "layers.1.w" else "x")
         for s in range(1, 6) for p in params if s <= 4]  # stopped after step 4
    steps, rows, _ = plots.digest_difference_matrix(a, b, units=["layers.0", "layers.1"])
    assert steps == [1, 2, 3, 4]  # steps the stopped run never reached are no difference
    assert rows == [(0, "layers.1.w"), (0, "layers.1.b")]


# -- progress ---------------------------------------------------------------
class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_plain_progress_prints_a_line_per_event_with_eta():
    out = io.StringIO()
    clock = FakeClock()
    progress = RunProgress(Console(file=out, width=200), total_runs=4, clock=clock)
    assert not progress.live  # a StringIO is not a terminal
    progress.start_group("all-on", 2)
    progress.run_started(1)
    clock.now += 10
    progress.run_finished(1, "clean", 10.0)
    progress.run_started(2)
    clock.now += 20
    progress.run_finished(2, "diverged", 20.0)
    progress.end_group("diverged")
    progress.start_group("all-off", 2)
    progress.run_finished(1, "clean", 0.0, reused=True)
    lines = out.getvalue().splitlines()
    assert lines[0] == "all-on: 2 runs"
    assert "run 1/2 started" in lines[1]
    # After one run of 10 s, three runs are left: ETA 30 s.
    assert "0 diverged so far" in lines[2] and "ETA 0:30" in lines[2]
    # Mean 15 s, two runs left: ETA 30 s; elapsed 30 s.
    assert "1 diverged so far" in lines[4] and "elapsed 0:30" in lines[4]
    assert "all-on: -> diverged (2 runs)" in lines[5]
    # A reused run does not count in the timing: still mean 15 s, one run left.
    assert "reused from the journal" in lines[-1] and "ETA 0:15" in lines[-1]


def test_live_progress_runs_on_a_terminal_console():
    out = io.StringIO()
    console = Console(file=out, width=120, force_terminal=True)
    with RunProgress(console) as progress:
        assert progress.live
        progress.start_group("keep-only:bwd:root->layers.7", 3)
        progress.run_started(1)
        progress.run_finished(1, "diverged", 2.0)
        assert progress.divergences == 1 and progress.eta() == pytest.approx(4.0)
        progress.end_group("diverged")
    assert "diverged" in out.getvalue()


def test_duration_format():
    assert fmt_duration(None) == "?"
    assert fmt_duration(75) == "1:15"
    assert fmt_duration(3725) == "1:02:05"


# -- the HTML report, rebuilt from a state dir ------------------------------
class _TextOf(HTMLParser):
    """Visible text and embedded images of an HTML page."""

    def __init__(self):
        super().__init__()
        self.text: list[str] = []
        self.images: list[bytes] = []

    def handle_data(self, data):
        self.text.append(data)

    def handle_starttag(self, tag, attrs):
        src = dict(attrs).get("src", "")
        if tag == "img" and src.startswith("data:image/png;base64,"):
            self.images.append(base64.b64decode(src.split(",", 1)[1]))


def _write_metrics(run_dir: Path, *, nudge_from: int | None) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    for step in range(1, 11):
        for rank in (0, 1):
            loss = 5.0 / step + (1e-7 * step if nudge_from and step >= nudge_from else 0.0)
            lines.append(json.dumps({"step": step, "rank": rank, "loss": loss,
                                     "grad_norm": 1.0 + step / 100}))
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    digests = [json.dumps({"step": s, "rank": r, "param": p,
                           "digest": "b" if nudge_from and s >= nudge_from - 1 and p == "w0"
                           else "a"})
               for s in range(1, 11) for r in (0, 1) for p in ("w0", "w1")]
    (run_dir / "digests.jsonl").write_text("\n".join(digests) + "\n")


def _state_dir_with_a_bisection(root: Path) -> Path:
    graph = from_policy("fsdp2-chain", 4)
    culprit = "bwd:layers.1->layers.0"
    with StateDir(root, "demo") as state:
        # The golden all-off run, then all-on (diverged at step 6), then drop-only(culprit).
        runs = [("search-golden", [], None), ("search", graph.edge_ids(), 6),
                ("search", [e for e in graph.edge_ids() if e != culprit], None)]
        golden = None
        for index, (purpose, mask, nudge) in enumerate(runs):
            run_id, run_dir = state.new_run_dir(purpose)
            _write_metrics(run_dir, nudge_from=nudge)
            (run_dir / "graph.json").write_text(json.dumps(graph.to_dict()))
            key = RunKey.of(variant=f"{purpose}@abc", mask=mask, guard="none", steps=10,
                            index=index)
            state.append(key, {"run_id": run_id, "outcome": "ok", "reason": "",
                               "first_diff_step": nudge, "wall_s": 3.0, "reference": golden,
                               "step_times_ms": [[step, [8.0, 10.0, 12.5][index]]
                                                 for step in range(3, 11)]})
            golden = golden or run_id
    drop_only = frozenset(graph.edge_ids()) - {culprit}
    (root / "demo" / "bisect.json").write_text(json.dumps({
        "verdict": "culprit-found", "minimal_set": [culprit], "confidence": 0.97,
        "runs_used": 2, "steps_used": 16,
        "evidence": [{"step": "calibrate", "mask": "all-on", "edges": 6, "runs": 1,
                      "divergences": 1, "errors": 0, "first_diff_steps": [6],
                      "verdict": "diverged"},
                     {"step": "drop-only", "mask": mask_name(drop_only, graph.edge_ids()),
                      "edges": 5, "runs": 1, "divergences": 0, "errors": 0,
                      "first_diff_steps": [], "verdict": "clean"}],
        "reproduce": f"bisect-prefetch aa demo.yaml --mask keep-only:{culprit} --runs 5",
    }))
    return root / "demo"


def test_html_report_rebuilt_from_the_state_dir(tmp_path):
    state = _state_dir_with_a_bisection(tmp_path)
    path = build_report(state)
    assert path == state / "report.html"
    page = _TextOf()
    page.feed(path.read_text())
    text = " ".join(page.text)
    assert "verdict: culprit-found, one cause (confidence 0.970)" in text
    assert "bwd:layers.1->layers.0" in text
    # A bisect.json written before next_steps: its reproduce command is the next step.
    assert "bisect-prefetch aa demo.yaml --mask keep-only:bwd:layers.1->layers.0" in text
    # Each evidence row's step time against all-on (10 ms), from the journal's runs of its mask.
    assert "1.000x (10.0 ms; 1.00-1.00x)" in text and "1.250x (12.5 ms; 1.25-1.25x)" in text
    # Embedded: the graph, the diverged run's curves, its digest heat maps (params, units).
    assert len(page.images) == 4
    assert all(img.startswith(b"\x89PNG\r\n\x1a\n") for img in page.images)
    curves = mpimg.imread(state / "report" / "run-00.png")
    width, height = plots.group_figure_size(2)
    assert curves.shape[:2] == (height, width)
    # Parameters: w0 differs (from step 5, on both ranks); w1 is in no unit of w0's: left out.
    assert mpimg.imread(state / "report" / "digests-00.png").shape[:2] == tuple(
        reversed(plots.heatmap_figure_size(2, 10)))
    # Units x steps from 3 before the first divergence (6): parameters w0, w1 are in no unit.
    assert mpimg.imread(state / "report" / "units-00.png").shape[:2] == tuple(
        reversed(plots.heatmap_figure_size(1, 8)))
    assert mpimg.imread(state / "report" / "graph.png").shape[1] >= 600


def test_report_cli_writes_html_where_asked(tmp_path):
    state = _state_dir_with_a_bisection(tmp_path)
    out = tmp_path / "elsewhere.html"
    assert main(["report", str(state), "--html", str(out)]) == 0
    assert "culprit-found" in out.read_text()


def _read_only(monkeypatch, state: Path) -> None:
    """The state dir as a colleague's or a CI artifact's: this user cannot write in it
    (as root here, permissions would not stop a write, so refusal is simulated)."""
    import os as os_module

    inside = str(state.resolve())
    access, mkdir = os_module.access, Path.mkdir

    def no_access(path, mode, *a, **kw):
        if str(Path(path).resolve()).startswith(inside) and mode & os_module.W_OK:
            return False
        return access(path, mode, *a, **kw)

    def no_mkdir(self, *a, **kw):
        if str(self.resolve()).startswith(inside):
            raise PermissionError(13, "Permission denied", str(self))
        return mkdir(self, *a, **kw)

    monkeypatch.setattr(os_module, "access", no_access)
    monkeypatch.setattr(Path, "mkdir", no_mkdir)


def test_report_reads_a_state_dir_it_cannot_write(tmp_path, monkeypatch, capsys):
    state = _state_dir_with_a_bisection(tmp_path)
    before = sorted(p.name for p in state.rglob("*"))
    _read_only(monkeypatch, state)
    out = tmp_path / "elsewhere.html"
    assert main(["report", str(state), "--html", str(out)]) == 0
    page = _TextOf()
    page.feed(out.read_text())
    assert "verdict: culprit-found" in " ".join(page.text) and len(page.images) == 4
    assert sorted(p.name for p in state.rglob("*")) == before  # nothing written there
    # Without --html the page has nowhere to go: one line saying so.
    capsys.readouterr()
    assert main(["report", str(state)]) == 2
    assert "give --html FILE elsewhere" in capsys.readouterr().err


def test_report_lists_what_each_run_read(tmp_path):
    state = _state_dir_with_a_bisection(tmp_path)
    page = build_report(state).read_text().split("<summary>what each run read (3 runs)</summary>")[1]
    assert page.count("no manifest (not reusable)") == 3


def test_journal_groups_and_their_verdicts(tmp_path):
    state = _state_dir_with_a_bisection(tmp_path)
    groups = journal_groups(read_journal(state / "journal.jsonl").records)
    assert [(g.purpose, g.verdict) for g in groups] == [
        ("search-golden", "reference"), ("search", "diverged"), ("search", "consistent")]
    assert groups[1].first_diff_step == 6
    assert len(groups[0].mask) == 0


def test_report_of_an_empty_state_dir_is_an_input_error(tmp_path):
    with pytest.raises(BisectPrefetchError, match="nothing to report"):
        build_report(tmp_path)


# -- bad input: what is missing is said in one line (exit 2), what is there is rendered ------
def _page_text(path: Path) -> str:
    page = _TextOf()
    page.feed(path.read_text())
    return " ".join(page.text)


@pytest.mark.parametrize("damage", ["torn-journal", "run-dir-deleted", "no-bisection",
                                    "bisect-json-edited"])
def test_a_damaged_state_dir_is_reported_with_what_is_there_and_one_line_of_what_is_not(
        tmp_path, capsys, damage):
    import shutil

    state = _state_dir_with_a_bisection(tmp_path)
    if damage == "torn-journal":
        with open(state / "journal.jsonl", "a") as f:
            f.write('{"v": 1, "run_id": "0004-sea')  # a kill mid-write
        said = "journal " + str(state / "journal.jsonl") + ": line(s) 4 unreadable"
    elif damage == "run-dir-deleted":
        shutil.rmtree(state / "runs" / "0002-search")
        said = "1 run dir(s) of the journal missing"
    elif damage == "no-bisection":
        (state / "bisect.json").unlink()
        said = f"no bisection in {state} (bisect.json missing)"
    else:
        (state / "bisect.json").write_text('{"verdict": "culprit-found", "confidence": 0.9, '
                                           '"culprit_sets": [{"edges": 5}]}')
        said = "bisect.json is not one this version reads"
    capsys.readouterr()
    assert main(["report", str(state)]) == 2
    out, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 1 and said in err, err
    assert f"wrote {state / 'report.html'}" in out
    text = _page_text(state / "report.html")
    assert "0001-search-golden" in text and "0003-search" in text  # the runs still listed


def test_report_of_a_state_dir_of_several_experiments_lists_them(tmp_path, capsys):
    _state_dir_with_a_bisection(tmp_path)
    with StateDir(tmp_path, "other") as state:
        run_id, run_dir = state.new_run_dir("aa")
        state.append(RunKey.of(variant="aa@abc", mask=[], guard="none", steps=10, index=0),
                     {"run_id": run_id, "outcome": "ok", "reason": ""})
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "holds the state of 2 experiment(s)" in err and "demo (3 run(s))" in err
    assert f"bisect-prefetch report {tmp_path / 'demo'}" in err


def test_runs_of_other_commands_are_listed_apart_and_never_counted_as_the_bisections(tmp_path):
    state = _state_dir_with_a_bisection(tmp_path)
    with StateDir(tmp_path, "demo") as opened:  # init's format check, which failed
        run_id, _ = opened.new_run_dir("init")
        opened.append(RunKey.of(variant="init@abc", mask=None, guard="none", steps=3, index=0),
                      {"run_id": run_id, "outcome": "error", "reason": "no metric line"})
    page = build_report(state).read_text()
    mine, others = page.split("<h2>Runs of other commands</h2>")
    assert "0 error" in mine.split("<h2>Timeline")[0] and run_id not in mine.split("<h2>Plots")[0]
    assert "1 error" in others and "init" in others


def test_html_matrix_cells_show_step_time_against_all_on_and_the_first_differing_rank(tmp_path):
    graph = from_policy("fsdp2-chain", 4)
    edges = graph.edge_ids()
    with StateDir(tmp_path, "grid") as state:
        for index, (cell, mask, nudge, ms) in enumerate([("on", edges, 6, 20.0),
                                                         ("half", edges[:3], None, 30.0)]):
            run_id, run_dir = state.new_run_dir(f"matrix:{cell}")
            _write_metrics(run_dir, nudge_from=nudge)
            (run_dir / "graph.json").write_text(json.dumps(graph.to_dict()))
            key = RunKey.of(variant=f"matrix:{cell}@abc", mask=mask, guard="none", steps=10,
                            index=index)
            state.append(key, {"run_id": run_id, "outcome": "ok", "reason": "", "wall_s": 1.0,
                               "first_diff_step": nudge, "reference": "golden",
                               "step_times_ms": [[step, ms] for step in range(3, 11)]})
    (tmp_path / "grid" / "matrix.json").write_text(json.dumps({"matrix": "grid", "cells": [
        {"name": "on", "expect": "diverged", "verdict": "diverged",
         "metrics": {"loss": {"mae": 1e-7, "p95": 1e-7, "max_abs": 1e-7, "first_diff_rank": 1}}},
        {"name": "half", "expect": "consistent", "verdict": "consistent", "metrics": {}}]}))
    page = _TextOf()
    # The matrix section alone: the evidence table below it also shows step times.
    page.feed(build_report(tmp_path / "grid").read_text().split("<h2>Matrix</h2>")[1]
              .split("<h2>")[0])
    text = " ".join(page.text)
    assert "first diff rank" in text and "loss: 1" in text
    assert "1.000x (20.0 ms; 1.00-1.00x)" in text and "1.500x (30.0 ms; 1.50-1.50x)" in text


# -- hostile text from job logs and cell names ------------------------------------
HOSTILE = "evil\x1b[31m<img src=x onerror=alert(1)>\x1b]0;title\x07 & `code`\x00\x0b\r\nrow"


def _hostile_result(result):
    result["cells"][0]["name"] = HOSTILE
    result["cells"][2]["name"] = "bell\x07\x1b[0m"
    result["cells"][2]["group"] = {"run_details": [{"run_id": "0001", "fault": {
        "kind": "gloo-timeout", "rank": 0, "file": "stderr.log", "line_no": 3,
        "line": "\x1b[1;31m</table><script>alert(1)</script>\x1b[0m"}}]}
    return result


def test_markdown_holds_no_raw_html_or_terminal_bytes_from_job_logs(tmp_path, result):
    text = markdown.matrix_markdown(_hostile_result(result))
    assert "<" not in text and ">" not in text.replace("&gt;", "")
    assert not any(ord(c) < 32 and c != "\n" or 0x7f <= ord(c) <= 0x9f for c in text), repr(text)
    rows = parse_markdown_table(text)
    assert len(rows) == 4  # no row split or ended by the name's newline or pipe
    assert rows[0]["cell"].startswith("evil&lt;img")
    assert "&lt;/table&gt;&lt;script&gt;" in text


def test_junit_with_control_characters_in_names_parses(tmp_path, result):
    path = tmp_path / "junit.xml"
    junit.write_junit(_hostile_result(result), path)
    cases = [c.get("name") for c in ET.parse(path).getroot().iter("testcase")]
    assert cases[0].startswith("evil\\x1b[31m<img") and cases[2] == "bell\\x07\\x1b[0m"
