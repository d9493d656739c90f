"""Fuzzing the matrix loader and the journal reader: the documented error or a result, never a crash.

(The experiment loader and the log parsers are fuzzed in test_experiment.py and
test_parsers.py.)
"""

from __future__ import annotations

import fcntl
import json
import os

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.experiment import load_matrix
from bisect_prefetch.runs.store import JOURNAL, LOCK, RunKey, StateDir, read_journal

FUZZ = settings(max_examples=120, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])

EXPERIMENT = {"name": "x", "command": ["python", "train.py"],
              "graph": {"source": "static", "policy": "fsdp2-chain", "layers": 2}}

yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=3),
    max_leaves=10,
)
valid_cell = st.fixed_dictionaries(
    {"name": st.sampled_from(["a", "b", "c"]),
     "mask": st.sampled_from(["all-on", "all-off", ["bwd", "fwd:*"], "keep-only:bwd"]),
     "runs": st.integers(2, 4),
     "expect": st.sampled_from(["consistent", "diverged", "any"])},
    optional={"guard": st.sampled_from(["none", "size-one"]),
              "overrides": st.dictionaries(
                  st.sampled_from(["steps", "seed", "workload.layers", "a..b", "command.x"]),
                  st.integers(1, 5) | yaml_values, max_size=2)},
)


@st.composite
def cells(draw) -> list:
    """Mostly valid cells, some with one key replaced by junk, dropped, or added."""
    out = []
    for cell in draw(st.lists(valid_cell, min_size=1, max_size=3)):
        damage = draw(st.sampled_from(["none", "none", "none", "replace", "drop", "add"]))
        key = draw(st.sampled_from(sorted(cell)))
        if damage == "replace":
            cell[key] = draw(yaml_values)
        elif damage == "drop":
            del cell[key]
        elif damage == "add":
            cell[draw(st.text(max_size=6))] = draw(yaml_values)
        out.append(cell)
    return out


@st.composite
def matrices(draw) -> dict:
    """Mostly valid matrix files, some with a part replaced by junk or a key added."""
    data = {"experiment": draw(st.sampled_from([EXPERIMENT, "exp.yaml", "missing.yaml"])),
            "cells": draw(cells())}
    damage = draw(st.sampled_from(["none", "none", "none", "experiment", "cells", "extra"]))
    if damage in ("experiment", "cells"):
        data[damage] = draw(yaml_values)
    elif damage == "extra":
        data[draw(st.text(max_size=6))] = draw(yaml_values)
    return data


def _loads_or_fails_cleanly(path) -> None:
    try:
        matrix = load_matrix(path)
    except BisectPrefetchError as exc:
        assert "\n" not in str(exc)
        return
    # Loaded: every cell's experiment is valid too.
    for cell in matrix.cells:
        matrix.experiment_for(cell)


@FUZZ
@given(data=matrices() | yaml_values)
def test_fuzzed_matrices_load_or_fail_cleanly(tmp_path, data):
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(EXPERIMENT))
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(data))
    _loads_or_fails_cleanly(path)


@FUZZ
@given(text=st.text(max_size=80))
def test_fuzzed_matrix_text_loads_or_fails_cleanly(tmp_path, text):
    path = tmp_path / "m.yaml"
    path.write_text(text)
    _loads_or_fails_cleanly(path)


# -- the journal ----------------------------------------------------------------
def _record(index: int) -> dict:
    key = RunKey.of(variant="aa@f00", mask=["bwd:layers.1->layers.0"], guard="none", steps=8,
                    index=index)
    return {"v": 1, "run_id": f"000{index + 1}-aa", "outcome": "ok", "reason": "finished",
            "first_diff_step": None, "wall_s": float("nan"), **key.to_json()}


RECORDS = [_record(i) for i in range(3)]
WHOLE = "".join(json.dumps(r, sort_keys=True) + "\n" for r in RECORDS).encode()


@FUZZ
@given(data=st.binary(max_size=300))
def test_fuzzed_journal_bytes_read_or_fail_cleanly(tmp_path, data):
    journal = tmp_path / JOURNAL
    journal.write_bytes(data)
    try:
        read = read_journal(journal)
    except BisectPrefetchError as exc:
        assert "\n" not in str(exc)
        return
    assert all(isinstance(record, dict) for record in read.records)


@FUZZ
@given(data=st.binary(max_size=200), prefix=st.integers(0, 3))
def test_fuzzed_journal_in_a_state_dir_locks_or_fails_cleanly(tmp_path, data, prefix):
    state_dir = tmp_path / "state"
    (state_dir / "exp").mkdir(parents=True, exist_ok=True)
    journal = state_dir / "exp" / JOURNAL
    good = b"".join(json.dumps(r).encode() + b"\n" for r in RECORDS[:prefix])
    journal.write_bytes(good + data)
    try:
        with StateDir(state_dir, "exp") as state:
            assert len(state.records()) >= prefix
            # Whatever was there, the next record starts a line of its own.
            state.append(RunKey.of(variant="new", mask=None, guard="none", steps=1, index=0),
                         {"run_id": "x", "outcome": "ok", "reason": ""})
        with StateDir(state_dir, "exp") as state:
            assert state.find(RunKey.of(variant="new", mask=None, guard="none", steps=1,
                                        index=0))["run_id"] == "x"
    except BisectPrefetchError as exc:
        assert "\n" not in str(exc)
        # A refused journal is left as it was, and the state dir is not left locked.
        assert journal.read_bytes() == good + data
        assert _lock_is_free(state_dir / "exp" / LOCK)


def _lock_is_free(path) -> bool:
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def test_journal_cut_at_any_byte_keeps_every_whole_record(tmp_path):
    """A SIGKILL can stop the journal at any byte: every whole record before the cut survives."""
    journal = tmp_path / JOURNAL
    for cut in range(len(WHOLE) + 1):
        journal.write_bytes(WHOLE[:cut])
        read = read_journal(journal)
        # A cut right after a record's closing brace keeps it: only its newline is missing.
        ends_whole = WHOLE[cut - 1:cut] == b"}"
        expected = WHOLE[:cut].count(b"\n") + ends_whole
        assert [r["index"] for r in read.records] == list(range(expected)), cut
        mid_line = cut > 0 and WHOLE[cut - 1:cut] not in (b"\n", b"}")
        assert (read.torn_line is not None) == mid_line, cut
