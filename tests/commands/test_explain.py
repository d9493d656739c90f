"""What `explain` says and decides without running a job: the steps it traces by default
(where earlier runs of the experiment first differed, those with the mask's edges on first),
which units it traces, the command `bisect` prints for its answer, the terminal lines of
each kind of comparison (the edge, traces cut short or missing), what tracing cost against
the untraced steps of the same runs, where the tool itself failed inside a run, and the
traced findings bisect takes as hints."""

from __future__ import annotations

import json
from pathlib import Path

from bisect_prefetch.commands.bisect_explain import TracedHints, traced_findings
from bisect_prefetch.commands.common import Given
from bisect_prefetch.commands.explain import explain_command
from bisect_prefetch.commands.explain_cost import overhead
from bisect_prefetch.commands.explain_window import default_window, targeted_units
from bisect_prefetch.commands.explain_words import explanation_lines
from bisect_prefetch.judge.tool_fault import tool_failure
from bisect_prefetch.metrics.op_compare import RankFinding, explain
from bisect_prefetch.report.localization import describe
from bisect_prefetch.search.oracle import Finished, RunResult


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
                              "--steps=5-5", localization=where, describe_localization=describe)
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
    assert "<p>edge: none (not tied to a prefetch)</p>" in page
    # bisect --explain: each cause's first divergence is its explain step's result, said
    # under that step's command in the verdict block (the terminal's words, the report's)
    from bisect_prefetch.report.html import _next_steps

    first = {"step": 5, "rank": 1, "phase": "backward", "module": "layers.4",
             "op": "prefetch-window", "kind": "changed-behind", "edge": "bwd:layers.5->layers.4"}
    data = {"culprit_sets": [{"edges": ["bwd:layers.5->layers.4"]}], "next_steps": [
        {"step": "explain", "cause": 1, "edges": ["bwd:layers.5->layers.4"],
         "command": "bisect-prefetch explain x", "result": {"verdict": "explained",
                                                            "first": first}}]}
    page = _next_steps(data)
    assert ("-&gt; first divergence at step 5, rank 1, backward of layers.4: prefetch-window "
            "(changed-behind: a buffer was written outside the traced ops); edge "
            "bwd:layers.5-&gt;layers.4") in page


def test_a_mask_of_few_edges_traces_only_their_units_and_the_window_follows_those_edges():
    assert targeted_units(frozenset({"bwd:layers.5->layers.4"})) == ["layers.4", "layers.5"]
    assert targeted_units(frozenset({"bwd:a->b", "bwd:b->c"})) == ["a", "b", "c"]
    assert targeted_units(frozenset()) is None  # all-off: nothing to target, every op
    assert targeted_units(frozenset(f"bwd:l{i}->l{i + 1}" for i in range(5))) is None
    records = [{"variant": "search+c@f", "mask": ["bwd:a->b", "bwd:c->d"], "first_diff_step": 6},
               {"variant": "search+c@f", "mask": ["bwd:c->d"], "first_diff_step": 2},
               {"variant": "search+c@f", "mask": ["bwd:a->b"], "first_diff_step": 9}]
    assert default_window(records, 30, frozenset({"bwd:a->b"})) == (
        (6, 9), "where earlier runs with these edges on first differed")
    assert default_window(records, 30, frozenset({"bwd:x->y"}))[0] == (2, 9)


def test_the_finding_is_said_with_its_edge_or_why_it_has_none():
    result = explain([finding(0, "changed-behind", op="c10d._allgather_base_", seq=101,
                              module="layers.1", edge="fwd:layers.1->layers.2",
                              edge_how="issued", read_by={"module": "layers.2",
                                                          "phase": "forward"})],
                     steps_traced=[3])
    lines = explanation_lines(result, first_diff_step=3, mask=["fwd:layers.1->layers.2"])
    assert lines[0] == (
        "first divergence: rank 0, step 3, forward of layers.1: c10d._allgather_base_ issued by "
        "prefetch fwd:layers.1->layers.2 (changed-behind: a buffer was written outside the "
        "traced ops), read by layers.2's forward, 101 ops after the step began")
    assert "  edge: fwd:layers.1->layers.2" in lines
    window = explain([finding(1, "changed-behind", op="prefetch-window", phase="backward",
                              module="layers.4", edge="bwd:layers.5->layers.4",
                              edge_how="window")])
    assert explanation_lines(window, first_diff_step=5)[0].startswith(
        "first divergence: rank 1, step 3, backward of layers.4: the window of prefetch "
        "bwd:layers.5->layers.4, from its issue to layers.4's use (changed-behind")
    none = explanation_lines(explain([finding(0, "origin")]), first_diff_step=3, mask=[])
    assert "  edge: none (no prefetch edge was on (every edge off))" in none


def test_traces_cut_short_or_missing_are_said_with_counts_never_as_outside_the_window():
    cut = RankFinding(rank=1, kind=None, ops_compared=100, traced=[700, 100],
                      coverage={"run": "b", "traced": 100, "expected": 700,
                                "stops_at": [2, 37], "through_step": 5})
    gone = RankFinding(rank=2, kind=None, ops_compared=0, traced=[700, None],
                       coverage={"run": "b", "traced": None, "expected": 700,
                                 "stops_at": None, "through_step": 5})
    result = explain([finding(0, None), cut, gone], steps_traced=[1, 2, 3, 4, 5])
    assert result.verdict == "traces-incomplete"
    lines = explanation_lines(result, first_diff_step=5, pair=["0002-a", "0003-b"],
                              again="bisect-prefetch explain x --steps=5-5")
    text = "\n".join(lines)
    assert "no traced op differs" not in text and "outside the traced steps" not in text
    assert lines[0].startswith("no op differs among those both runs traced (steps traced: 1-5; "
                               "the runs first differ at step 5), but not every rank's")
    assert ("rank 1: 0003-b traced 100 of ~700 ops through step 5 (its trace stops at step 2, "
            "op 37): the 100 both traced agree; what came after was not compared") in lines
    assert ("rank 2: 0003-b has no op trace (~700 ops in 0002-a): this rank was not "
            "compared") in lines
    assert lines[-1] == "trace that step: bisect-prefetch explain x --steps=5-5"


def _probe(run_dir, rank, seconds, trace=None):
    run_dir.mkdir(parents=True, exist_ok=True)
    probe = {"step_seconds": [[k + 1, s] for k, s in enumerate(seconds)]}
    if trace is not None:
        probe["op_trace"] = trace
    (run_dir / f"probe.rank{rank}.json").write_text(json.dumps(probe))


def test_the_cost_is_the_traced_steps_against_the_untraced_steps_of_the_same_runs(tmp_path):
    from types import SimpleNamespace

    trace = {"steps": [3, 5], "ops": 300, "bytes": 3000, "flush_s": 0.03, "units": ["a", "b"]}
    # Steps 1-2 warm up; 3-5 traced (0.3 s); 6 writes the last records; 7-8 untraced (0.1 s).
    _probe(tmp_path / "r1", 0, [5.0, 1.0, 0.3, 0.3, 0.3, 0.9, 0.1, 0.1], trace)
    _probe(tmp_path / "r1", 1, [5.0, 1.0, 0.3, 0.31, 0.3, 0.9, 0.1, 0.1], trace)
    group = SimpleNamespace(runs=[SimpleNamespace(run_id="r1")])
    cost = overhead(group, lambda run_id: tmp_path / run_id, (3, 5))
    assert (cost["step_time_ms"], cost["untraced_step_time_ms"], cost["ratio"]) == (
        300.0, 100.0, 3.0)
    assert (cost["traced_steps_timed"], cost["untraced_steps_timed"]) == (3, 2)
    assert cost["ops_per_step"] == 100.0 and cost["units"] == ["a", "b"]
    _probe(tmp_path / "r2", 0, [5.0, 1.0, 0.3, 0.3, 0.3], trace)  # no untraced step: no ratio
    group = SimpleNamespace(runs=[SimpleNamespace(run_id="r2")])
    assert overhead(group, lambda run_id: tmp_path / run_id, (3, 5))["ratio"] is None


def test_where_the_tool_failed_inside_a_run_its_rank_and_log_are_named(tmp_path):
    run = tmp_path / "run"
    _probe(run, 0, [1.0], {"steps": [1, 2], "ops": 1, "bytes": 1, "flush_s": 0.0})
    _probe(run, 1, [1.0], {"steps": [1, 2], "ops": 1, "bytes": 1, "flush_s": 0.0,
                           "failed": "step 1, op 5, in flush: OSError(27, 'File too large')"})
    (run / "stderr.log").write_text("[rank1]: bisect-prefetch: op trace stopped, the job runs "
                                    "on untraced: the tracer failed at step 1\n")
    found = tool_failure(run)
    assert found == {"rank": 1, "what": "the op tracer failed at step 1, op 5, in flush: "
                                        "OSError(27, 'File too large')",
                     "log": f"{run / 'stderr.log'}:1"}
    # A traceback whose innermost frame is the in-job code's is the tool's too ...
    crash = tmp_path / "crash"
    crash.mkdir()
    (crash / "stderr.log").write_text(
        "[rank0]: Traceback (most recent call last):\n"
        '[rank0]:   File "/u/train.py", line 9, in <module>\n'
        '[rank0]:   File "/s/runs/0002/adapter/bisect_prefetch/adapters/op_trace.py", line 77,'
        " in _key\n"
        "[rank0]:     storage = t.untyped_storage().data_ptr()\n"
        "[rank0]: RuntimeError: Attempted to access the data pointer on an invalid python "
        "storage.\n")
    assert tool_failure(crash) == {
        "rank": 0, "what": "RuntimeError: Attempted to access the data pointer on an invalid "
                           "python storage.", "log": f"{crash / 'stderr.log'}:5"}
    # ... and the job's own error is not.
    (crash / "stderr.log").write_text(
        "Traceback (most recent call last):\n  File \"/u/train.py\", line 9, in <module>\n"
        "ValueError: bad config\n")
    assert tool_failure(crash) is None


def test_a_traced_finding_is_the_hint_of_a_diverged_run_its_digests_could_not_localize(
        tmp_path):
    (tmp_path / "explain.json").write_text(json.dumps({
        "mask": ["bwd:layers.5->layers.4"], "first": {"unit": "layers.5",
                                                      "edge": "bwd:layers.5->layers.4"}}))
    findings = traced_findings(tmp_path)
    assert findings == [(frozenset({"bwd:layers.5->layers.4"}), "layers.4")]  # the target

    class Oracle:
        slots = 1

        def __init__(self, result):
            self.result = result

        def finished(self):
            return Finished(planned=frozenset({"bwd:layers.5->layers.4", "bwd:a->b"}),
                            result=self.result)

    unlocalized = RunResult(outcome="stopped-early", diverged=True, first_diff_step=3, steps=3)
    hinted = TracedHints(Oracle(unlocalized), findings)
    assert hinted.finished().result.unit == "layers.4" and hinted.slots == 1
    localized = RunResult(outcome="stopped-early", diverged=True, first_diff_step=3, steps=3,
                          unit="layers.7")
    assert TracedHints(Oracle(localized), findings).finished().result.unit == "layers.7"
    assert TracedHints(Oracle(unlocalized), [(frozenset({"bwd:x->y"}), "y")]
                       ).finished().result.unit is None  # that edge was off in the run


def test_each_cause_s_first_divergence_is_its_explain_step_s_result_in_the_verdict_block():
    from bisect_prefetch.report.verdict_block import explain_result_words, step_lines

    first = {"step": 5, "rank": 1, "phase": "backward", "module": "layers.4",
             "op": "prefetch-window", "kind": "changed-behind", "edge": "bwd:layers.5->layers.4"}
    assert explain_result_words({"verdict": "explained", "first": first}) == (
        "first divergence at step 5, rank 1, backward of layers.4: prefetch-window "
        "(changed-behind: a buffer was written outside the traced ops); edge "
        "bwd:layers.5->layers.4")
    assert explain_result_words({"error": "no verdict: ..."}) == "not explained: no verdict: ..."
    assert explain_result_words({"verdict": "consistent", "first": None}) == (
        "consistent: no first differing op")
    untied = first | {"edge": None, "edge_note": "no prefetch edge was on (every edge off)"}
    assert explain_result_words({"verdict": "explained", "first": untied}).endswith(
        "; no edge (no prefetch edge was on (every edge off))")
    assert explain_result_words(None) is None  # not run: the step is a command only
    data = {"culprit_sets": [{"edges": ["bwd:a->b"]}, {"edges": ["bwd:c->d"]}], "next_steps": [
        {"step": "explain", "cause": 1, "edges": ["bwd:a->b"], "command": "e1",
         "result": {"error": "boom"}},
        {"step": "explain", "cause": 2, "edges": ["bwd:c->d"], "command": "e2"}]}
    assert step_lines(data) == [
        ("explain cause 1: the first op that differs", "e1", "not explained: boom"),
        ("explain cause 2: the first op that differs", "e2", None)]


def test_bisect_explain_traces_each_explain_step_and_a_finding_hints_later_searches(tmp_path):
    """bisect.json's explain steps, with what bisect --explain found, are findings a later
    search of the experiment takes as hints."""
    (tmp_path / "bisect.json").write_text(json.dumps({"next_steps": [
        {"step": "reproduce", "cause": 1, "edges": ["bwd:a->b"], "command": "r"},
        {"step": "explain", "cause": 1, "edges": ["bwd:a->b"], "command": "e",
         "result": {"verdict": "explained", "first": {"unit": "a", "edge": None}}},
        {"step": "explain", "cause": 2, "edges": ["bwd:c->d"], "command": "e2",
         "result": {"error": "no verdict"}}]}))
    assert traced_findings(tmp_path) == [(frozenset({"bwd:a->b"}), "a")]


def test_a_traced_run_that_was_killed_is_said_with_its_rank_s_log(tmp_path):
    from types import SimpleNamespace

    from bisect_prefetch.commands.explain import _log_of_failed

    killed = SimpleNamespace(run_id="0003-explain-k1", usable=False, fault={
        "kind": "signal", "rank": 1, "file": "stderr.log", "line_no": 237,
        "line": "exitcode : -9 (pid: 8696) (SIGKILL)"})
    fine = SimpleNamespace(run_id="0002-explain-k0", usable=True, fault=None)
    opened = SimpleNamespace(state=SimpleNamespace(run_dir=lambda run_id: tmp_path / run_id))
    group = SimpleNamespace(runs=[fine, killed])
    assert _log_of_failed(opened, group) == (
        f"; rank 1's log: {tmp_path / '0003-explain-k1' / 'stderr.log'}:237")
    killed.fault = None  # no log line names it: the run's logs
    assert _log_of_failed(opened, group) == f"; its logs: {tmp_path / '0003-explain-k1'}"
