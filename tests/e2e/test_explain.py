"""`explain` as users meet it, on jobs that import nothing of ours:

- a user's FSDP2 job whose drift is not prefetch (tests/jobs/noisy_layer_job.py: one layer's
  forward adds noise from a clock-seeded generator from step 3 on): with every edge off, the
  traced A/A pair names that random op in that layer's forward at step 3, kind origin, on
  every rank, tied to no edge (none was on);
- a user's 2-D tensor-parallel x FSDP2 job (tests/jobs/tp_fsdp2_job.py: DTensor weights,
  functional collectives, shard groups of size one) with its own fault inside one backward
  prefetch: explain of that edge alone (keep-only, as `bisect --explain` traces a cause)
  traces only its two units and shows the first divergence in backward, in the edge's
  units, tied to the edge, with what tracing cost against untraced steps of the same runs;
- the tool failing inside a traced job (here: its trace cannot be written, the job's file
  size limit reached): exit 3, the tool's failure and the rank's log, not the input's;
- the MindSpore reference workload on 2 ranks under msrun, which does not drift (on the
  static graph its discovery finds): traced at Cell granularity, backward too (Cell
  backward hooks), nothing to explain, exit 0.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bisect_prefetch.cli import main

pytest.importorskip("torch")
JOBS = Path(__file__).resolve().parents[1] / "jobs"


def torchrun(job: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            str(JOBS / job), "--steps", "{steps}", *args]


def write_experiment(path: Path, name: str, argv: list[str], steps: int, extra: str = "") -> Path:
    path.write_text(textwrap.dedent(f"""
        name: {name}
        command: {json.dumps(argv)}
        metrics: {{format: torchtitan, names: [loss, grad_norm]}}
        graph: {{source: runtime}}
        steps: {steps}
        timeout_s: 180
    """) + extra)
    return path


def test_explain_names_the_random_op_in_the_noisy_layer_at_step_3(tmp_path, capsys):
    experiment = write_experiment(tmp_path / "noisy.yaml", "noisy",
                                  torchrun("noisy_layer_job.py"), 3)
    out = tmp_path / "explain.json"
    code = main(["explain", str(experiment), "--mask", "all-off", "--steps", "2-3",
                 "--state-dir", str(tmp_path / "state"), "--json", str(out)])
    text = capsys.readouterr().out
    assert code == 1, text
    result = json.loads(out.read_text())
    assert result["verdict"] == "explained" and result["mask"] == []
    first = result["first"]
    assert (first["step"], first["phase"], first["module"], first["op"], first["kind"]) == (
        3, "forward", "layers.1", "aten.randn", "origin"), first
    assert first["edge"] is None and first["edge_note"] == "no prefetch edge was on (every edge off)"
    job = (JOBS / "noisy_layer_job.py").read_text().splitlines()
    noise_line = next(k for k, line in enumerate(job, 1) if "torch.randn" in line)
    assert first["stack"].endswith(f"noisy_layer_job.py:{noise_line}")
    # Each rank's own first divergence is the same op, unless the run was stopped (at the first
    # differing digest of either rank) before that rank wrote its step: then its trace is said
    # cut. Which rank gets there first is the scheduler's: on a loaded machine, either.
    reached = [r for r in result["ranks"] if r["kind"] is not None]
    assert [(r["kind"], r["op"], r["step"]) for r in reached] == [("origin", "aten.randn", 3)] * len(reached)
    assert reached and first["rank"] == reached[0]["rank"]
    for rank in result["ranks"]:
        if rank["kind"] is None:
            assert rank["coverage"]["stops_at"][0] < 3 and rank["coverage"]["through_step"] == 3
            short = result["pair"][0 if rank["coverage"]["run"] == "a" else 1]
            assert f"rank {rank['rank']}: {short} traced {rank['coverage']['traced']} of ~" in text
    if len(reached) == 2:
        assert "rank 1: the same op" in text
    overhead = result["overhead"]
    assert overhead["ops_per_step"] > 100 and overhead["bytes_per_step"] > 0
    assert overhead["units"] is None  # every edge off: every op traced
    assert (f"first divergence: rank {first['rank']}, step 3, forward of layers.1: aten.randn "
            "(origin: inputs matched, output differed)") in text
    # The state dir keeps the result; its HTML report shows the op among its neighbours.
    state = tmp_path / "state" / "noisy"
    saved = json.loads((state / "explain.json").read_text())
    assert saved["first"] == first and any(n["first"] for n in saved["neighbours"])
    assert "First differing op" in (state / "report.html").read_text()


def test_explain_on_a_tensor_parallel_job_ties_the_first_divergence_to_the_edge(tmp_path, capsys):
    """explain of the fault's edge alone (keep-only, as `bisect --explain` traces a cause; that
    step after a verdict: tests/commands/test_explain.py and the whole-transcript tests)."""
    edge = "bwd:layers.3->layers.2"  # the job's own fault: the prefetch into layers.2
    argv = torchrun("tp_fsdp2_job.py", "--seed", "{seed}")
    experiment = write_experiment(tmp_path / "tp.yaml", "tp", argv, 5)
    out = tmp_path / "explain.json"
    code = main(["explain", str(experiment), "--mask", f"keep-only:{edge}",
                 "--state-dir", str(tmp_path / "state"), "--json", str(out)])
    text = capsys.readouterr().out
    assert code == 1, text
    explained = json.loads(out.read_text())
    assert explained["verdict"] == "explained" and explained["mask"] == [edge], text
    first = explained["first"]
    assert first["phase"] == "backward" and first["unit"] in ("layers.3", "layers.2"), first
    assert first["edge"] == edge, first
    assert explained["overhead"]["ratio"] is not None
    # The traced runs traced only the edge's two units, and said so.
    assert explained["traced_units"] == ["layers.2", "layers.3"]
    assert "the ops of layers.2, layers.3 (the source and target units" in text
    assert re.search(r"first divergence: rank \d, step \d+, backward of layers\.[23]: ", text), text
    report = (tmp_path / "state" / "tp" / "report.html").read_text()
    assert "First differing op" in report


def test_the_tool_failing_inside_a_traced_job_is_exit_3_with_the_rank_s_log(tmp_path):
    # Where a traced run's plan asks for a trace, the job's wrapper puts a directory where
    # each rank's trace file goes: the tracer cannot write its trace; the job itself runs on.
    wrapper = ('d=$(dirname "$BISECT_PREFETCH_PLAN"); if grep -q \'"trace": {\' '
               '"$BISECT_PREFETCH_PLAN"; then mkdir "$d/optrace.rank0.jsonl" '
               '"$d/optrace.rank1.jsonl"; fi; exec "$@"')
    argv = ["bash", "-c", wrapper, "job", *torchrun("noisy_layer_job.py")]
    experiment = write_experiment(tmp_path / "small.yaml", "small", argv, 2)
    done = subprocess.run([sys.executable, "-m", "bisect_prefetch.cli", "explain",
                           str(experiment), "--mask", "all-off", "--runs", "2",
                           "--state-dir", str(tmp_path / "state")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 3, done.stdout + done.stderr
    [line] = [line for line in done.stderr.splitlines() if line.strip()]
    assert line.startswith("error: bisect-prefetch failed (not your input): in traced run "), line
    assert "the op tracer failed at" in line and "IsADirectoryError" in line, line
    log = re.search(r"the rank's log: (\S+):(\d+)\)", line)
    assert log and "op trace stopped" in Path(log.group(1)).read_text().splitlines()[
        int(log.group(2)) - 1]


def test_explain_on_mindspore_traces_cells_in_backward_on_two_ranks(tmp_path, capsys):
    """On the static graph: that the workload's discovered graph is this policy's is
    tests/e2e/test_mindspore_workload_under_msrun.py's; a discovery run here would only
    start msrun once more."""
    pytest.importorskip("mindspore")
    experiment = tmp_path / "ms.yaml"
    experiment.write_text(textwrap.dedent("""
        name: ms
        workload: {builtin: mindspore, layers: 2, world_size: 2}
        metrics: {format: jsonl, names: [loss, grad_norm]}
        graph: {source: static, policy: mindformers, layers: 2}
        steps: 3
        timeout_s: 300
    """))
    out = tmp_path / "explain.json"
    code = main(["explain", str(experiment), "--runs", "2", "--steps", "2-3", "--state-dir",
                 str(tmp_path / "state"), "--json", str(out)])
    text = capsys.readouterr().out
    assert code == 0, text
    result = json.loads(out.read_text())
    assert result["verdict"] == "consistent" and result["first"] is None
    assert result["overhead"]["granularity"] == "cell" and result["overhead"]["ops_per_step"] > 10
    assert result["overhead"]["rank_records"] == 4  # 2 runs x 2 ranks
    assert "-> consistent: nothing to explain (2 runs" in text
    runs = sorted((tmp_path / "state" / "ms" / "runs").glob("*explain*"))
    for rank in (0, 1):
        ops = [json.loads(line) for line in
               (runs[0] / f"optrace.rank{rank}.jsonl").read_text().splitlines()]
        phases = {op["phase"] for op in ops}
        assert {"forward", "backward"} <= phases, (rank, phases)
        probe = json.loads((runs[0] / f"probe.rank{rank}.json").read_text())
        assert probe["op_trace"]["backward_records"] > 0
