"""Log parsers on real-format lines, run directories, and fuzzed garbage."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.metrics import console
from bisect_prefetch.metrics.lines import parse_jsonl_line
from bisect_prefetch.metrics.loading import (
    detect_format,
    load_files,
    load_run,
    load_runs,
    parse_file,
    run_files,
)
from bisect_prefetch.metrics.trajectory import Series
from tests.conftest import trajectory

FILE_PREFIX = "[INFO] 2026-01-01 10:00:00,123 [mindformers/core/callback/callback.py:532] _print_log: "
STDOUT_PREFIX = "2026-01-01 10:00:00,123 - mindformers[mindformers/core/callback/callback.py:532] - INFO - "


def mf_line(step, loss="11.854254", grad="13.831877", *, prefix=FILE_PREFIX, extra="", consumed=True):
    consumed_field = f"consumed_samples: {2 * step}, " if consumed else ""
    return (
        f"{prefix}{{ step:[{step:5d}/   10], {consumed_field}global_batch_size: 2, loss: {loss:>10}, "
        f"per_step_time:   710ms, {extra}lr: 1.000000e-05, grad_norm: {grad:>10}, throughput:  25.92T }}"
    )


def write(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def count_lines(data: bytes) -> int:
    """Lines as the parsers count them: a final newline does not start another line."""
    return len(data.split(b"\n")) - (1 if data.endswith(b"\n") else 0)


def records(path, fmt, **kw):
    return list(parse_file(path, fmt, **kw).records())


# --------------------------------------------------------------------------- mindformers


def test_mindformers_both_logger_prefixes(tmp_path):
    lines = [
        "[INFO] 2026-01-01 09:59:59,000 [mindformers/trainer/base_trainer.py:100] building the network",
        mf_line(1, "11.854254", "13.831877"),
        mf_line(2, "10.000001", "12.5", prefix=STDOUT_PREFIX),
    ]
    result = parse_file(write(tmp_path / "a.log", lines), "mindformers")
    assert list(result.records()) == [
        (0, 1, {"loss": 11.854254, "grad_norm": 13.831877}),
        (0, 2, {"loss": 10.000001, "grad_norm": 12.5}),
    ]
    assert (result.lines_read, result.lines_unread, result.lines_skipped) == (2, 0, 1)


def test_mindformers_older_build_without_consumed_samples(tmp_path):
    path = write(tmp_path / "a.log", [mf_line(s, consumed=False) for s in (1, 2, 3)])
    assert [step for _, step, _ in records(path, "mindformers")] == [1, 2, 3]


def test_optional_loss_fields_are_not_the_loss(tmp_path):
    # Optional *_loss fields, one of them before `loss`, and a line whose loss is N/A:
    # matching `loss` anywhere but as a whole word would pick the wrong number.
    extra = "load_balancing_loss:   1.093977, indexer_loss: 0.25, mtp_1_loss: 7.5, "
    before = f"{FILE_PREFIX}{{ step:[    2/   10], mtp_1_loss: 7.25, loss:   3.5, grad_norm: 1.0 }}"
    lines = [mf_line(1, "11.854254", extra=extra), before, mf_line(3, "N/A (no loss on this stage)", extra=extra)]
    path = write(tmp_path / "a.log", lines)
    got = {step: m for _, step, m in records(path, "mindformers", names=["loss", "mtp_1_loss", "load_balancing_loss"])}
    assert got[1] == {"loss": 11.854254, "mtp_1_loss": 7.5, "load_balancing_loss": 1.093977}
    assert got[2] == {"loss": 3.5, "mtp_1_loss": 7.25}
    assert got[3] == {"mtp_1_loss": 7.5, "load_balancing_loss": 1.093977}


def test_nan_grad_norm_is_a_value(tmp_path):
    path = write(tmp_path / "a.log", [mf_line(1, grad="NaN"), mf_line(2, grad="nan"), mf_line(3, grad="inf")])
    s = parse_file(path, "mindformers").series[0]["grad_norm"]
    assert math.isnan(s[1]) and math.isnan(s[2]) and s[3] == math.inf


def test_na_loss_lines_and_metrics_rank(tmp_path):
    # Pipeline stage 0 (ranks 0-1) prints `loss: N/A (...)`; the last stage (ranks 2-3) the loss.
    log = tmp_path / "output" / "msrun_log"
    for rank in range(4):
        loss = (lambda s: "N/A (not the last pipeline stage)") if rank < 2 else (lambda s, r=rank: f"{s + r / 10:.6f}")
        write(log / f"worker_{rank}.log", [mf_line(s, loss(s), f"{s:.6f}") for s in (1, 2, 3)])
    traj = load_run(tmp_path)
    assert traj.metrics_rank == 2
    assert traj.series_rank == {"loss": 2, "grad_norm": 2}
    assert dict(traj["loss"]) == {1: 1.2, 2: 2.2, 3: 3.2}
    assert sorted(traj.per_rank) == [0, 1, 2, 3]
    assert "loss" not in traj.per_rank[0] and dict(traj.per_rank[3]["loss"]) == {1: 1.3, 2: 2.3, 3: 3.3}
    stage0 = parse_file(log / "worker_0.log", "mindformers")
    assert stage0.values_not_numeric == 3 and stage0.lines_unread == 0 and stage0.lines_read == 3


def test_worker_log_rank_comes_from_its_name(tmp_path):
    path = write(tmp_path / "worker_5.log", [mf_line(1)])
    assert [r for r, _, _ in records(path, "mindformers")] == [5]
    assert [r for r, _, _ in records(path, "mindformers", rank=2)] == [2]


def test_truncated_and_garbled_lines_are_counted_not_guessed(tmp_path):
    full = mf_line(2)
    lines = [mf_line(1), full[: full.index("consumed")], "{ step:[ abc/10], loss: 1.0", mf_line(3)]
    result = parse_file(write(tmp_path / "a.log", lines), "mindformers")
    assert [s for _, s, _ in result.records()] == [1, 3]
    assert result.lines_unread == 2 and result.lines_read == 2
    assert [n for n, _ in result.unread_samples] == [2, 3]


# MindFormers 1.9's loss callback, as run on CPU: step loss / running mean, global_norm an array.
MF19_STDOUT = "2026-01-01 10:00:00,123 - mindformers - INFO - "
MF19_FILE = "[INFO] 2026-01-01 10:00:00,123 [mindformers/core/callback/callback.py:361] print_output_info: "


def mf19_line(step, loss="5.549648", mean="5.542563", norm="1.4394261", *, epoch=1, epochs=1, per_epoch=10,
              prefix=MF19_STDOUT, sink=False):
    loss_field = f"loss: {loss}, " if sink else f"loss:[{loss}/{mean}], "
    return (
        f"{prefix}{{ Epoch:[{epoch:3d}/{epochs:3d}], step:[{step:5d}/{per_epoch:5d}], {loss_field}"
        f"per_step_time: 28ms, lr: 0.0009054635, overflow cond: False, loss_scale: 1.0, global_norm: [{norm}], "
        "train_throughput_per_npu: 0.012T"
    )


def test_mindformers_19_step_loss_and_global_norm(tmp_path):
    lines = [
        mf19_line(1, "5.548586", "5.548586", "1.4357147"),
        f"{MF19_STDOUT}  10.0% |█████                                             | 71.42857 samples/s/p  0:00:00 }}",
        mf19_line(2, "5.536478", "5.542532", "1.4294261"),
    ]
    path = write(tmp_path / "stdout.log", lines)
    assert detect_format(path) == "mindformers"
    for fast in (True, False):
        result = parse_file(path, "mindformers", fast=fast)
        assert list(result.records()) == [
            (0, 1, {"loss": 5.548586, "grad_norm": 1.4357147}),
            (0, 2, {"loss": 5.536478, "grad_norm": 1.4294261}),
        ]
        assert (result.lines_read, result.lines_unread, result.values_not_numeric) == (2, 0, 0)


def test_mindformers_sink_mode_and_info_log_prefix(tmp_path):
    sink = write(tmp_path / "sink.log", [mf19_line(s, f"{s}.5", sink=True, prefix=MF19_FILE) for s in (1, 2)])
    assert [(step, m["loss"]) for _, step, m in records(sink, "mindformers")] == [(1, 1.5), (2, 2.5)]


def test_mindformers_epochs_count_on_from_the_last_epoch(tmp_path, monkeypatch):
    lines = [mf19_line(s, f"{e}.{s}", epoch=e, epochs=2, per_epoch=3) for e in (1, 2) for s in (1, 2, 3)]
    path = write(tmp_path / "a.log", lines)
    # One chunk holding both epochs, and chunks of a line or two (one epoch each).
    for chunk in (console.CHUNK_BYTES, len(lines[0]) + 1, 2 * len(lines[0]) + 2):
        monkeypatch.setattr(console, "CHUNK_BYTES", chunk)
        for fast in (True, False):
            got = [(step, m["loss"]) for _, step, m in records(path, "mindformers", fast=fast)]
            assert got == [(1, 1.1), (2, 1.2), (3, 1.3), (4, 2.1), (5, 2.2), (6, 2.3)]


def test_mindformers_rank_logs_and_interleaved_ranks(tmp_path):
    # MindFormers writes log/rank_<rank>/info.log; msrun --join interleaves all ranks in stdout.
    for rank in (0, 1):
        write(tmp_path / "output" / "log" / f"rank_{rank}" / "info.log",
              [mf19_line(s, f"{s}.{rank}", prefix=MF19_FILE) for s in (1, 2)])
    traj = load_run(tmp_path)
    assert traj.ranks == [0, 1] and dict(traj.per_rank[1]["loss"]) == {1: 1.1, 2: 2.1}
    interleaved = write(tmp_path / "stdout.log", [mf19_line(s, f"{s}.{r}") for s in (1, 2) for r in (0, 1)])
    result = parse_file(interleaved, "mindformers")
    assert result.steps_repeated == 4  # loss and grad_norm of steps 1 and 2: said, not hidden


# --------------------------------------------------------------------------- torchtitan, megatron


def test_torchtitan_with_ansi_colours(tmp_path):
    line = (
        "[rank0]:[titan] 2025-01-01 10:00:00,000 - root - INFO - "
        "\x1b[31mstep:  {s}  \x1b[32mloss: {l}  \x1b[38;2;180;60;0mgrad_norm: {g}  "
        "\x1b[33mmemory: 10.52GiB(11.07%)  \x1b[34mtps: 1,234  \x1b[36mtflops: 56.78  \x1b[35mmfu: 12.34%\x1b[39m"
    )
    lines = [line.format(s=1, l="12.2345", g="3.4567"), line.format(s=2, l="11.0000", g="nan"),
             "[rank0]:[titan] 2025-01-01 10:00:00,000 - root - INFO - Training starts at step 1"]
    path = write(tmp_path / "t.log", lines)
    assert detect_format(path) == "torchtitan"
    got = records(path, "torchtitan")
    assert got[0] == (0, 1, {"loss": 12.2345, "grad_norm": 3.4567})
    assert got[1][1] == 2 and got[1][2]["loss"] == 11.0 and math.isnan(got[1][2]["grad_norm"])


def test_megatron_lm_loss_and_grad_norm(tmp_path):
    line = (
        " [2024-05-01 10:00:00] iteration {i:8d}/     100 | consumed samples:           {c} | "
        "elapsed time per iteration (ms): 1234.5 | learning rate: 1.000000E-05 | global batch size:     8 | "
        "lm loss: {l} | loss scale: 1.0 | grad norm: {g} | number of skipped iterations:   0 | "
        "number of nan iterations:   0 |"
    )
    lines = [line.format(i=1, c=8, l="1.034567E+01", g="2.345"), line.format(i=2, c=16, l="9.876543E+00", g="2.100")]
    path = write(tmp_path / "m.log", lines)
    assert detect_format(path) == "megatron"
    assert records(path, "megatron") == [
        (0, 1, {"loss": 10.34567, "grad_norm": 2.345}),
        (0, 2, {"loss": 9.876543, "grad_norm": 2.1}),
    ]
    assert records(path, "megatron", names=["loss_scale"])[0][2] == {"loss_scale": 1.0}


# --------------------------------------------------------------------------- jsonl, regex


def test_jsonl_full_precision_nan_and_infinity(tmp_path):
    values = [0.1 + 0.2, float("nan"), float("inf"), -0.0]
    lines = [json.dumps({"step": i + 1, "rank": 1, "loss": v, "grad_norm": 1.5}) for i, v in enumerate(values)]
    lines += ['{"event": "start"}', "not json", '{"step": 9, "rank": 1, "loss": "n/a"}']
    result = parse_file(write(tmp_path / "metrics.jsonl", lines), "jsonl", names=["loss"])
    loss = result.series[1]["loss"]
    assert loss[1] == 0.30000000000000004 and math.isnan(loss[2]) and loss[3] == math.inf
    assert math.copysign(1.0, loss[4]) == -1.0
    assert result.lines_read == 4 and result.lines_unread == 3 and result.values_not_numeric == 1


def test_parse_jsonl_line():
    assert parse_jsonl_line('{"step": 3, "rank": 0, "loss": NaN, "tag": "x"}')[1] == 3
    assert parse_jsonl_line(b'{"step": 3, "loss": Infinity}') == (0, 3, {"loss": math.inf})
    assert parse_jsonl_line('{"step": true, "loss": 1}') is None
    assert parse_jsonl_line('{"step": 3, "loss": 1') is None


def test_regex_format(tmp_path):
    path = write(tmp_path / "r.log", ["it=1 L=2.5 gn=0.5", "it=2 L=2.25 gn=nan", "noise", "it=3 L=oops gn=1"])
    pattern = r"it=(?P<step>\d+) L=(?P<loss>\S+) gn=(?P<grad_norm>\S+)"
    result = parse_file(path, "regex", pattern=pattern)
    assert dict(result.series[0]["loss"]) == {1: 2.5, 2: 2.25}
    assert dict(result.series[0]["grad_norm"])[3] == 1.0
    assert result.values_not_numeric == 1 and result.lines_skipped == 1
    with pytest.raises(BisectPrefetchError, match="step"):
        parse_file(path, "regex", pattern=r"L=(?P<loss>\S+)")


def test_a_regex_ending_in_dollar_reads_crlf_lines(tmp_path):
    path = tmp_path / "crlf.log"
    path.write_bytes(b"step 1 loss 2.5\r\nstep 2 loss 2.25\r\n")
    result = parse_file(path, "regex", pattern=r"step (?P<step>\d+) loss (?P<loss>\S+)$")
    assert dict(result.series[0]["loss"]) == {1: 2.5, 2: 2.25}


def test_no_metrics_names_the_file_and_format(tmp_path):
    path = write(tmp_path / "empty.log", ["hello", "world"])
    with pytest.raises(BisectPrefetchError, match=r"empty\.log.*mindformers"):
        parse_file(path, "mindformers")
    with pytest.raises(BisectPrefetchError, match="cannot tell"):
        detect_format(path)
    with pytest.raises(BisectPrefetchError, match="unknown metrics format"):
        parse_file(path, "csv")


def test_detect_format(tmp_path):
    assert detect_format(write(tmp_path / "a.log", ["banner", mf_line(1)])) == "mindformers"
    assert detect_format(write(tmp_path / "m.jsonl", ['{"step": 1, "loss": 2.0}'])) == "jsonl"


# --------------------------------------------------------------------------- run directories


def test_load_run_directory_kinds(tmp_path):
    jsonl_run = tmp_path / "j"
    write(jsonl_run / "metrics.jsonl", [json.dumps({"step": s, "rank": r, "loss": s + r}) for s in (1, 2) for r in (0, 1)])
    write(jsonl_run / "stdout.log", [mf_line(1)])  # metrics.jsonl is preferred
    traj = load_run(jsonl_run)
    assert traj.metrics_rank == 0 and dict(traj["loss"]) == {1: 1.0, 2: 2.0}
    assert dict(traj.per_rank[1]["loss"]) == {1: 2.0, 2: 3.0}
    assert dict(load_run(jsonl_run, "mindformers")["loss"]) == {1: 11.854254}

    stdout_run = tmp_path / "s"
    write(stdout_run / "stdout.log", [mf_line(1), mf_line(2)])
    assert list(load_run(stdout_run)["grad_norm"]) == [1, 2]

    nothing = tmp_path / "nothing"
    nothing.mkdir()
    with pytest.raises(BisectPrefetchError, match="no metrics in run directory"):
        load_run(nothing)


def test_torchruns_per_rank_logs_are_read_per_rank_last_attempt_only(tmp_path):
    # torchrun --log-dir {rank_log_dir} --redirects 3: <run id>/attempt_<n>/<local rank>/stdout.log
    logs = tmp_path / "rank_logs" / "none_abc123"
    for attempt, scale in ((0, 100.0), (1, 1.0)):  # an elastic restart: the last attempt counts
        for rank in (0, 1):
            write(logs / f"attempt_{attempt}" / str(rank) / "stdout.log",
                  [f"step: {s}  loss: {scale * (s + rank / 10):.4f}  grad_norm: 1.0000" for s in (1, 2)])
            write(logs / f"attempt_{attempt}" / str(rank) / "stderr.log", ["warnings"])
    write(tmp_path / "stdout.log", ["[W] the agent's own lines"])
    files = run_files(tmp_path, "torchtitan")
    assert [f.relative_to(logs).as_posix() for f in files] == ["attempt_1/0/stdout.log",
                                                                "attempt_1/1/stdout.log"]
    traj = load_run(tmp_path, "torchtitan")
    assert dict(traj.per_rank[1]["loss"]) == {1: 1.1, 2: 2.1} and dict(traj["loss"]) == {1: 1.0, 2: 2.0}


def test_parallel_parsing_matches_serial(tmp_path):
    for rank in range(3):
        write(tmp_path / f"worker_{rank}.log", [mf_line(s, f"{s * (rank + 1):.6f}") for s in range(1, 50)])
    files = sorted(tmp_path.glob("worker_*.log"))
    serial, parallel = load_files(files, workers=1), load_files(files, workers=2)
    assert serial.ranks == parallel.ranks == [0, 1, 2]
    for rank in serial.ranks:
        for name, s in serial.per_rank[rank].items():
            assert dict(parallel.per_rank[rank][name]) == dict(s)


def test_runs_parsed_together_match_each_run_parsed_alone(tmp_path):
    # compare parses both runs' files in one pool; each run keeps its own files and format.
    for rank in range(2):
        write(tmp_path / "a" / f"worker_{rank}.log", [mf19_line(s, f"{s}.{rank}") for s in range(1, 30)])
    write(tmp_path / "b" / "metrics.jsonl", [json.dumps({"step": s, "rank": 1, "loss": s / 3}) for s in range(1, 20)])
    together = load_runs([tmp_path / "a", tmp_path / "b"], workers=2)
    alone = [load_run(tmp_path / "a", workers=1), load_run(tmp_path / "b", workers=1)]
    for t, a in zip(together, alone, strict=True):
        assert t.ranks == a.ranks and t.sources == a.sources and t.lines_read == a.lines_read
        for rank in a.ranks:
            assert {n: dict(s) for n, s in t.per_rank[rank].items()} == {n: dict(s) for n, s in a.per_rank[rank].items()}
    assert together[0].ranks == [0, 1] and together[1].ranks == [1]


def test_series_repeated_step_keeps_last_value():
    s = Series([1, 2, 3, 2], [1.0, 2.0, 3.0, 20.0])
    assert dict(s) == {1: 1.0, 2: 20.0, 3: 3.0}
    with pytest.raises(KeyError):
        s[4]
    t = trajectory([(0, 1, {"loss": 1.0}), (1, 1, {"loss": 2.0, "grad_norm": 3.0})])
    assert t.metrics_rank == 0 and t.series_rank == {"loss": 0, "grad_norm": 1}


# --------------------------------------------------------------------------- fuzzing

VALID = st.one_of(
    st.builds(
        lambda step, loss, grad, prefix: mf_line(step, loss, grad, prefix=prefix),
        st.integers(0, 10**6),
        st.sampled_from(["11.854254", "N/A (not the last stage)", "NaN", "-0.5", "1e-3"]),
        st.sampled_from(["13.831877", "NaN", "inf", "0"]),
        st.sampled_from([FILE_PREFIX, STDOUT_PREFIX, ""]),
    ),
    st.builds(
        lambda step, epoch, loss, norm, prefix, sink: mf19_line(
            step, loss, loss, norm, epoch=epoch, epochs=3, per_epoch=1000, prefix=prefix, sink=sink),
        st.integers(0, 10**6),
        st.integers(0, 3),
        st.sampled_from(["5.549648", "nan", "-0.5"]),
        st.sampled_from(["1.4394261", "nan", "None"]),
        st.sampled_from([MF19_FILE, MF19_STDOUT, ""]),
        st.booleans(),
    ),
)
GARBAGE = st.one_of(
    st.text(alphabet=st.characters(blacklist_characters="\n\r", blacklist_categories=("Cs",)), max_size=80),
    VALID.flatmap(lambda line: st.integers(0, len(line)).map(lambda cut: line[:cut])),
    st.sampled_from(["step:[", "{ step:[  7/10], loss: ", "step:[ 3/10] step:[ 4/10], loss: 1.0", "\x00\xff loss: 1",
                     "Epoch:[ 2/ 3], step:[ 4/ 5] Epoch:[ 1/ 1], step:[ 5/ 9], global_norm: [2]",
                     "step:[ 4/ 5], Epoch:[ 2/ 3], step:[ 5/ 9], loss:[1/2]", "{ Epoch:[  2/  2], step:[ x/ 5], loss: 1"]),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(st.one_of(VALID, GARBAGE), min_size=1, max_size=40), chunk=st.sampled_from([64, 300, 1 << 20]))
def test_fuzz_fast_path_equals_line_by_line_and_counts_every_line(tmp_path_factory, monkeypatch, lines, chunk):
    path = tmp_path_factory.mktemp("fuzz") / "worker_0.log"
    path.write_bytes("\n".join(lines).encode())
    monkeypatch.setattr(console, "CHUNK_BYTES", chunk)
    outcomes = []
    for fast in (True, False):
        try:
            r = parse_file(path, "mindformers", fast=fast)
        except BisectPrefetchError as e:
            outcomes.append(("error", str(e)))
            continue
        n_lines = count_lines(path.read_bytes())
        assert r.lines_read + r.lines_unread + r.lines_skipped == n_lines
        outcomes.append((list(r.records()), r.lines_read, r.lines_unread, r.lines_skipped, r.values_not_numeric))
    assert repr(outcomes[0]) == repr(outcomes[1])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=400), fmt=st.sampled_from(["mindformers", "torchtitan", "megatron", "jsonl"]))
def test_fuzz_binary_garbage_never_crashes(tmp_path_factory, data, fmt):
    path = tmp_path_factory.mktemp("bin") / "x.log"
    path.write_bytes(data + b"\n" + mf_line(1).encode() + b"\n" + json.dumps({"step": 1, "loss": 1.0}).encode())
    try:
        r = parse_file(path, fmt)
    except BisectPrefetchError:
        return
    assert r.lines_read >= 1 and r.lines_read + r.lines_unread + r.lines_skipped == count_lines(path.read_bytes())


# -- memory per log line -------------------------------------------------
def _with_long_line(path: Path, before: list[str], after: list[str], *, size: int) -> Path:
    with open(path, "wb") as f:
        f.write(("\n".join(before) + "\n").encode())
        f.write(b"x" * size + b"\n")
        f.write(("\n".join(after) + "\n").encode())
    return path


def _peak_bytes(fn) -> tuple[object, int]:
    import tracemalloc

    tracemalloc.start()
    try:
        result = fn()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("fmt", ["jsonl", "mindformers", "regex"])
def test_a_line_over_the_limit_is_one_unread_line_never_held_whole(tmp_path, fmt):
    lines = {"jsonl": [json.dumps({"step": s, "loss": 1.0 + s}) for s in (1, 2, 3)],
             "mindformers": [mf_line(s) for s in (1, 2, 3)],
             "regex": [f"step {s} loss {1.0 + s}" for s in (1, 2, 3)]}[fmt]
    path = _with_long_line(tmp_path / "log", lines[:1], lines[1:], size=48 << 20)
    pattern = r"step (?P<step>\d+) loss (?P<loss>\S+)$"
    result, peak = _peak_bytes(lambda: parse_file(path, fmt, pattern=pattern))
    assert sorted(result.series[0]["loss"]) == [1, 2, 3]
    assert result.lines_unread == 1 and result.lines_read == 3
    assert peak < 8 << 20, f"peak {peak / 2**20:.1f} MiB for a 48 MiB line"


def test_format_detection_reads_past_long_lines(tmp_path):
    path = _with_long_line(tmp_path / "log", ["hello"], [json.dumps({"step": 1, "loss": 1.0})],
                           size=12 << 20)
    fmt, peak = _peak_bytes(lambda: detect_format(path))
    assert fmt == "jsonl" and peak < 8 << 20


def test_a_followed_log_never_holds_a_long_line(tmp_path):
    from bisect_prefetch.metrics.live import NewLines
    from bisect_prefetch.metrics.trajectory import LONG_LINE

    path = tmp_path / "log"
    path.write_bytes(b'{"step": 1}\n' + b"x" * (3 << 20))  # a long line still being written
    lines = NewLines(path)
    assert lines.read() == b'{"step": 1}\n' + LONG_LINE + b"\n"
    with open(path, "ab") as f:
        f.write(b"y" * (2 << 20) + b'\n{"step": 2}\n')
    block, peak = _peak_bytes(lines.read)
    assert block == b'{"step": 2}\n' and peak < 4 << 20
    assert lines.offset == path.stat().st_size


def test_the_printed_precision_reads_past_long_lines(tmp_path):
    from bisect_prefetch.metrics.precision import printed_precision

    lines = [json.dumps({"step": s, "loss": 1.25 + s}) for s in (1, 2, 3)]
    path = _with_long_line(tmp_path / "m.jsonl", lines[:1], lines[1:], size=48 << 20)
    said, peak = _peak_bytes(lambda: printed_precision([path], "jsonl", ["loss"], None))
    assert peak < 8 << 20 and said is not None
