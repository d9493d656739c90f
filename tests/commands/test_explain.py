"""What `explain` says and decides without running a job: the steps it traces by default
(where earlier runs of the experiment first differed), the command `bisect` prints for its
answer, and the terminal lines of each kind of comparison."""

from __future__ import annotations

from pathlib import Path

from bisect_prefetch.commands.common import Given
from bisect_prefetch.commands.explain import default_window, explain_command, explanation_lines
from bisect_prefetch.metrics.op_compare import RankFinding, explain


def test_by_default_it_traces_where_earlier_runs_first_differed():
    records = [{"variant": "aa+c@f", "first_diff_step": 7}, {"variant": "search+c@f",
               "first_diff_step": 4}, {"variant": "aa+c@f", "first_diff_step": None},
               {"variant": "explain+c@g", "first_diff_step": 2},  # its own: a resume keeps it
               {"variant": "aa+c@f", "first_diff_step": 99}]  # past the experiment's steps
    assert default_window(records, 30) == ((4, 7), "where earlier runs of this experiment "
                                                   "first differed")
    assert default_window([], 30) == ((1, 30), "every step: no earlier run of this "
                                               "experiment differed")


def test_bisect_s_answer_has_an_explain_command_with_the_options_explain_takes():
    given = Given("bisect", Path("exp.yaml"), {
        "state_dir": Path("s"), "confidence": 0.9, "segments": "off", "stress": "on",
        "reuse": True, "json": Path("b.json"), "resume": True})
    assert explain_command(given, "culprit-found", ["bwd:a->b", "fwd:c->d"]) == (
        "bisect-prefetch explain exp.yaml '--mask=keep-only:bwd:a->b,fwd:c->d' --stress=on "
        "--state-dir=s")
    assert explain_command(given, "not-prefetch", [], stress="off") == (
        "bisect-prefetch explain exp.yaml --mask=all-off --stress=off --state-dir=s")
    assert explain_command(given, "no-drift-reproduced", []) is None


def finding(rank: int, kind: str | None, **extra) -> RankFinding:
    base = {"step": 3, "seq": 41, "phase": "forward", "module": "layers.2", "op": "aten.mm",
            "stack": "train.py:9", "detail": "why"}
    return RankFinding(rank=rank, kind=kind, ops_compared=41,
                       **(base | extra if kind is not None else {}))


def test_the_lines_name_the_op_the_kind_and_every_rank():
    result = explain([finding(0, "origin"), finding(1, "origin"),
                      finding(2, "receiver", op="c10d._allgather_base_", seq=60),
                      finding(3, None)], steps_traced=[3])
    assert explanation_lines(result, first_diff_step=3) == [
        "first divergence: rank 0, step 3, forward of layers.2: aten.mm (origin: inputs "
        "matched, output differed), 41 ops after the step began",
        "  at train.py:9",
        "rank 1: the same op",
        "rank 2, step 3, forward of layers.2: c10d._allgather_base_ (receiver), 60 ops after the "
        "step began",
        "rank 3: every one of its 41 ops compared agrees"]


def test_broken_alignment_says_where_and_what_each_run_ran():
    result = explain([finding(0, "alignment", op="aten.relu", other_op="aten.tanh")])
    assert result.verdict == "alignment-broken"
    assert explanation_lines(result, first_diff_step=3)[0] == (
        "alignment broke: rank 0, step 3, forward of layers.2, 41 ops after the step began: "
        "aten.relu in one run, aten.tanh in the other (the runs' control flow differs before "
        "any fingerprint did)")


def test_no_op_differing_falls_back_on_the_digests_and_says_how_to_trace_that_step():
    result = explain([finding(0, None), finding(1, None)], steps_traced=[1, 2])
    where = {"step": 5, "rank": 1, "unit": "layers.4", "param": "layers.4.w@value",
             "units_differing": 1, "rule": "values"}
    lines = explanation_lines(result, first_diff_step=5, again="bisect-prefetch explain x "
                              "--steps=5-5", localization=where)
    assert lines[0].startswith("no traced op differs (steps traced: 1-2; the runs first differ "
                               "at step 5)")
    assert lines[1] == ("first differing tensor, from the digests: parameter values first "
                        "differ at step 5 in layers.4 (rank 1, layers.4.w@value; 1 unit "
                        "differs at that step)")
    assert lines[2] == "trace that step: bisect-prefetch explain x --steps=5-5"


def test_the_report_shows_the_first_differing_op_among_its_neighbours(tmp_path):
    from bisect_prefetch.metrics.op_compare import compare_traces, neighbours
    from bisect_prefetch.report.html import render_html
    from tests.metrics.test_op_compare import A, B, D, op, write

    ops = [op(1, k, "aten.mm", ins=[A], outs=[A]) for k in range(6)]
    write(tmp_path / "a", 0, ops[:4] + [op(1, 4, "aten.randn", outs=[B])] + ops[5:])
    write(tmp_path / "b", 0, ops[:4] + [op(1, 4, "aten.randn", outs=[D])] + ops[5:])
    result = compare_traces(tmp_path / "a", tmp_path / "b")
    near = neighbours(tmp_path / "a", tmp_path / "b", result.first, around=2)
    assert [(n["seq"], n["op"], n["differs"], n["first"]) for n in near] == [
        (2, "aten.mm", "", False), (3, "aten.mm", "", False), (4, "aten.randn", "outputs", True),
        (5, "aten.mm", "", False)]
    page = render_html(title="t", verdict="v", facts=[], graph_png=None, culprits=[],
                       evidence=([], []), matrix=None, figures=[], reproduce=[],
                       explain=result.to_json() | {"neighbours": near})
    assert "<h2>First differing op</h2>" in page and "<code>aten.randn</code> (origin)" in page
