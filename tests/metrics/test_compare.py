"""Run comparison against hand-computed values, groups, early stop, and the compare command."""

from __future__ import annotations

import json
import math

import pytest
from rich.console import Console

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.metrics.compare import (
    StreamingComparator,
    compare_group,
    compare_paths,
    compare_series,
    compare_trajectories,
    same_bits,
)
from bisect_prefetch.metrics.digests import DigestRecord, format_digest_line
from bisect_prefetch.metrics.trajectory import Series, Trajectory
from bisect_prefetch.report.compare_table import compare_tables
from tests.conftest import trajectory

NAN, INF = float("nan"), float("inf")


def series(values: dict) -> Series:
    return Series.from_mapping(values)


def traj(**metrics) -> Trajectory:
    return Trajectory.from_mapping(metrics)


def test_statistics_by_hand():
    a = series({1: 1.0, 2: 2.0, 3: 3.0, 4: 4.0})
    b = series({1: 1.0, 2: 2.5, 3: 2.0, 4: 4.0})
    d = compare_series(a, b, "loss")
    # |a-b| = 0, 0.5, 1, 0: mean 0.375; p95 at rank 0.95*3 = 2.85 of [0, 0, 0.5, 1] -> 0.5 + 0.85*0.5
    assert (d.first_diff_step, d.steps_compared, d.steps_differing) == (2, 4, 2)
    assert d.mae == pytest.approx(0.375) and d.p95 == pytest.approx(0.925) and d.max_abs == 1.0
    assert d.complete and d.differs


def test_identical_runs():
    a = series({1: 0.1 + 0.2, 2: NAN, 3: -1.5})
    d = compare_series(a, series({1: 0.30000000000000004, 2: NAN, 3: -1.5}))
    assert d.first_diff_step is None and (d.mae, d.p95, d.max_abs) == (0.0, 0.0, 0.0)
    assert d.steps_differing == 0 and not d.differs


def test_nan_equals_nan_but_not_a_number():
    d = compare_series(series({1: NAN, 2: NAN, 3: 1.0}), series({1: NAN, 2: 1.0, 3: 1.0}))
    assert d.first_diff_step == 2 and d.steps_differing == 1 and d.nan_mismatches == 1
    # The NaN-vs-number step has no known size: the statistics say NaN, never 0.
    assert math.isnan(d.mae) and math.isnan(d.p95) and math.isnan(d.max_abs)


def test_infinity_differences():
    d = compare_series(series({1: INF, 2: 1.0, 3: 2.0}), series({1: INF, 2: INF, 3: 2.0}))
    assert d.first_diff_step == 2 and d.steps_differing == 1
    assert d.mae == INF and d.max_abs == INF
    # sorted |a-b| = [0, 0, inf]; rank 0.95*2 = 1.9 lies between 0 and inf -> inf
    assert d.p95 == INF
    d = compare_series(series({1: INF}), series({1: -INF}))
    assert d.first_diff_step == 1 and d.max_abs == INF


def test_bitwise_negative_zero_differs():
    assert not same_bits(0.0, -0.0) and same_bits(NAN, -NAN) and not same_bits(NAN, 1.0)
    d = compare_series(series({1: 0.0}), series({1: -0.0}))
    assert d.first_diff_step == 1 and d.max_abs == 0.0


def test_one_run_stopped_early_and_a_missing_step():
    a = series({s: float(s) for s in range(1, 11)})
    b = series({s: float(s) + (0.25 if s == 5 else 0.0) for s in range(1, 7) if s != 3})
    d = compare_series(a, b)
    assert d.steps_compared == 5 and d.missing_in_b == 5 and d.missing_in_a == 0
    assert d.first_missing_in_b == 3 and d.first_missing_in_a is None and not d.complete
    assert d.first_diff_step == 5 and d.mae == pytest.approx(0.05) and d.max_abs == 0.25
    reverse = compare_series(b, a)
    assert reverse.missing_in_a == 5 and reverse.first_missing_in_a == 3


def test_metric_only_one_run_has():
    diffs = compare_trajectories(traj(loss={1: 1.0}), traj(loss={1: 1.0}, grad_norm={1: 2.0}))
    g = diffs["grad_norm"]
    assert g.steps_compared == 0 and g.missing_in_a == 1 and g.mae is None and g.first_diff_step is None


def test_first_difference_on_another_rank():
    a = trajectory([(r, s, {"loss": float(s)}) for r in (0, 1) for s in range(1, 8)])
    b = trajectory(
        [(r, s, {"loss": float(s) + (1e-9 if (r == 1 and s >= 2) or (r == 0 and s >= 5) else 0)})
         for r in (0, 1) for s in range(1, 8)]
    )
    d = compare_trajectories(a, b)["loss"]
    assert d.first_diff_step == 2 and d.first_diff_rank == 1 and d.rank_first_diff == {0: 5, 1: 2}
    assert d.steps_differing == 3  # statistics are over the metrics rank (rank 0)


def test_group_all_pairs():
    same = {s: s / 3 for s in range(1, 10)}
    odd = same | {4: 99.0}
    group = compare_group([traj(loss=same), traj(loss=same), traj(loss=odd)])
    assert len(group.pairs) == 3 and group.diverged
    assert group.first_diff_step == 4 and group.first_pair == (0, 2)
    assert [p.first_diff_step for p in group.pairs] == [None, 4, 4]
    out = group.to_json()
    assert out["first_pair"] == [0, 2] and out["first_metric"] == "loss"
    calm = compare_group([traj(loss=same)] * 3)
    assert not calm.diverged and calm.first_pair is None and calm.to_json()["first_diff_step"] is None


def test_streaming_comparator_stops_at_first_difference():
    ref = trajectory([(r, s, {"loss": s / 7, "grad_norm": NAN}) for r in (0, 1) for s in range(1, 6)])
    cmp = StreamingComparator(ref)
    assert cmp.feed(0, 1, {"loss": 1 / 7, "grad_norm": NAN}) is None
    assert cmp.feed(1, 1, {"loss": 1 / 7}) is None
    assert cmp.feed(0, 9, {"loss": 5.0}) is None and cmp.unmatched == 1  # beyond the reference
    assert cmp.feed_line(json.dumps({"step": 2, "rank": 0, "loss": 2 / 7, "grad_norm": NAN})) is None
    assert cmp.feed_line("garbage") is None and cmp.lines_unread == 1
    assert cmp.feed_line(json.dumps({"step": 3, "rank": 1, "loss": 3 / 7 + 1e-16})) == 3
    assert cmp.diverged and cmp.first_diff == (1, "loss")
    assert cmp.feed(0, 2, {"grad_norm": 1.0}) == 2  # an earlier step that differs wins
    only_loss = StreamingComparator(ref, names=["loss"])
    assert only_loss.feed(0, 1, {"loss": 1 / 7, "grad_norm": 5.0}) is None and only_loss.unmatched == 0


def test_json_shape():
    diffs = compare_trajectories(traj(loss={1: 1.0, 2: 2.0}), traj(loss={1: 1.0, 2: INF}))
    out = diffs["loss"].to_json()
    for key in ("first_diff_step", "mae", "p95", "max_abs", "steps_compared", "steps_differing"):
        assert key in out
    assert out["max_abs"] == INF and json.loads(json.dumps(out))["max_abs"] == INF


def _run_dir(path, losses: dict[int, float], digests: list[DigestRecord] | None = None):
    path.mkdir(parents=True)
    lines = [json.dumps({"step": s, "rank": 0, "loss": v, "grad_norm": 1.0}) for s, v in losses.items()]
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    if digests is not None:
        (path / "digests.jsonl").write_text("\n".join(format_digest_line(d) for d in digests) + "\n")
    return path


def test_compare_paths_with_digests_and_table(tmp_path):
    base = {s: 10.0 / s for s in range(1, 9)}
    drift = base | {s: base[s] + 1e-7 for s in range(6, 9)}
    rec = [DigestRecord(s, r, p, "aa") for s in range(1, 9) for r in (0, 1) for p in ("w1", "w2")]
    rec_b = [d._replace(digest="bb") if d.step >= 4 and (d.step > 4 or d.param == "w2") else d for d in rec]
    a, b = _run_dir(tmp_path / "a", base, rec), _run_dir(tmp_path / "b", drift, rec_b)
    result = compare_paths(a, b)
    out = result.to_json()
    assert out["metrics"]["loss"]["first_diff_step"] == 6 and out["metrics"]["grad_norm"]["first_diff_step"] is None
    assert out["digests"]["first_diff_step"] == 4
    assert out["digests"]["at_first"] == [{"rank": 0, "param": "w2"}, {"rank": 1, "param": "w2"}]
    assert out["digests"]["lead_steps"] == 2 and out["digests"]["spread"]["5"] == 4
    console = Console(width=150, record=True)
    for table in compare_tables(out):
        console.print(table)
    text = console.export_text()
    assert "first diff step" in text and "rank 1: w2" in text and "2 step(s)" in text


def test_compare_log_files_without_digests(tmp_path):
    line = "{{ step:[{:5d}/  10], loss: {:.6f}, grad_norm: 1.000000 }}"
    (tmp_path / "a.log").write_text("\n".join(line.format(s, s / 2) for s in range(1, 6)))
    (tmp_path / "b.log").write_text("\n".join(line.format(s, s / 2) for s in range(1, 4)))
    result = compare_paths(tmp_path / "a.log", tmp_path / "b.log", "mindformers")
    assert result.digests is None and result.to_json()["digests"] is None
    assert result.metrics["loss"].missing_in_b == 2 and result.metrics["loss"].first_diff_step is None
    with pytest.raises(BisectPrefetchError, match="no such run"):
        compare_paths(tmp_path / "a.log", tmp_path / "nope")


def test_every_rank_gets_its_statistics_and_the_first_rank_is_named():
    a = trajectory([(r, s, {"loss": float(s)}) for r in (0, 1, 2) for s in range(1, 8)])
    b = trajectory(
        [(r, s, {"loss": float(s) + (0.5 if r == 2 and s >= 3 else 0.0)}) for r in (0, 1, 2) for s in range(1, 8)]
    )
    d = compare_trajectories(a, b)["loss"]
    assert (d.first_diff_step, d.first_diff_rank, d.rank) == (3, 2, 0)
    assert d.steps_differing == 0  # the metrics rank (0) is clean ...
    out = d.to_json()["per_rank"]
    assert sorted(out) == ["0", "1", "2"]  # ... and every rank is there
    assert out["2"] == {"first_diff_step": 3, "mae": pytest.approx(0.5 * 5 / 7), "p95": 0.5, "max_abs": 0.5,
                        "steps_compared": 7, "steps_differing": 5}
    assert out["0"]["steps_differing"] == 0 and out["1"]["first_diff_step"] is None


MF19 = ("{{ Epoch:[  1/  1], step:[{:5d}/   10], loss:[{:.6f}/{:.6f}], per_step_time: 28ms, lr: 0.0009054635, "
        "overflow cond: False, loss_scale: 1.0, global_norm: [{:.7f}], train_throughput_per_npu: 0.012T")


def _mf19_log(path, steps, tail=""):
    path.write_text("".join(MF19.format(s, 5.5 - s / 100, 5.5, 1.43 + s / 1000) + "\n" for s in steps) + tail)
    return path


def _compare_cli(*args):
    from typer.testing import CliRunner

    from bisect_prefetch.cli import app

    return CliRunner().invoke(app, ["compare", *map(str, args)])


def test_compare_real_mindformers_19_logs(tmp_path):
    a, b = _mf19_log(tmp_path / "a.log", range(1, 11)), _mf19_log(tmp_path / "b.log", range(1, 11))
    same = _compare_cli(a, b, "--json", tmp_path / "out.json")
    assert same.exit_code == 0, same.output
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["metrics"]["loss"]["steps_compared"] == out["metrics"]["grad_norm"]["steps_compared"] == 10
    assert out["truncated"] is None
    b.write_text(b.read_text().replace("loss:[5.450000/", "loss:[5.450001/"))
    differ = _compare_cli(a, b, "--json", tmp_path / "out.json")
    assert differ.exit_code == 1 and json.loads((tmp_path / "out.json").read_text())["first_diff_step"] == 5


def test_a_run_that_stops_early_is_a_finding_unless_allowed(tmp_path):
    a, b = _mf19_log(tmp_path / "a.log", range(1, 11)), _mf19_log(tmp_path / "b.log", range(1, 8))
    short = _compare_cli(a, b)
    assert short.exit_code == 1
    assert "truncated: B stops before A: last common step 7, A's last step 10, B's last step 7" in short.output
    allowed = _compare_cli(a, b, "--allow-truncated")
    assert allowed.exit_code == 0 and "compared the common steps (--allow-truncated)" in allowed.output


def test_a_log_cut_mid_line_is_never_consistent(tmp_path):
    a = _mf19_log(tmp_path / "a.log", range(1, 6))
    b = _mf19_log(tmp_path / "b.log", range(1, 6), tail="{ Epoch:[  1/  1], step:[    6/   10], los")
    result = compare_paths(a, b)
    assert not result.differs and result.finding  # the common steps agree, yet it is no clean result
    assert result.truncation.cut_mid_line["b"][1:] == (6, "{ Epoch:[  1/  1], step:[    6/   10], los")
    cut = _compare_cli(a, b)
    assert cut.exit_code == 1 and "B's log stops mid-line" in cut.output
    assert cut.output.count("stops mid-line") == 1


def test_compare_table_shows_every_rank_and_the_first(tmp_path):
    for name, nudge in (("a", 0.0), ("b", 1e-6)):
        log = tmp_path / name / "log"
        log.mkdir(parents=True)
        for rank in (0, 1):
            _mf19_log(log / f"worker_{rank}.log", range(1, 6))
            if rank == 1 and nudge:
                text = (log / "worker_1.log").read_text().replace("loss:[5.470000/", "loss:[5.470001/")
                (log / "worker_1.log").write_text(text)
    out = compare_paths(tmp_path / "a", tmp_path / "b").to_json()
    assert out["metrics"]["loss"]["first_diff_rank"] == 1 and out["metrics"]["loss"]["rank"] == 0
    console = Console(width=150, record=True)
    for table in compare_tables(out):
        console.print(table)
    text = console.export_text()
    assert "3 (rank 1)" in text and "per rank" in text and "1 (first)" in text
