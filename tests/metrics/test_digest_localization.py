"""Gradient digests on by default, their bad input, and where a divergence is localized.

Fast: the comparison and its checks on written files, and `aa` over a stand-in job that
writes digests (tests/jobs/digest_job.py). Real FSDP2, where a planted one-ulp fault moves
the gradients steps before the printed loss (read at 2 decimals) does:
tests/e2e/test_digests_on_real_fsdp2.py.
"""

from __future__ import annotations

import io
import json
import sys
import textwrap
from pathlib import Path

import pytest

from bisect_prefetch.adapters.recorder import Recorder
from bisect_prefetch.cli import main
from bisect_prefetch.commands.bisect_loop import RunLines
from bisect_prefetch.commands.matrix import CellResult, cell_verdict_line
from bisect_prefetch.experiment import Experiment
from bisect_prefetch.metrics.compare import compare_paths
from bisect_prefetch.metrics.digests import read_digests
from bisect_prefetch.metrics.localize import (
    compare_run_digests,
    judge_digests,
    unit_of,
    unit_step_differences,
)
from bisect_prefetch.runs.outcome import RunOutcome
from bisect_prefetch.runs.plan import build_plan
from bisect_prefetch.search.oracle import Finished
from tests.conftest import console

DIGEST_JOB = Path(__file__).resolve().parents[1] / "jobs" / "digest_job.py"
UNITS = ["embedding", "layers.0", "layers.1", "output"]


def _write(run_dir: Path, records: list[tuple], *, cut: int = 0, shared: bool = False) -> Path:
    """Each rank's digests.rank<R>.jsonl from (step, rank, param, digest, norm) records (shared:
    one digests.jsonl, as older run dirs hold); cut: bytes dropped from the last file."""
    run_dir.mkdir(parents=True, exist_ok=True)
    files: dict[str, list[str]] = {}
    for s, r, p, d, n in records:
        name = "digests.jsonl" if shared else f"digests.rank{r}.jsonl"
        files.setdefault(name, []).append(json.dumps(
            {"step": s, "rank": r, "param": p, "digest": d, "norm": n, "max_abs": n / 2}) + "\n")
    for k, (name, lines) in enumerate(sorted(files.items())):
        text = "".join(lines)
        (run_dir / name).write_text(text[: len(text) - cut] if k == len(files) - 1 else text)
    return run_dir


def _records(steps: int = 5, ranks: int = 2, params=("layers.0.w", "layers.1.w", "output.w"),
             change=lambda s, r, p: None) -> list[tuple]:
    out = []
    for s in range(1, steps + 1):
        for r in range(ranks):
            for p in params:
                factor = change(s, r, p)
                out.append((s, r, p, f"{s}{r}{p}" + ("x" if factor else ""), s * (factor or 1.0)))
    return out


# -- the experiment's record: and the plan -----------------------------------------------
def test_digests_are_on_by_default_and_the_record_key_reaches_the_plan(tmp_path):
    base = {"name": "x", "command": ["true"]}
    plan = build_plan(experiment=Experiment(**base), run_id="r", out_dir=tmp_path, mask=None,
                      guard="none", steps=3)
    assert plan["record"]["digests"] == "*" and plan["record"]["digest_every"] == 1
    off = Experiment(**base, record={"digests": False})
    assert build_plan(experiment=off, run_id="r", out_dir=tmp_path, mask=None, guard="none",
                      steps=3)["record"]["digests"] is None
    some = Experiment(**base, record={"every": 5, "params": "layers.*"})
    record = build_plan(experiment=some, run_id="r", out_dir=tmp_path, mask=None, guard="none",
                        steps=3)["record"]
    assert record["digests"] == "layers.*" and record["digest_every"] == 5
    assert off.fingerprint() != Experiment(**base).fingerprint()  # another record, another run


def test_recorder_lines_round_trip_with_norm_and_max_abs(tmp_path):
    recorder = Recorder(str(tmp_path), 1)
    recorder.digests(4, [("layers.0.w", "ab", 0.1 + 0.2, float("nan")), ('q"x', "cd", 1e-300, 2.0)])
    recorder.close()
    first, second = read_digests(tmp_path / "digests.rank1.jsonl")
    assert first[:4] == (4, 1, "layers.0.w", "ab") and first.norm == 0.1 + 0.2
    assert first.max_abs != first.max_abs  # NaN survives
    assert second.param == 'q"x' and second.norm == 1e-300 and second.max_abs == 2.0


# -- localization ------------------------------------------------------------------------------
def test_unit_of_takes_the_longest_unit_and_root_otherwise():
    units = ["layers.1", "layers.10", "layers.1.attn"]
    assert unit_of("layers.10.w", units) == "layers.10"
    assert unit_of("layers.1.attn.q", units) == "layers.1.attn"
    assert unit_of("layers.1.w", units) == "layers.1"
    assert unit_of("embedding.weight", units) == "root"
    assert unit_of("norm.weight", ["layers.0", "norm+output"]) == "norm+output"


def test_gradients_alone_name_the_first_differing_unit_in_backward_order(tmp_path):
    ref = _write(tmp_path / "a", _records())
    # Step 3: layers.1 moves a lot on rank 1, layers.0 (computed after it in backward) a
    # little on both ranks: the corruption started in layers.1's backward.
    run = _write(tmp_path / "b", _records(change=lambda s, r, p: (
        1.5 if (s >= 3 and p == "layers.1.w" and r == 1) else 1.0001 if (s >= 3 and p == "layers.0.w")
        else None)))
    verdict = judge_digests(ref, run, units=UNITS, ranks=2)
    assert verdict.problems == []
    assert verdict.localization.to_json() == {
        "step": 3, "rank": 1, "unit": "layers.1", "param": "layers.1.w", "units_differing": 2,
        "rule": "backward-order"}
    units, steps, counts = unit_step_differences(ref, run, UNITS, around=3)
    assert units == ["layers.0", "layers.1", "output"] and steps == [1, 2, 3, 4, 5]
    assert counts[("layers.1", 3)] == 1 and counts[("layers.0", 3)] == 2 and ("output", 3) not in counts


def test_the_run_s_own_backward_order_beats_the_graph_s(tmp_path):
    ref = _write(tmp_path / "a", _records())
    run = _write(tmp_path / "b", _records(change=lambda s, r, p: (
        2.0 if s >= 2 and p in ("layers.0.w", "layers.1.w") else None)))
    # This run computed layers.0's gradients before layers.1's (its order record says so).
    events = [["use", "layers.0", "bwd"], ["use", "layers.1", "bwd"], ["use", "output", "bwd"]]
    (run / "order.rank0.jsonl").write_text(json.dumps({"step": 1, "rank": 0, "events": events})
                                           + "\n")
    where = judge_digests(ref, run, units=UNITS, ranks=2).localization
    assert (where.unit, where.rule) == ("layers.0", "backward-order")


def test_a_differing_parameter_value_names_its_unit_before_the_spread(tmp_path):
    params = ("layers.0.w", "layers.1.w", "output.w", "layers.0.w@value", "layers.1.w@value",
              "output.w@value")
    ref = _write(tmp_path / "a", _records(params=params))
    # Step 2: layers.1's value differs on rank 0 (a prefetch wrote into its shard), every
    # gradient differs from step 3 on.
    run = _write(tmp_path / "b", _records(params=params, change=lambda s, r, p: (
        1.1 if (s == 2 and p == "layers.1.w@value" and r == 0) or s >= 3 else None)))
    where = judge_digests(ref, run, units=UNITS, ranks=2).localization
    assert where.to_json() == {"step": 2, "rank": 0, "unit": "layers.1",
                               "param": "layers.1.w@value", "units_differing": 1,
                               "rule": "values"}


def test_identical_digests_have_no_localization_and_no_problem(tmp_path):
    verdict = judge_digests(_write(tmp_path / "a", _records()), _write(tmp_path / "b", _records()),
                            units=UNITS, ranks=2)
    assert verdict.first_diff_step is None and verdict.localization is None
    assert verdict.problems == []


# -- bad input: one clear line each, never "no difference" as proof -----------------------------
def test_a_digest_file_cut_mid_line(tmp_path):
    result = compare_run_digests(_write(tmp_path / "a", _records()),
                                 _write(tmp_path / "b", _records(), cut=7), ranks=2)
    assert result.first_diff_step is None
    assert result.problems == ["run's digests.rank1.jsonl ends mid-line: its last record was cut off"]


def test_a_rank_that_wrote_no_digests(tmp_path):
    ref = _write(tmp_path / "a", _records())
    silent = [r for r in _records() if r[1] != 1]
    result = compare_run_digests(ref, _write(tmp_path / "b", silent), ranks=2)
    assert result.problems == ["rank 1 wrote no gradient digests in run (reference has them)"]
    # Silent in both runs: only the world size tells.
    both = compare_run_digests(_write(tmp_path / "c", silent), _write(tmp_path / "d", silent),
                               ranks=2)
    assert both.problems == ["rank 1 wrote no gradient digests in either run"]
    assert compare_run_digests(tmp_path / "c", tmp_path / "d", ranks=None).problems == []


def test_digests_over_different_parameter_sets(tmp_path):
    ref = _write(tmp_path / "a", _records())
    other = _write(tmp_path / "b", _records(params=("layers.0.w", "layers.1.w", "output.bias")))
    result = compare_run_digests(ref, other, ranks=2)
    assert result.first_diff_step is None
    assert result.problems == [
        f"rank {r}: the runs digest different records (only in reference: output.w at step 1, "
        "output.w at step 2; only in run: output.bias at step 1, output.bias at step 2)"
        for r in (0, 1)]


def test_a_run_without_a_digest_file_next_to_one_with(tmp_path):
    ref = _write(tmp_path / "a", _records())
    (tmp_path / "b").mkdir()
    result = compare_run_digests(ref, tmp_path / "b")
    assert result.problems == ["run wrote no gradient digests (reference did): "
                               "its gradients cannot be compared"]
    assert compare_run_digests(tmp_path / "b", tmp_path / "b") is None  # neither: nothing to say


def test_a_run_stopped_early_is_no_problem(tmp_path):
    ref = _write(tmp_path / "a", _records(steps=8))
    result = compare_run_digests(ref, _write(tmp_path / "b", _records(steps=3)), ranks=2)
    assert result.problems == [] and result.missing_in_b > 0


def _experiment(tmp_path: Path, mode: str) -> Path:
    path = tmp_path / f"{mode}.yaml"
    path.write_text(textwrap.dedent(f"""
        name: dj-{mode}
        command: [{json.dumps(sys.executable)}, {json.dumps(str(DIGEST_JOB))}, {mode}]
        metrics: {{format: jsonl, names: [loss]}}
        graph: {{source: static, policy: fsdp2-chain, layers: 2}}
        steps: 6
        timeout_s: 30
    """))
    return path


def _aa(tmp_path: Path, mode: str) -> tuple[int, dict]:
    out = tmp_path / f"{mode}.json"
    code = main(["aa", str(_experiment(tmp_path, mode)), "--state-dir", str(tmp_path / "state"),
                 "--json", str(out)])
    return code, json.loads(out.read_text())


@pytest.mark.parametrize(("mode", "line"), [
    ("cut", "digests.rank1.jsonl ends mid-line: its last record was cut off"),
    ("silent-rank", "rank 1 wrote no gradient digests in run 0002-aa-k1 (reference 0001-aa-k0 "
                    "has them)"),
    ("other-params", "rank 0: the runs digest different records (only in reference 0001-aa-k0: "
                     "output.weight at step 1, output.weight at step 2; only in run 0002-aa-k1: "
                     "output.bias at step 1, output.bias at step 2)"),
])
def test_aa_never_calls_runs_with_bad_digests_consistent(tmp_path, capsys, mode, line):
    code, result = _aa(tmp_path, mode)
    assert code != 0 and result["verdict"] != "consistent"
    assert result["metrics"] == {} or result["metrics"]["loss"]["first_diff_step"] is None
    assert line in result["reason"]
    assert sum(line in out for out in capsys.readouterr().out.splitlines()) >= 1


def test_aa_diverges_on_digests_alone_and_localizes(tmp_path, capsys):
    code, result = _aa(tmp_path, "late-diff")
    assert code == 1 and result["verdict"] == "diverged" and result["first_diff_step"] == 3
    where = {"step": 3, "rank": 0, "unit": "layers.1", "param": "layers.1.b", "units_differing": 1,
             "rule": "backward-order"}
    assert result["localization"] == where
    assert [run["localization"] for run in result["run_details"]] == [None, where]
    assert ("-> diverged at step 3; gradients first differ at step 3 in layers.1 "
            "(rank 0, layers.1.b, first in backward order; 1 unit differs at that step)"
            ) in capsys.readouterr().out
    clean_code, clean = _aa(tmp_path, "clean")
    assert clean_code == 0 and clean["verdict"] == "consistent" and clean["localization"] is None


def test_compare_says_digests_that_cannot_vouch_for_the_runs(tmp_path):
    for name, cut in (("a", 0), ("b", 9)):
        run_dir = _write(tmp_path / name, _records(), cut=cut)
        (run_dir / "metrics.jsonl").write_text("".join(
            json.dumps({"step": s, "rank": 0, "loss": 1.0 / s}) + "\n" for s in range(1, 6)))
    result = compare_paths(tmp_path / "a", tmp_path / "b")
    assert not result.differs and result.finding  # compare exits 1, never "identical"
    assert result.to_json()["digests"]["problems"] == [
        "b's digests.rank1.jsonl ends mid-line: its last record was cut off"]


WHERE = {"step": 9, "rank": 1, "unit": "layers.4", "param": "layers.4.qkv.weight",
         "units_differing": 3}


def test_bisect_and_matrix_lines_name_the_unit():
    out = io.StringIO()
    details: list[dict] = []
    outcome = RunOutcome(run_id="0007-search-k0", outcome="stopped-early", reason="",
                         first_diff_step=9, steps_done=9, localization=WHERE)
    RunLines(console(out), details=details).say(
        Finished(frozenset({"e1", "e2"}), outcome.result(), outcome=outcome))
    assert "diverged at step 9 in layers.4 (rank 1)" in out.getvalue()
    assert details[0]["localization"] == WHERE and details[0]["mask"] == ["e1", "e2"]
    group = {"verdict": "diverged", "first_diff_step": 9, "localization": WHERE, "runs": 2,
             "run_details": [{"outcome": "ok", "first_diff_step": None},
                             {"outcome": "stopped-early", "first_diff_step": 9}]}
    cell = CellResult(name="c", expect="diverged", mask_spec=["all-on"], guard="none",
                      overrides={}, group=group)
    assert cell.to_json()["localization"] == WHERE
    assert cell_verdict_line(cell).startswith("-> diverged at step 9 in layers.4 (rank 1) (1 of 2")
    assert RunOutcome(run_id="r", outcome="ok", reason="", first_diff_step=9,
                      localization=WHERE).result().unit == "layers.4"


def test_when_every_unit_s_gradients_differ_at_once_no_unit_is_named_by_order(tmp_path):
    from bisect_prefetch.report.localization import describe, in_unit

    ref = _write(tmp_path / "a", _records())
    # Step 3: every unit with gradients (embedding has none) differs at once, as a forward
    # race into an unsharded buffer makes them: the backward order cannot tell where it began.
    run = _write(tmp_path / "b", _records(change=lambda s, r, p: 1.01 if s >= 3 else None))
    where = judge_digests(ref, run, units=UNITS, ranks=2).localization.to_json()
    assert (where["step"], where["rule"], where["units_differing"]) == (3, "every-unit", 3)
    assert describe(where) == ("gradients of every unit (3) first differ at step 3 (rank 0): the "
                               "digests cannot tell where it began; explain names the first op "
                               "that differs")
    assert in_unit(where) == " in every unit (rank 0)"
    run_outcome = RunOutcome(run_id="r", outcome="ok", reason="", first_diff_step=3,
                             localization=where)
    assert run_outcome.result().unit is None  # no hint for the search
