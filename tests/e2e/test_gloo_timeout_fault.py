"""Fault attribution on a real 2-process torch.distributed gloo job through `aa`: one rank
never joins the collective, and the gloo timeout line of the other rank is what the journal,
the printed run line and the report name; no process outlives the command. The signature
table over lines as the tools print them: tests/runs/test_faults.py."""

from __future__ import annotations

import json
import sys
import textwrap

from bisect_prefetch.cli import main
from bisect_prefetch.report.html import build_report
from tests.conftest import NAME, job_processes, write_experiment

GLOO_JOB = """
import datetime, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3))
rank = dist.get_rank()
print(f"rank {rank} joined", flush=True)
if rank == 1:
    time.sleep(8)  # never joins the collective; outlives rank 0's timeout
else:
    dist.all_reduce(torch.ones(1))
"""


def test_a_gloo_timeout_is_attributed_to_its_line_and_rank(tmp_path, capsys):
    script = tmp_path / "gloo_job.py"
    script.write_text(textwrap.dedent(GLOO_JOB))
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
            "--master_addr=127.0.0.1", "--master_port={port}", str(script)]
    experiment = write_experiment(tmp_path, argv, steps=4, timeout_s=120)
    out = tmp_path / "aa.json"
    code = main(["aa", str(experiment), "--state-dir", str(tmp_path / "state"), "--mask",
                 "all-off", "--json", str(out)])
    assert code == 2  # no usable run: no verdict
    result = json.loads(out.read_text())
    assert result["outcomes"]["error"] == 2
    for run in result["run_details"]:
        fault = run["fault"]
        assert (fault["kind"], fault["rank"], fault["file"]) == ("gloo-timeout", 0, "stderr.log")
        run_dir = tmp_path / "state" / NAME / "runs" / run["run_id"]
        lines = (run_dir / "stderr.log").read_text().splitlines()
        assert lines[fault["line_no"] - 1].strip() == fault["line"]
        assert "Timed out waiting 3000ms" in fault["line"]
    journal = [json.loads(line) for line in
               (tmp_path / "state" / NAME / "journal.jsonl").read_text().splitlines()]
    assert [r["fault"]["kind"] for r in journal if "fault" in r] == ["gloo-timeout"] * 2
    printed = capsys.readouterr().out
    assert "fault gloo-timeout on rank 0 (stderr.log:" in printed
    page = build_report(tmp_path / "state" / NAME).read_text()
    assert "gloo-timeout on rank 0 (stderr.log:" in page
    assert job_processes(str(tmp_path / "state")) == []
