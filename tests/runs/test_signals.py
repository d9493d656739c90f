"""A run's signals: "bitwise identical (digests)" only where every rank digested a tensor at
every step it digested; otherwise the printed-precision wording and a note naming the ranks
that digested nothing, with the adapter's reason."""

from __future__ import annotations

import json
from pathlib import Path

from bisect_prefetch.runs.signals import describe_signals, identical_wording, run_signals

HP_REASON = "the adapter found no parameter tensors in hyper-parallel's units"


def _summary(parameters: int, gradients: int, fewest: int, **extra) -> dict:
    return {"parameters": parameters, "gradients": gradients, "steps": 3, "first_step": 1,
            "last_step": 3, "coverage": "every element", "fewest_tensors": fewest, **extra}


def _run(tmp_path: Path, digests: dict[int, dict | None]) -> dict:
    for rank, summary in digests.items():
        probe = {"plan_hash": "x", "step_source": "optimizer", "steps_counted": 3}
        if summary is not None:
            probe["digests"] = summary
        (tmp_path / f"probe.rank{rank}.json").write_text(json.dumps(probe))
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"step": s, "loss": 1.5}) + "\n" for s in (1, 2, 3)))
    return run_signals(tmp_path, metric_files=[metrics], fmt="jsonl", names=["loss"])


def test_every_rank_digested_something_backs_the_bitwise_claim(tmp_path):
    signals = _run(tmp_path, {0: _summary(4, 4, 8), 1: _summary(4, 4, 8)})
    assert signals["digests"]["nothing_digested"] == []
    assert identical_wording([signals, signals]) == "bitwise identical (digests)"
    assert "0 tensors digested" not in describe_signals(signals)


def test_a_rank_with_nothing_digested_gets_no_bitwise_claim_and_is_named(tmp_path):
    empty = _summary(0, 0, 0, nothing_digested=HP_REASON)
    signals = _run(tmp_path, {0: empty, 1: empty})
    assert [row["rank"] for row in signals["digests"]["nothing_digested"]] == [0, 1]
    wording = identical_wording([signals, signals])
    assert "bitwise" not in wording and wording.startswith("identical at the printed precision")
    line = describe_signals(signals)
    assert f"rank 0: 0 tensors digested: {HP_REASON}" in line
    assert f"rank 1: 0 tensors digested: {HP_REASON}" in line


def test_one_empty_step_or_one_silent_rank_is_enough_to_withdraw_the_claim(tmp_path):
    (tmp_path / "a").mkdir()
    one_step = _run(tmp_path / "a",
                    {0: _summary(4, 4, 0, nothing_digested=HP_REASON), 1: _summary(4, 4, 8)})
    assert [row["rank"] for row in one_step["digests"]["nothing_digested"]] == [0]
    assert "bitwise" not in identical_wording([one_step])
    (tmp_path / "b").mkdir()
    silent = _run(tmp_path / "b", {0: _summary(4, 4, 8), 1: None})
    assert silent["digests"]["nothing_digested"][0]["rank"] == 1
    assert "rank 1: 0 tensors digested: it took no digest" in describe_signals(silent)
    assert "bitwise" not in identical_wording([silent])
