"""Gradient digests: what one covers (adapters/digest.py), and comparing two runs' digests."""

from __future__ import annotations

import json
import random
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from bisect_prefetch.adapters import digest as digest_format
from bisect_prefetch.metrics import digests
from bisect_prefetch.metrics.digests import (
    DigestRecord,
    compare_digest_files,
    compare_digests,
    format_digest_line,
    parse_digest_line,
    read_digests,
)

PARAMS = ("embedding.weight", "layers.0.wq.weight", "layers.1.wq.weight", "output.weight")


def run(steps: int = 6, ranks: int = 2, changed=lambda d: False) -> list[DigestRecord]:
    out = []
    for step in range(1, steps + 1):
        for rank in range(ranks):
            for param in PARAMS:
                d = DigestRecord(step, rank, param, f"{hash((step, rank, param)) & 0xFFFF:04x}")
                out.append(d._replace(digest=d.digest + "x") if changed(d) else d)
    return out


def spreading(d: DigestRecord) -> bool:
    # One parameter on two ranks at step 3, one more at step 4, everything from step 5.
    return (d.step == 3 and d.param == "layers.1.wq.weight") or (
        d.step == 4 and d.param in ("layers.1.wq.weight", "layers.0.wq.weight")) or d.step >= 5


def test_first_step_pairs_and_spread():
    result = compare_digests(run(), run(changed=spreading), metric_first_diff=5)
    assert result.first_diff_step == 3
    assert result.at_first == [(0, "layers.1.wq.weight"), (1, "layers.1.wq.weight")]
    assert result.spread == {3: 2, 4: 4, 5: 8, 6: 8}
    assert result.records_differing == 22 and result.records_compared == 48
    assert result.lead_steps == 2 and result.missing_in_a == result.missing_in_b == 0
    out = result.to_json()
    assert out["at_first"][0] == {"rank": 0, "param": "layers.1.wq.weight"} and out["spread"]["3"] == 2


def test_identical_runs_have_no_difference():
    result = compare_digests(run(), run())
    assert result.first_diff_step is None and result.at_first == [] and result.spread == {}
    assert result.lead_steps is None and result.records_compared == 48


def test_order_does_not_matter():
    b = run(changed=spreading)
    random.Random(3).shuffle(b)
    assert compare_digests(run(), b) == compare_digests(run(), run(changed=spreading))


def test_missing_records_when_a_run_stopped_early():
    b = [d for d in run(changed=spreading) if d.step <= 4 and not (d.step == 2 and d.rank == 1)]
    result = compare_digests(run(), b)
    assert result.missing_in_b == 4 + 16 and result.missing_in_a == 0
    assert result.first_diff_step == 3 and result.spread == {3: 2, 4: 4}


def test_records_as_dicts_and_tuples():
    a = [{"step": 1, "rank": 0, "param": "w", "digest": "1"}, (2, 0, "w", "2")]
    b = [{"step": 1, "rank": 0, "param": "w", "digest": "1"}, DigestRecord(2, 0, "w", "3"), "junk"]
    result = compare_digests(a, b)
    assert result.first_diff_step == 2 and result.lines_unread == (0, 1)


def write(path, records, *, style=None):
    lines = [format_digest_line(r) if style is None else style(r) for r in records]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_files_match_records_and_other_formatting_is_not_a_difference(tmp_path):
    a = write(tmp_path / "a.jsonl", run())
    compact = write(tmp_path / "b.jsonl", run(), style=lambda r: json.dumps(r._asdict(), separators=(",", ":")))
    assert compare_digest_files(a, compact).first_diff_step is None
    b = write(tmp_path / "c.jsonl", run(changed=spreading))
    with open(b, "a") as f:
        f.write("not a record\n\n")
    result = compare_digest_files(a, b, metric_first_diff=6)
    assert result.first_diff_step == 3 and result.spread == compare_digests(run(), run(changed=spreading)).spread
    assert result.lines_unread == (0, 1) and result.lead_steps == 3
    assert list(read_digests(b))[:2] == run(changed=spreading)[:2]


def test_parse_digest_line():
    assert parse_digest_line(b'{"step": 1, "rank": 2, "param": "w", "digest": "ab"}\n') == DigestRecord(1, 2, "w", "ab")
    assert parse_digest_line('{"rank": 2, "step": 1, "param": "w", "digest": "ab"}') == DigestRecord(1, 2, "w", "ab")
    assert parse_digest_line('{"step": 1, "rank": 2, "param": "w"}') is None
    assert parse_digest_line("{") is None


@settings(max_examples=50, deadline=None)
@given(
    changes=st.sets(st.integers(0, 47), max_size=10),
    drop=st.sets(st.integers(0, 47), max_size=5),
    seed=st.integers(0, 100),
)
def test_matches_a_plain_dictionary_comparison(changes, drop, seed):
    a = run()
    b = [d._replace(digest="zz") if i in changes else d for i, d in enumerate(a) if i not in drop]
    random.Random(seed).shuffle(b)
    result = compare_digests(a, b)
    da, db = {d[:3]: d.digest for d in a}, {d[:3]: d.digest for d in b}
    differing = [k for k in da if k in db and da[k] != db[k]]
    assert result.records_differing == len(differing)
    assert result.first_diff_step == (min(k[0] for k in differing) if differing else None)
    assert result.missing_in_b == len(drop)


def test_escaped_parameter_names(tmp_path):
    odd = ['a\\b', 'say "hi"', "ünïcode"]
    a = [DigestRecord(1, 0, p, "1") for p in odd]
    b = [DigestRecord(1, 0, p, "2") for p in odd]
    assert [parse_digest_line(format_digest_line(r)) for r in a] == a
    result = compare_digest_files(write(tmp_path / "a.jsonl", a), write(tmp_path / "b.jsonl", b))
    assert result.at_first == sorted((0, p) for p in odd) and result.lines_unread == (0, 0)


@settings(max_examples=60, deadline=None)
@given(
    changes=st.sets(st.integers(0, 47), max_size=6),
    keep_a=st.integers(0, 48),
    keep_b=st.integers(0, 48),
    newline_a=st.booleans(),
    newline_b=st.booleans(),
    block=st.sampled_from([7, 64, 1 << 20]),
)
def test_files_agree_with_records(tmp_path_factory, changes, keep_a, keep_b, newline_a, newline_b, block):
    # Runs stopped at any record, last line with or without its newline, identical prefixes
    # compared in blocks of any size: the file walk must agree with the record comparison.
    a = run()[:keep_a]
    b = [d._replace(digest="zz") if i in changes else d for i, d in enumerate(run())][:keep_b]
    tmp = tmp_path_factory.mktemp("files")
    paths = []
    for name, records, newline in (("a", a, newline_a), ("b", b, newline_b)):
        text = "\n".join(format_digest_line(r) for r in records) + ("\n" if newline and records else "")
        paths.append(tmp / f"{name}.jsonl")
        paths[-1].write_text(text)
    old = digests.CHUNK_BYTES
    digests.CHUNK_BYTES = block
    try:
        from_files = compare_digest_files(*paths)
    finally:
        digests.CHUNK_BYTES = old
    # unpaired leaves out what one file has after the other ended (the file walk counts
    # that part without matching it); every count agrees.
    assert replace(from_files, unpaired=None) == replace(compare_digests(a, b), unpaired=None)


# -- how a digest is spelled (adapters/digest.py, shared by the framework adapters) ----------
def test_weights_are_odd_and_a_digest_is_both_sums_modulo_2_64():
    for bits in (32, 64):
        weights = [digest_format.weight(i, bits) for i in range(1000)]
        assert all(w % 2 == 1 and 0 < w < 1 << bits for w in weights)
        assert len(set(weights)) == len(weights)
    assert digest_format.spell(-1, 1) == "f" * 16 + "0" * 15 + "1"
    assert len(digest_format.spell(3, -5)) == 32


def test_a_line_over_the_limit_is_read_past_never_held(tmp_path):
    import tracemalloc

    a = write(tmp_path / "a.jsonl", run())
    lines = a.read_bytes().splitlines(keepends=True)
    b = tmp_path / "b.jsonl"
    b.write_bytes(b"".join(lines[:5]) + b"x" * (24 << 20) + b"\n" + b"".join(lines[5:]))
    tracemalloc.start()
    try:
        result = compare_digest_files(a, b)
        records = list(read_digests(b))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.first_diff_step is None and result.lines_unread == (0, 1)
    assert records == run()
    assert peak < 8 << 20, f"peak {peak / 2**20:.1f} MiB for a 24 MiB line"
