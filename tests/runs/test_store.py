"""The run store: the lock, the journal (fsynced lines, torn tail), run dirs and lookups."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.runs.store import JOURNAL_VERSION, RunKey, StateDir, read_journal, run_number


def _key(index: int = 0, mask=("fwd:a->b",), **kw) -> RunKey:
    return RunKey.of(variant=kw.pop("variant", "aa"), mask=mask, guard=kw.pop("guard", "none"),
                     steps=kw.pop("steps", 10), index=index, **kw)


def test_append_then_find_after_reopening(tmp_path):
    with StateDir(tmp_path, "exp") as state:
        state.append(_key(0), {"run_id": "0001-a", "outcome": "ok"})
        state.append(_key(1), {"run_id": "0002-a", "outcome": "error"})
    with StateDir(tmp_path, "exp") as state:
        assert state.find(_key(0))["run_id"] == "0001-a"
        assert state.find(_key(1))["outcome"] == "error"
        assert state.find(_key(2)) is None
        assert len(state.records()) == 2
    lines = (tmp_path / "exp" / "journal.jsonl").read_text().splitlines()
    assert [json.loads(line)["v"] for line in lines] == [JOURNAL_VERSION] * 2


def test_key_fields_all_matter(tmp_path):
    with StateDir(tmp_path, "exp") as state:
        state.append(_key(0), {"outcome": "ok"})
        assert state.find(_key(0, mask=("fwd:a->b",))) is not None
        for other in (_key(0, mask=()), _key(0, mask=None), _key(0, guard="size-one"),
                      _key(0, steps=11), _key(0, variant="search"), _key(0, attempt=1)):
            assert state.find(other) is None, other


def test_mask_order_does_not_matter():
    assert _key(mask=["b", "a"]) == _key(mask=["a", "b"])


def test_second_orchestrator_is_refused(tmp_path):
    holder = textwrap.dedent(f"""
        import sys, time
        from bisect_prefetch.runs.store import StateDir
        with StateDir({str(tmp_path)!r}, "exp"):
            print("locked", flush=True)
            time.sleep(30)
    """)
    proc = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(BisectPrefetchError, match=rf"in use by another bisect-prefetch \(pid {proc.pid}\)"):
            StateDir(tmp_path, "exp").lock()
    finally:
        proc.kill()
        proc.wait(timeout=10)
    # The kernel drops the lock of a killed holder: the state dir is usable again.
    with StateDir(tmp_path, "exp") as state:
        assert state.records() == []


def test_torn_last_line_is_reported_and_cut(tmp_path):
    with StateDir(tmp_path, "exp") as state:
        state.append(_key(0), {"outcome": "ok"})
    journal = tmp_path / "exp" / "journal.jsonl"
    with open(journal, "a") as f:
        f.write('{"v": 1, "outcome": "o')  # a kill in the middle of a write
    with StateDir(tmp_path, "exp") as state:
        assert state.torn_line == '{"v": 1, "outcome": "o'
        assert len(state.records()) == 1
        state.append(_key(1), {"outcome": "ok"})
    journal_read = read_journal(journal)
    assert journal_read.torn_line is None
    assert [r["index"] for r in journal_read.records] == [0, 1]


def test_corrupt_line_in_the_middle_is_an_error(tmp_path):
    journal = tmp_path / "journal.jsonl"
    journal.write_text('{"v": 1}\ngarbage\n{"v": 1}\n')
    with pytest.raises(BisectPrefetchError, match="line 2 is corrupt"):
        read_journal(journal)


def test_unknown_journal_version_is_an_error(tmp_path):
    journal = tmp_path / "journal.jsonl"
    journal.write_text('{"v": 99}\n')
    with pytest.raises(BisectPrefetchError, match="format version 99"):
        read_journal(journal)


def test_run_dirs_are_numbered_and_never_reused(tmp_path):
    with StateDir(tmp_path, "exp") as state:
        first, path1 = state.new_run_dir("aa k0")
        second, path2 = state.new_run_dir("aa/../k1")
    assert first == "0001-aa_k0"
    assert second.startswith("0002-") and "/" not in second
    assert path1.is_dir() and path2.parent == path1.parent
    with StateDir(tmp_path, "exp") as state:
        third, _ = state.new_run_dir("x")
    assert third == "0003-x"


def test_writing_without_the_lock_is_a_bug(tmp_path):
    state = StateDir(tmp_path, "exp")
    with pytest.raises(RuntimeError):
        state.append(_key(), {})


def test_nan_metrics_survive_the_journal(tmp_path):
    with StateDir(tmp_path, "exp") as state:
        state.append(_key(), {"outcome": "ok", "last_loss": float("nan")})
    with StateDir(tmp_path, "exp") as state:
        value = state.find(_key())["last_loss"]
    assert value != value


def test_run_numbers_keep_growing_past_9999_compared_as_numbers(tmp_path):
    with StateDir(tmp_path, "many") as state:
        (state.runs_path / "9999-aa-k0").mkdir(parents=True)
        (state.runs_path / "0100-aa-k1").mkdir()
        first, _ = state.new_run_dir("aa-k1")
        second, _ = state.new_run_dir("aa-k2")
    assert (first, second) == ("10000-aa-k1", "10001-aa-k2")
    assert run_number("10001-aa-k2") == 10001 and run_number("0042-x") == 42
