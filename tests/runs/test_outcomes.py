"""Run outcomes: ok, error, timeout, stopped-early, truncated; only ok and stopped-early
enter a verdict.

Small real jobs that crash once, stall after a few steps, or hang under a
mask; the report counts every kind.
"""

from __future__ import annotations

import json
from pathlib import Path

from bisect_prefetch.cli import main
from bisect_prefetch.drivers.group import run_group
from bisect_prefetch.drivers.oracle import RealOracle
from bisect_prefetch.experiment import load_experiment
from bisect_prefetch.report.html import build_report, outcome_counts_text
from bisect_prefetch.runs.execute import Runner
from bisect_prefetch.runs.store import StateDir
from tests.conftest import NAME, fake_job_experiment, job_processes, oracle_run, script_experiment

JOB = """
import json, os, sys, time
mode = sys.argv[1]
plan = json.load(open(os.environ["BISECT_PREFETCH_PLAN"]))
if mode == "crash-first":
    marker = sys.argv[2]
    if not os.path.exists(marker):
        open(marker, "w").close()
        sys.exit(7)
if mode == "hang-when-masked" and plan["mask"]:
    time.sleep(600)
# truncate: every run stops at step 12 and exits 0; truncate-second: the second run
# (marker file) stops at step 12 and exits 1.
stop_at = None
if mode == "truncate":
    stop_at = 12
if mode in ("truncate-second", "stall-second"):
    marker = sys.argv[2]
    stop_at = 12 if os.path.exists(marker) and not os.path.exists(marker + ".2") else None
    open(marker + (".2" if os.path.exists(marker) else ""), "w").close()
with open(os.path.join(plan["out_dir"], "metrics.jsonl"), "a") as f:
    for step in range(1, plan["steps"] + 1):
        f.write(json.dumps({"step": step, "rank": 0, "loss": 1.0 / step}) + "\\n")
        f.flush()
        if (mode == "stall" or mode == "stall-second" and stop_at) and step == 2:
            time.sleep(600)
        if step == stop_at:
            print(f"stopping after step {step}", flush=True)
            sys.exit(0 if mode == "truncate" else 1)
"""


def _aa(tmp_path: Path, experiment: Path, *args: str, mask: str = "all-on") -> tuple[int, dict]:
    """all-on by default: JOB writes metrics only, and a mask that switches an edge off needs
    a job that applies it (judge/merge.mask_not_applied; fake_job's probe says it does)."""
    out = tmp_path / "aa.json"
    code = main(["aa", str(experiment), "--state-dir", str(tmp_path / "state"), "--mask",
                 mask, "--json", str(out), *args])
    return code, json.loads(out.read_text())


def test_a_failed_run_is_left_out_of_the_verdict_and_said(tmp_path, capsys):
    experiment = script_experiment(tmp_path, JOB, "crash-first", str(tmp_path / "crashed"))
    code, result = _aa(tmp_path, experiment, "--runs", "3")
    assert code == 0
    assert result["verdict"] == "consistent"
    assert result["outcomes"] == {"ok": 2, "error": 1, "timeout": 0, "stopped-early": 0,
                                  "truncated": 0}
    assert result["run_details"][0]["reason"] == "exit code 7"
    assert result["metrics"]["loss"]["pair"] == [d["run_id"] for d in result["run_details"][1:]]
    out = capsys.readouterr().out
    assert ("-> consistent (2 runs, bitwise identical (metrics at full precision) over 8 steps; "
            "1 failed run(s) not counted)") \
        in out


def test_a_run_that_stops_making_progress_times_out(tmp_path):
    experiment = script_experiment(tmp_path, JOB, "stall", extra="no_progress_timeout_s: 1\n")
    code, result = _aa(tmp_path, experiment)
    assert code == 2
    assert result["verdict"] == "error"
    assert result["outcomes"]["timeout"] == 2
    assert {d["reason"] for d in result["run_details"]} == {"no progress for 1s"}
    assert job_processes(str(tmp_path / "state")) == []


def test_an_always_crashing_job_never_gives_a_clean_verdict(tmp_path, capsys):
    code, result = _aa(tmp_path, fake_job_experiment(tmp_path, "crash"), "--runs", "3")
    assert code == 2
    assert result["verdict"] == "error" and result["first_diff_step"] is None
    assert result["outcomes"] == {"ok": 0, "error": 3, "timeout": 0, "stopped-early": 0,
                                  "truncated": 0}
    assert "-> consistent" not in capsys.readouterr().out


def test_oracle_trial_that_times_out_is_retried_then_unresolved(tmp_path):
    experiment = load_experiment(script_experiment(tmp_path, JOB, "hang-when-masked",
                                                   timeout_s=1, steps=4))
    with StateDir(tmp_path / "state", NAME) as state:
        oracle = RealOracle(Runner(experiment, state).open(), steps=4, guard="none", max_retries=1)
        result = oracle_run(oracle, frozenset({"fwd:layers.0->layers.1"}))
        # The all-off golden run finished; the trial timed out twice and says nothing of drift.
        assert (result.outcome, result.diverged, result.completed) == ("timeout", None, False)
        assert oracle.runs_launched == 1 + 2
        records = state.records()
    assert [r["outcome"] for r in records] == ["ok", "timeout", "timeout"]
    assert [r["attempt"] for r in records[1:]] == [0, 1]
    assert job_processes(str(tmp_path / "state")) == []


def test_report_counts_every_outcome_kind(tmp_path):
    state_root = tmp_path / "state"
    kwargs = {"mask": frozenset(), "steps": 40, "guard": "none"}
    with StateDir(state_root, NAME) as state:
        crash = load_experiment(fake_job_experiment(tmp_path, "crash", file_name="crash.yaml"))
        run_group(Runner(crash, state).open(), runs=2, **kwargs)
        drifting = load_experiment(fake_job_experiment(tmp_path, steps=40))
        # All edges on: the second run drifts from its reference and is stopped early.
        on = {"mask": frozenset({"bwd:layers.1->layers.0"}), "steps": 40, "guard": "none"}
        group = run_group(Runner(drifting, state).open(), runs=2, **on)
        assert [r.outcome for r in group.runs] == ["ok", "stopped-early"]
        records = state.records()
    counts = "run outcomes: 1 ok, 2 error, 0 timeout, 1 stopped-early, 0 truncated"
    assert outcome_counts_text(records) == counts
    page = build_report(state_root / NAME).read_text()
    assert f"<li>{counts}</li>" in page


def test_outcomes_unknown_to_this_version_are_still_counted():
    records = [{"outcome": "ok"}, {"outcome": "preempted"}, {}]
    assert outcome_counts_text(records) == (
        "run outcomes: 1 ok, 0 error, 0 timeout, 0 stopped-early, 0 truncated, 1 preempted, "
        "1 None")


def test_a_run_that_discovered_another_graph_is_reported_as_graph_drift(tmp_path, capsys):
    experiment = fake_job_experiment(tmp_path)
    code, first = _aa(tmp_path, experiment, mask="all-off")  # all-on: fake_job drifts
    assert code == 0 and first["graph_drift"] == []
    a, b = (d["run_id"] for d in first["run_details"])
    graph_path = tmp_path / "state" / NAME / "runs" / b / "graph.json"
    graph = json.loads(graph_path.read_text())
    graph["nodes"] = graph["nodes"][:1]
    graph_path.write_text(json.dumps(graph))
    capsys.readouterr()
    code, again = _aa(tmp_path, experiment, "--reuse", mask="all-off")  # the same runs, from the journal
    assert again["graph_drift"] == [f"run {b} discovered a different prefetch graph than run {a}"]
    assert f"graph drift: run {b} discovered a different prefetch graph than run {a}" \
        in capsys.readouterr().out


def test_a_job_that_exits_0_after_12_of_20_steps_is_truncated_never_consistent(tmp_path, capsys):
    experiment = script_experiment(tmp_path, JOB, "truncate", steps=20)
    code, result = _aa(tmp_path, experiment)
    assert code != 0
    assert result["verdict"] != "consistent"
    assert result["outcomes"]["truncated"] == 2 and result["outcomes"]["ok"] == 0
    assert [(d["outcome"], d["steps_done"], d["exit_code"]) for d in result["run_details"]] \
        == [("truncated", 12, 0)] * 2
    assert {d["reason"] for d in result["run_details"]} == {"stopped at step 12 of 20"}
    out = capsys.readouterr().out
    assert "-> consistent" not in out
    assert "truncated (stopped at step 12 of 20)" in out


def test_one_truncated_run_keeps_agreeing_runs_from_a_consistent_verdict(tmp_path, capsys):
    experiment = script_experiment(tmp_path, JOB, "truncate-second", str(tmp_path / "ran"),
                                   steps=20)
    code, result = _aa(tmp_path, experiment, "--runs", "3")
    assert code == 2
    assert result["verdict"] == "error"
    assert result["outcomes"]["ok"] == 2 and result["outcomes"]["truncated"] == 1
    truncated = result["run_details"][1]
    assert (truncated["outcome"], truncated["steps_done"]) == ("truncated", 12)
    assert truncated["reason"] == "stopped at step 12 of 20, exit code 1"
    assert result["reason"].startswith("1 run(s) stopped short of the 20 steps asked (")
    assert "truncated, stopped at step 12 of 20, exit code 1" in result["reason"]
    verdict = [line for line in capsys.readouterr().out.splitlines() if line.startswith("->")]
    assert verdict == [f"-> error: {result['reason']}"]


def test_the_search_retries_a_truncated_run_and_never_counts_it(tmp_path):
    experiment = load_experiment(script_experiment(tmp_path, JOB, "truncate", steps=20))
    with StateDir(tmp_path / "state", NAME) as state:
        runner = Runner(experiment, state).open()
        key = runner.key("search", mask=frozenset(), guard="none", steps=20, index=0)
        out = runner.run(key, label="t")
        assert (out.outcome, out.usable) == ("truncated", False)
        result = out.result()
        assert (result.outcome, result.completed, result.diverged) == ("truncated", False, None)


def test_a_run_that_hung_part_way_keeps_agreeing_runs_from_a_consistent_verdict(tmp_path):
    experiment = script_experiment(tmp_path, JOB, "stall-second", str(tmp_path / "ran"),
                                   steps=20, extra="no_progress_timeout_s: 1\n")
    code, result = _aa(tmp_path, experiment, "--runs", "3")
    assert code == 2 and result["verdict"] == "error"
    assert result["outcomes"]["ok"] == 2 and result["outcomes"]["timeout"] == 1
    hung = result["run_details"][1]
    assert (hung["outcome"], hung["steps_done"], hung["fault"]) == ("timeout", 2, None)
    assert result["reason"].startswith("1 run(s) stopped short of the 20 steps asked (")
    assert job_processes(str(tmp_path / "state")) == []
