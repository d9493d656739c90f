"""Bad input through the real CLI: one line on stderr, exit code 2, nothing written or lost.

Each case runs against a state dir that already holds finished runs, and
checks that the state (journal, run dirs, their files) is byte for byte what
it was. NaN and infinite metrics are values, not errors: they are compared.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bisect_prefetch.cli import main
from bisect_prefetch.workloads import mindformers
from tests.conftest import (
    NAME,
    fake_job_experiment,
    script_experiment,
    snapshot,
    write_experiment,
)


@pytest.fixture(scope="module")
def finished_state(tmp_path_factory) -> Path:
    """A state dir with one finished A/A group of two clean runs (made once, copied per test)."""
    root = tmp_path_factory.mktemp("finished")
    experiment = fake_job_experiment(root)
    assert main(["aa", str(experiment), "--state-dir", str(root / "state"), "--mask",
                 "all-off"]) == 0
    return root / "state"


@pytest.fixture
def state(tmp_path, finished_state) -> Path:
    copy = tmp_path / "state"
    shutil.copytree(finished_state, copy)
    return copy


def _one_line_error(capsys, args: list[str]) -> str:
    """Run the CLI; it must fail with exit code 2 and exactly one `error:` line, no traceback."""
    code = main(args)
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert "Traceback" not in out + err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    return lines[0]


def _aa_fails_leaving_state(capsys, experiment: Path, state: Path, *args: str) -> str:
    before = snapshot(state)
    assert len(list((state / NAME / "runs").iterdir())) == 2
    message = _one_line_error(capsys, ["aa", str(experiment), "--state-dir", str(state), *args])
    assert snapshot(state) == before
    return message


# -- experiment files ---------------------------------------------------------
def test_malformed_yaml(tmp_path, capsys, state):
    experiment = tmp_path / "bad.yaml"
    experiment.write_text(f"name: {NAME}\ncommand: [python, job.py\nsteps: 3\n")
    message = _aa_fails_leaving_state(capsys, experiment, state)
    assert "malformed YAML (line " in message


def test_unknown_key(tmp_path, capsys, state):
    experiment = fake_job_experiment(tmp_path, extra="colour: red\n")
    message = _aa_fails_leaving_state(capsys, experiment, state)
    assert "unknown key 'colour' (allowed: name, " in message


def test_wrong_type(tmp_path, capsys, state):
    experiment = fake_job_experiment(tmp_path, extra="seed: many\n")
    message = _aa_fails_leaving_state(capsys, experiment, state)
    assert "seed:" in message and "'many'" in message


def test_malformed_matrix(tmp_path, capsys):
    matrix = tmp_path / "m.yaml"
    matrix.write_text("experiment: exp.yaml\ncells: [{name: a, runs: 2\n")
    message = _one_line_error(capsys, ["matrix", str(matrix), "--state-dir",
                                       str(tmp_path / "state")])
    assert "malformed YAML" in message
    assert not (tmp_path / "state").exists()


# -- selectors ----------------------------------------------------------------
def test_selector_that_matches_nothing(tmp_path, capsys, state):
    experiment = fake_job_experiment(tmp_path)
    message = _aa_fails_leaving_state(capsys, experiment, state, "--mask", "bwd:nope*")
    assert "selector 'bwd:nope*' matches no edge" in message


def test_preset_selector_that_matches_nothing(capsys):
    message = _one_line_error(capsys, ["masks", "--policy", "fsdp2-chain", "--layers", "2",
                                       "--preset", "keep-only:fwd:layers.9->layers.8"])
    assert "matches no edge; nearest:" in message


# -- commands and places ------------------------------------------------------
def test_command_that_does_not_exist(tmp_path, capsys, state):
    experiment = write_experiment(tmp_path, ["no-such-trainer-xyz", "--steps", "{steps}"])
    message = _aa_fails_leaving_state(capsys, experiment, state)
    assert message == "error: command not found: no-such-trainer-xyz (not on PATH)"


def test_state_dir_that_cannot_be_written(tmp_path, capsys):
    in_the_way = tmp_path / "a-file"
    in_the_way.write_text("keep me\n")
    experiment = fake_job_experiment(tmp_path)
    message = _one_line_error(capsys, ["aa", str(experiment), "--state-dir",
                                       str(in_the_way / "state")])
    assert message.startswith(f"error: cannot use state dir {in_the_way / 'state' / NAME}: ")
    assert in_the_way.read_text() == "keep me\n"


def test_run_dir_that_cannot_be_made(tmp_path, capsys, state):
    # A file where the run dirs go: runs cannot start, and the journal is untouched.
    shutil.rmtree(state / NAME / "runs")
    (state / NAME / "runs").write_text("")
    before = snapshot(state)
    experiment = fake_job_experiment(tmp_path)
    message = _one_line_error(capsys, ["aa", str(experiment), "--state-dir", str(state),
                                       "--mask", "all-on"])
    assert message.startswith(f"error: cannot create run dir {state / NAME / 'runs'}")
    assert snapshot(state) == before


def test_output_file_that_cannot_be_written(tmp_path, capsys):
    in_the_way = tmp_path / "a-file"
    in_the_way.write_text("")
    message = _one_line_error(capsys, ["graph", "--policy", "fsdp2-chain", "--layers", "2",
                                       "--out", str(in_the_way / "graph.txt")])
    assert message.startswith(f"error: cannot write {in_the_way / 'graph.txt'}: ")
    assert list(tmp_path.iterdir()) == [in_the_way]


@pytest.mark.parametrize("command", ["aa", "report"])
def test_no_output_lands_on_a_runs_files(tmp_path, capsys, state, command):
    """`--json` onto a finished run's stdout.log, `--html` onto a run's plan.json: refused
    before anything runs, naming the run dir; the run's files stay as they were."""
    run_dir = sorted((state / NAME / "runs").iterdir())[0]
    target = run_dir / ("stdout.log" if command == "aa" else "plan.json")
    if command == "aa":
        args = ["aa", str(fake_job_experiment(tmp_path)), "--state-dir", str(state),
                "--json", str(target)]
    else:
        args = ["report", str(state / NAME), "--html", str(target)]
    before = snapshot(state)
    message = _one_line_error(capsys, args)
    assert message == (f"error: refusing to write {target}: it is inside run dir {run_dir}, "
                       "whose files are a run's evidence (write outputs elsewhere)")
    assert snapshot(state) == before


# -- the journal ----------------------------------------------------------------
def test_corrupt_journal_line_is_an_error_and_kept(tmp_path, capsys, state):
    journal = state / NAME / "journal.jsonl"
    first, second = journal.read_text().splitlines()
    journal.write_text(f"{first}\nnot json at all\n{second}\n")
    message = _aa_fails_leaving_state(capsys, fake_job_experiment(tmp_path), state,
                                      "--mask", "all-off")
    assert "line 2 is corrupt" in message and "move the file away" in message


def test_torn_last_journal_line_is_reported_not_fatal(tmp_path, capsys, state):
    journal = state / NAME / "journal.jsonl"
    whole = journal.read_text()
    journal.write_text(whole + '{"v": 1, "outcome": "o')  # a kill in the middle of a write
    code = main(["aa", str(fake_job_experiment(tmp_path)), "--state-dir", str(state),
                 "--mask", "all-off", "--reuse"])
    out = capsys.readouterr().out
    assert code == 0
    assert "note: the journal's last line was torn by a kill and was dropped" in out
    assert "reused from the journal" in out
    assert journal.read_text() == whole  # the torn piece cut off, nothing else changed


# -- metrics ----------------------------------------------------------------------
PRINTS_GARBAGE = """
import sys
for step in range(1, 4):
    print(f"iteration {step}: all good, probably", flush=True)
"""


def test_metrics_format_that_matches_no_line(tmp_path, capsys, state):
    # The job runs and prints, but no line is a megatron metrics line: no verdict, not "ok".
    experiment = script_experiment(tmp_path, PRINTS_GARBAGE, metrics_format="megatron")
    journal = state / NAME / "journal.jsonl"
    before = journal.read_text()
    result_path = tmp_path / "aa.json"
    message = _one_line_error(capsys, ["aa", str(experiment), "--state-dir", str(state),
                                       "--mask", "all-off", "--json", str(result_path)])
    assert message.startswith("error: no verdict: only 0 usable run(s) of 2")
    assert "missing metrics: no metrics found" in message
    result = json.loads(result_path.read_text())
    assert result["verdict"] == "error"
    assert result["outcomes"] == {"ok": 0, "error": 2, "timeout": 0, "stopped-early": 0,
                                  "truncated": 0}
    # The finished runs before are all still there, the failed ones journaled after them.
    assert journal.read_text().startswith(before)


def test_compare_with_a_format_that_matches_no_line(tmp_path, capsys):
    log = tmp_path / "run.jsonl"
    log.write_text('{"step": 1, "loss": 1.0}\n')
    message = _one_line_error(capsys, ["compare", str(log), str(log), "--format", "mindformers"])
    assert "no metrics found in" in message and "format mindformers" in message


@pytest.mark.parametrize("text", ["", '{"step": 1, "lo'], ids=["empty", "truncated-to-nothing"])
def test_compare_with_an_empty_or_truncated_log(tmp_path, capsys, text):
    bad, good = tmp_path / "bad.jsonl", tmp_path / "good.jsonl"
    bad.write_text(text)
    good.write_text('{"step": 1, "loss": 1.0}\n')
    json_out = tmp_path / "out.json"
    message = _one_line_error(capsys, ["compare", str(bad), str(good), "--json", str(json_out)])
    assert "cannot tell the metrics format of" in message
    assert not json_out.exists()


def test_compare_with_a_log_cut_mid_line_says_what_it_left_out(tmp_path, capsys):
    full = "".join(json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in range(1, 5))
    whole, cut = tmp_path / "whole.jsonl", tmp_path / "cut.jsonl"
    whole.write_text(full)
    cut.write_text(full[: full.index('{"step": 4') + 9])
    json_out = tmp_path / "out.json"
    # The common steps agree, but a log that stops mid-line is never a clean "consistent".
    assert main(["compare", str(cut), str(whole), "--json", str(json_out)]) == 1
    out = capsys.readouterr().out
    assert f"truncated: A's log stops mid-line: {cut} line 4: " in out
    assert "A stops before B: last common step 3, A's last step 3, B's last step 4" in out
    result = json.loads(json_out.read_text())
    assert result["lines_unread"] == {"a": 1, "b": 0}
    assert result["metrics"]["loss"]["missing_in_a"] == 1
    assert result["truncated"]["last_common_step"] == 3
    assert main(["compare", str(cut), str(whole), "--allow-truncated"]) == 0


NON_FINITE = ['{"step": 1, "loss": NaN}', '{"step": 2, "loss": Infinity}',
              '{"step": 3, "loss": -Infinity}']


def test_nan_and_inf_metrics_are_values(tmp_path, capsys):
    a, b, c = (tmp_path / f"{n}.jsonl" for n in "abc")
    a.write_text("\n".join(NON_FINITE) + "\n")
    b.write_text("\n".join(NON_FINITE) + "\n")
    c.write_text("\n".join([NON_FINITE[0], '{"step": 2, "loss": 1.0}', NON_FINITE[2]]) + "\n")
    assert main(["compare", str(a), str(b)]) == 0  # NaN equals NaN, inf equals inf
    json_out = tmp_path / "out.json"
    assert main(["compare", str(a), str(c), "--json", str(json_out)]) == 1
    assert "Traceback" not in "".join(capsys.readouterr())
    stats = json.loads(json_out.read_text())["metrics"]["loss"]
    assert stats["first_diff_step"] == 2
    assert stats["steps_differing"] == 1 and stats["max_abs"] == float("inf")


WRITES_NON_FINITE = """
import json, os
plan = json.load(open(os.environ["BISECT_PREFETCH_PLAN"]))
with open(os.path.join(plan["out_dir"], "metrics.jsonl"), "w") as f:
    for step, loss in enumerate([float("nan"), float("inf"), 0.5, float("-inf")], start=1):
        f.write(json.dumps({"step": step, "rank": 0, "loss": loss}) + "\\n")
"""


def test_runs_with_nan_and_inf_metrics_are_compared_not_crashed(tmp_path, capsys):
    experiment = script_experiment(tmp_path, WRITES_NON_FINITE, steps=4)
    result_path = tmp_path / "aa.json"
    code = main(["aa", str(experiment), "--state-dir", str(tmp_path / "state"),
                 "--mask", "all-on", "--json", str(result_path)])  # metrics only: no gate
    assert code == 0, capsys.readouterr()
    result = json.loads(result_path.read_text())
    assert result["verdict"] == "consistent"
    assert result["metrics"]["loss"]["steps_compared"] == 4


def test_cli_errors_never_print_tracebacks_for_missing_files(tmp_path, capsys):
    missing = tmp_path / "nope.yaml"
    for args in (["aa", str(missing)], ["matrix", str(missing)], ["audit", str(missing)],
                 ["graph", str(missing)], ["compare", str(missing), str(missing)],
                 ["report", str(tmp_path / "no-state")]):
        message = _one_line_error(capsys, [*args, *(["--state-dir", str(tmp_path / "s")]
                                                   if args[0] in ("aa", "matrix") else [])])
        assert str(missing) in message or "no such state dir" in message
    assert list(tmp_path.iterdir()) == []  # no state dir, no output


@pytest.mark.parametrize("command", ["bisect", "audit"])
def test_mindformers_workload_refuses_commands_that_need_prefetch_edges(tmp_path, capsys,
                                                                         monkeypatch, command):
    # No venv: a run would fail naming `make mindformers-venv`; the refusal comes before any.
    monkeypatch.setenv(mindformers.VENV_ENV, str(tmp_path / "no-venv"))
    experiment = tmp_path / "mf.yaml"
    experiment.write_text(
        "name: mf\n"
        "workload: {builtin: mindformers, layers: 2}\n"
        "metrics: {format: mindformers, names: [loss], files: \"output/log/rank_*/info.log\"}\n"
        "steps: 3\n"
    )
    state = tmp_path / "state"
    message = _one_line_error(capsys, [command, str(experiment), "--state-dir", str(state)])
    assert message == f"error: {mindformers.NO_PREFETCH_GRAPH}"
    assert not state.exists()


@pytest.mark.parametrize("args, said", [
    (["--confidence", "1.5"], "error: --confidence must be between 0 and 1, got 1.5"),
    (["--max-runs", "0"], "error: --max-runs must be at least 1, got 0"),
])
def test_bisect_checks_its_search_options_before_anything_runs(tmp_path, capsys, args, said):
    # Said in the words of the search's one check, before the state dir is even made.
    state = tmp_path / "state"
    experiment = fake_job_experiment(tmp_path)
    assert _one_line_error(capsys, ["bisect", str(experiment), "--state-dir", str(state),
                                    *args]) == said
    assert not state.exists()
