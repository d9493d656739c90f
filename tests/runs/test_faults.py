"""Fault attribution: the log line of the rank that ended a failed run.

Unit tests run the signature table over lines as the tools print them; a real
2-process gloo job whose timeout line is named: tests/e2e/test_gloo_timeout_fault.py.
"""

from __future__ import annotations

import pytest

from bisect_prefetch.judge.faults import describe, find_fault, match_line

LINES = {
    "nccl-timeout": "[rank3]:[E1130 12:00:00.123456 1234 ProcessGroupNCCL.cpp:616] [Rank 3] "
                    "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, "
                    "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
                    "600012 milliseconds before timing out.",
    "hccl-timeout": "EI0002: [PID: 4021] 2024-05-01-10:00:00.000.000 The wait execution of the "
                    "Notify register times out. Reason: The HCCL execution times out.",
    "gloo-timeout": "[rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/"
                    "transport/tcp/unbound_buffer.cc:78] Timed out waiting 3000ms for recv "
                    "operation to complete",
    "cuda-oom": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 "
                "has a total capacity of 79.15 GiB of which 1.23 GiB is free.",
    "npu-oom": "RuntimeError: NPU out of memory. Tried to allocate 1.50 GiB (NPU 3; 60.97 GiB "
               "total capacity; 58.20 GiB already allocated)",
    "rendezvous-refused": "torch.distributed.DistNetworkError: The client socket has failed to "
                          "connect to [localhost]:29500 (errno: 111 - Connection refused).",
    "address-in-use": "torch.distributed.DistNetworkError: The server socket has failed to "
                      "listen on any local network address. port: 29500, useIpv6: false, "
                      "code: -98, name: EADDRINUSE, message: address already in use",
    "node-failure": "srun: error: Node failure on node-17",
    "signal": "traceback : Signal 9 (SIGKILL) received by PID 7066",
}


@pytest.mark.parametrize("kind", sorted(LINES))
def test_each_signature_names_its_kind(kind):
    assert match_line(LINES[kind]) == kind


@pytest.mark.parametrize("line", [
    "slurmstepd: error: *** JOB 12345 ON node-3 CANCELLED AT 2024-01-01T00:00:00 DUE TO NODE "
    "FAILURE ***",
    "MindSpore: Out of Memory!!! Request memory size: 1073741824B, Memory Statistic:",
    "E1130 12:00:00 api.py:1002] failed (exitcode: -9) local_rank: 1 (pid: 7066)",
])
def test_more_real_lines_are_faults(line):
    assert match_line(line) is not None


@pytest.mark.parametrize("line", [
    "{'step': 3, 'loss': 2.5, 'grad_norm': 1.1}",
    "export NCCL_TIMEOUT=1800 HCCL_CONNECT_TIMEOUT=1200",  # an environment dump
    "gloo process group initialised with 2 ranks",
    "timeout_s: 600",
])
def test_ordinary_lines_are_not_faults(line):
    assert match_line(line) is None


def test_the_most_telling_kind_wins_and_the_rank_comes_from_the_file(tmp_path):
    (tmp_path / "stderr.log").write_text("launching\nSignal 15 (SIGTERM) received by PID 9\n")
    ranks = tmp_path / "rank_logs"
    ranks.mkdir()
    (ranks / "worker_0.log").write_text("step 1\n")
    (ranks / "worker_1.log").write_text("step 1\nstep 2\n" + LINES["hccl-timeout"] + "\n")
    fault = find_fault(tmp_path, exit_code=1)
    assert fault == {"kind": "hccl-timeout", "rank": 1, "file": "rank_logs/worker_1.log",
                     "line_no": 3, "line": LINES["hccl-timeout"]}
    assert describe(fault).startswith("hccl-timeout on rank 1 (rank_logs/worker_1.log:3): EI0002")


def test_a_timeout_the_tool_caused_is_not_blamed_on_the_signal_it_sent(tmp_path):
    (tmp_path / "stderr.log").write_text("Signal 15 (SIGTERM) received by PID 9\n")
    assert find_fault(tmp_path, exit_code=-15, killed_by_us=True) is None
    assert find_fault(tmp_path, exit_code=-15)["kind"] == "signal"


def test_without_a_log_line_the_reason_or_the_exit_signal_is_the_fault(tmp_path):
    assert find_fault(tmp_path, reason="lost: Slurm state NODE_FAIL")["kind"] == "node-failure"
    assert find_fault(tmp_path, exit_code=-9) == {
        "kind": "signal", "rank": None, "file": None, "line_no": None,
        "line": "killed by signal 9"}
    assert find_fault(tmp_path, exit_code=1) is None


def test_in_a_huge_log_only_the_tail_is_read_and_line_numbers_stay_right(tmp_path, monkeypatch):
    import bisect_prefetch.judge.faults as faults

    monkeypatch.setattr(faults, "_MAX_BYTES", 4096)
    early = "srun: error: Node failure on node-1\n"  # before the tail: not read
    lines = [early] + [f"step {i}\n" for i in range(2000)] + [LINES["cuda-oom"] + "\n"]
    (tmp_path / "stdout.log").write_text("".join(lines))
    fault = find_fault(tmp_path, exit_code=1)
    assert (fault["kind"], fault["line_no"]) == ("cuda-oom", len(lines))


def test_the_matrix_markdown_lists_each_fault_after_the_table():
    from bisect_prefetch.report.markdown import _escape, matrix_markdown

    fault = {"kind": "nccl-timeout", "rank": 3, "file": "rank_logs/worker_3.log",
             "line_no": 812, "line": LINES["nccl-timeout"]}
    cell = {"name": "tp2", "verdict": "error", "expect": "consistent", "expectation_met": False,
            "first_diff_step": None, "runs": 2, "divergences": 0, "mask": [], "seconds": 1.0,
            "metrics": {}, "group": {"run_details": [
                {"run_id": "0003-matrix-k0", "outcome": "error", "fault": fault},
                {"run_id": "0004-matrix-k1", "outcome": "ok", "fault": None}]}}
    text = matrix_markdown({"matrix": "topology", "cells": [cell]})
    tail = text.split("Infrastructure faults (runs left out of every verdict):", 1)[1]
    # The log line is shown as text, never as markup (report/markdown.py escapes it).
    assert tail.strip().splitlines() == ["- " + _escape(
        "fault in 0003-matrix-k0: nccl-timeout on rank 3 (rank_logs/worker_3.log:812): "
        + LINES["nccl-timeout"])]


def test_on_a_terminal_a_failed_run_keeps_its_line_with_the_fault():
    import io

    from rich.console import Console

    from bisect_prefetch.report.progress import RunProgress

    out = io.StringIO()
    with RunProgress(Console(file=out, width=300, force_terminal=True)) as progress:
        progress.start_group("all-off", 2)
        progress.run_finished(1, "clean", 1.0)
        progress.run_finished(2, "error (exit code 1; fault gloo-timeout on rank 0 "
                                 "(stderr.log:13): Timed out)", 1.0)
    text = out.getvalue()
    assert "run 2/2 error (exit code 1; fault gloo-timeout on rank 0 (stderr.log:13)" in text
    assert "run 1/2 clean" not in text
