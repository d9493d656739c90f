"""A run's signals: "bitwise identical (digests)" only where every rank digested a tensor at
every step it digested; otherwise the printed-precision wording and a note naming the ranks
that digested nothing, with the adapter's reason."""

from __future__ import annotations

import json
from pathlib import Path

from bisect_prefetch.judge.signals import (
    describe_signals,
    digest_gaps,
    identical_wording,
    run_signals,
)

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


def _four_decimals(tmp_path: Path, digests: dict[int, dict | None], steps: int = 4) -> dict:
    """A run's signals whose job printed its loss at 4 decimals."""
    _run(tmp_path, digests)  # the probes
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(f'{{"step": {s}, "loss": {1.5 / s:.4f}}}\n'
                               for s in range(1, steps + 1)))
    return run_signals(tmp_path, metric_files=[metrics], fmt="jsonl", names=["loss"])


def test_digests_that_stop_before_the_compared_steps_claim_only_their_steps(tmp_path):
    """Both runs digested steps 1-2 of the 4 compared: the words say so, never "bitwise"."""
    two = _summary(4, 4, 8, steps=2, last_step=2)
    signals = _four_decimals(tmp_path, {0: two, 1: two})
    wording = identical_wording([signals, signals], steps=4, world_size=2)
    assert wording == ("identical in the digests of steps 1-2 on ranks 0-1 and in the printed "
                       "loss (4 decimals)")
    # The same digests over every compared step do back it.
    assert identical_wording([signals, signals], steps=2, world_size=2) == \
        "bitwise identical (digests)"


def test_a_rank_that_wrote_no_digests_in_either_run_is_never_covered_by_a_claim(tmp_path):
    """A job of two ranks whose rank 1 wrote no probe and no digests (its adapter never ran):
    rank 0's digests back rank 0 alone."""
    signals = _four_decimals(tmp_path, {0: _summary(4, 4, 8, steps=4, last_step=4)})
    wording = identical_wording([signals, signals], steps=4, world_size=2)
    assert "bitwise" not in wording
    assert wording.startswith("identical in the digests of steps 1-4 on rank 0 (rank 1: not in")
    assert identical_wording([signals, signals], steps=4, world_size=1) == \
        "bitwise identical (digests)"


def test_digests_that_stop_while_the_metrics_go_on_are_gaps(tmp_path):
    signals = _run(tmp_path, {0: _summary(4, 4, 8, steps=2, last_step=2),
                              1: _summary(4, 4, 8)})
    gaps = digest_gaps(signals, steps_done=3, every=1)
    assert len(gaps) == 1 and gaps[0].startswith(
        "the gradient digests of rank 0 stop at step 2 while the metrics go on to step 3")
    assert digest_gaps(signals, steps_done=2, every=1) == []
    # Every 2nd step digested: step 2 is the last one due of 3.
    assert digest_gaps(signals, steps_done=3, every=2) == []
