"""Each rank's own digest file: written by one process only, compared pairwise with the other
run's file of that rank, blockwise, and its bad input (a rank missing, cut mid-line, stopping
early, claimed twice, not in canonical form) named by rank. Older run dirs with one shared
digests.jsonl still compare.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bisect_prefetch.adapters.recorder import Recorder
from bisect_prefetch.metrics import digests
from bisect_prefetch.metrics.compare import StreamingComparator
from bisect_prefetch.metrics.digest_files import digest_files
from bisect_prefetch.metrics.live import DigestFollower
from bisect_prefetch.metrics.localize import compare_run_digests
from bisect_prefetch.metrics.trajectory import Trajectory

PARAMS = ("layers.0.w", "layers.1.w", "output.w")


def _line(step: int, rank: int, param: str, digest: str, *, compact: bool = False) -> str:
    record = {"step": step, "rank": rank, "param": param, "digest": digest, "norm": 1.5,
              "max_abs": 0.25}
    return json.dumps(record, separators=(",", ":") if compact else None) + "\n"


def _run(run_dir: Path, *, ranks: int = 4, steps: int = 8, differ=lambda s, r, p: False,
         compact: bool = False, last_step=lambda r: None) -> Path:
    """Each rank's digests.rank<R>.jsonl; differ(step, rank, param) changes that digest."""
    run_dir.mkdir(parents=True, exist_ok=True)
    for r in range(ranks):
        end = last_step(r) or steps
        text = "".join(_line(s, r, p, "d" + ("x" if differ(s, r, p) else f"{s}{r}{p}"),
                             compact=compact)
                       for s in range(1, end + 1) for p in PARAMS)
        (run_dir / f"digests.rank{r}.jsonl").write_text(text)
    return run_dir


def test_the_first_difference_over_all_ranks_and_a_spread_bounded_to_k_steps(tmp_path):
    a = _run(tmp_path / "a")
    # Rank 2 differs from step 3 on, rank 1 from step 4 on: every step after that differs.
    b = _run(tmp_path / "b", differ=lambda s, r, p: (r == 2 and s >= 3) or (r == 1 and s >= 4))
    result = compare_run_digests(a, b, labels=("a", "b"), ranks=4, spread_steps=2)
    assert result.first_diff_step == 3
    assert result.at_first == [(2, p) for p in sorted(PARAMS)]
    assert result.spread == {3: 3, 4: 6} and result.spread_steps == 2
    assert result.to_json()["spread_steps"] == 2 and result.problems == []


def test_identical_ranks_are_compared_unparsed(tmp_path, monkeypatch):
    parsed = []
    original = digests._parse_block
    monkeypatch.setattr(digests, "_parse_block", lambda lines: parsed.append(lines) or original(lines))
    a, b = _run(tmp_path / "a"), _run(tmp_path / "b", differ=lambda s, r, p: r == 3 and s == 8)
    result = compare_run_digests(a, b, ranks=4)
    assert result.first_diff_step == 8 and result.records_compared == 4 * 8 * 3
    assert sum(len(lines) for lines in parsed) == 6  # only rank 3's three differing line pairs


def test_a_rank_missing_cut_or_stopping_early_is_named(tmp_path):
    a = _run(tmp_path / "a")
    b = _run(tmp_path / "b", last_step=lambda r: 5 if r == 1 else None)
    (b / "digests.rank3.jsonl").unlink()
    text = (b / "digests.rank2.jsonl").read_text()
    (b / "digests.rank2.jsonl").write_text(text[:-9])
    result = compare_run_digests(a, b, labels=("a", "b"), ranks=5)
    assert result.first_diff_step is None
    assert result.problems == [
        "b's digests.rank2.jsonl ends mid-line: its last record was cut off",
        "rank 3 wrote no gradient digests in b (a has them)",
        "rank 4 wrote no gradient digests in either run",
        "rank 1's digests stop at step 5 in b (its other ranks reach step 8)",
    ]
    assert result.notes == []  # a cut line is no record, not a slow one


def test_two_writers_of_one_rank_are_an_error_naming_both(tmp_path):
    a = _run(tmp_path / "a", ranks=2)
    b = _run(tmp_path / "b", ranks=2)
    # A second process claiming rank 1 found its file taken (the recorder's O_EXCL).
    (b / "digests.rank1.node2-4242.jsonl").write_text(_line(1, 1, "layers.0.w", "d11layers.0.w"))
    # ... and a rank whose file holds another rank's records.
    (b / "digests.rank0.jsonl").write_text((b / "digests.rank1.jsonl").read_text())
    result = compare_run_digests(a, b, labels=("a", "b"), ranks=2)
    assert result.problems[:2] == [
        "rank 1 has two writers in b: digests.rank1.jsonl and digests.rank1.node2-4242.jsonl",
        "b's digests.rank0.jsonl holds records of rank 1 (rank 1's own file is "
        "digests.rank1.jsonl): two writers claim rank 1",
    ]


def test_the_recorder_creates_its_files_exclusively(tmp_path, capsys):
    first = Recorder(str(tmp_path), 0)
    first.digests(1, [("w", "ab", 1.0, 1.0)])
    first.close()
    first.digests(2, [("w", "cd", 1.0, 1.0)])  # reopened by the process that created it
    first.close()
    # Another process claiming rank 0 (here: the same file made by someone else).
    (tmp_path / "metrics.rank0.jsonl").write_text("")
    second = Recorder(str(tmp_path), 0)
    second.metrics(1, {"loss": 1.0})
    second.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    own = f"metrics.rank0.{os.uname().nodename}-{os.getpid()}.jsonl"
    assert names == ["digests.rank0.jsonl", "metrics.rank0.jsonl", own]
    assert len((tmp_path / "digests.rank0.jsonl").read_text().splitlines()) == 2
    assert "another process claims this rank" in capsys.readouterr().err
    assert digest_files(tmp_path).ranks == {0: tmp_path / "digests.rank0.jsonl"}


def test_digests_not_in_canonical_form_take_the_slow_path_said_once(tmp_path):
    a = _run(tmp_path / "a")
    b = _run(tmp_path / "b", compact=True, differ=lambda s, r, p: s >= 6)
    result = compare_run_digests(a, b, labels=("a", "b"), ranks=4)
    assert result.first_diff_step == 6 and len(result.at_first) == 12
    assert result.notes == ["b's digests are not in canonical form: the lines that differ were "
                            "parsed the slow way (json)"]
    same = compare_run_digests(a, _run(tmp_path / "c", compact=True), ranks=4)
    assert same.first_diff_step is None and same.problems == []


@pytest.mark.parametrize("mixed", [False, True])
def test_older_run_dirs_with_one_shared_file_still_compare(tmp_path, mixed):
    def shared(run_dir: Path, differ) -> Path:
        run_dir.mkdir()
        lines = [_line(s, r, p, "d" + ("x" if differ(s, r) else f"{s}{r}{p}"))
                 for s in range(1, 6) for r in (1, 0) for p in PARAMS]  # ranks interleaved
        (run_dir / "digests.jsonl").write_text("".join(lines))
        return run_dir

    a = _run(tmp_path / "a", ranks=2, steps=5) if mixed else shared(tmp_path / "a", lambda s, r: False)
    b = shared(tmp_path / "b", lambda s, r: s >= 4 and r == 0)
    result = compare_run_digests(a, b, ranks=2)
    assert result.first_diff_step == 4 and result.at_first == [(0, p) for p in sorted(PARAMS)]
    assert result.problems == []


def test_the_live_follower_stops_at_a_rank_s_first_difference(tmp_path):
    golden = _run(tmp_path / "golden")
    run = tmp_path / "run"
    run.mkdir()
    comparator = StreamingComparator(Trajectory({}), ["loss"])
    follower = DigestFollower(run, golden, comparator)
    for step in range(1, 9):  # the ranks write step by step; the follower polls in between
        for r in range(4):
            with open(run / f"digests.rank{r}.jsonl", "a") as f:
                f.write("".join(_line(step, r, p, "d" + ("x" if (r, step) == (2, 6) else f"{step}{r}{p}"))
                                for p in PARAMS))
        follower.poll()
        if comparator.first_digest_diff_step is not None:
            break
    assert comparator.first_digest_diff_step == 6 and step == 6
    assert follower.unmatched == 0 and set(follower.ranks) == {0, 1, 2, 3}
