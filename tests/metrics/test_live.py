"""Live following: every metrics format and the digests, compared with the golden run as
lines arrive, and real jobs stopped at their first differing step."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.experiment import load_experiment
from bisect_prefetch.metrics.compare import StreamingComparator
from bisect_prefetch.metrics.digests import DigestRecord, format_digest_line
from bisect_prefetch.metrics.live import LiveMetrics
from bisect_prefetch.metrics.loading import load_run
from bisect_prefetch.runs.execute import Runner
from bisect_prefetch.runs.store import StateDir

MF = "{{ Epoch:[  1/  1], step:[{s:5d}/   30], loss:[{v:.6f}/{v:.6f}], per_step_time: 28ms, global_norm: [{g:.7f}], }}"
LINES = {
    "mindformers": "2026-01-01 10:00:00,123 - mindformers - INFO - " + MF,
    "torchtitan": "[rank0]:[titan] 2026-01-01 - root - INFO - step: {s:2d}  loss: {v:.6f}  grad_norm: {g:.4f}",
    "megatron": " iteration {s:8d}/      30 | lm loss: {v:.6E} | grad norm: {g:.3f} |",
    "regex": "it={s} loss={v:.6f} grad_norm={g:.5f}",
    "jsonl": '{{"step": {s}, "loss": {v!r}, "grad_norm": {g!r}}}',
}
PATTERN = r"it=(?P<step>\d+) loss=(?P<loss>\S+) grad_norm=(?P<grad_norm>\S+)"


def config(fmt: str, files: str | None = None):
    return SimpleNamespace(format=fmt, files=files, pattern=PATTERN if fmt == "regex" else None,
                           names=["loss", "grad_norm"])


def line(fmt: str, step: int, nudge: float = 0.0) -> str:
    return LINES[fmt].format(s=step, v=10.0 / step + nudge, g=1.0 + step / 100)


def golden(tmp_path: Path, fmt: str, steps: int = 6):
    run = tmp_path / "golden"
    run.mkdir()
    name = "metrics.jsonl" if fmt == "jsonl" else "stdout.log"
    (run / name).write_text("".join(line(fmt, s) + "\n" for s in range(1, steps + 1)))
    return load_run(run, fmt, ["loss", "grad_norm"], pattern=config(fmt).pattern)


@pytest.mark.parametrize("fmt", sorted(LINES))
def test_each_format_is_compared_line_by_line_as_it_arrives(tmp_path, fmt):
    comparator = StreamingComparator(golden(tmp_path, fmt), ["loss", "grad_norm"])
    run = tmp_path / "run"
    run.mkdir()
    live = LiveMetrics(run, config(fmt), comparator)
    log = run / ("metrics.jsonl" if fmt == "jsonl" else "stdout.log")
    with open(log, "w") as f:
        f.write(line(fmt, 1) + "\n" + line(fmt, 2) + "\n")
        f.flush()
        assert live.progress() > 0 and not live.diverged and live.steps_seen == 2
        diverged = line(fmt, 3, nudge=1e-6)
        f.write(diverged[:-3])  # a line still being written is not read yet
        f.flush()
        live.progress()
        assert not live.diverged and live.steps_seen == 2
        f.write(diverged[-3:] + "\n")
        f.flush()
        live.progress()
    assert live.diverged and live.first_diff_step == 3
    assert comparator.first_diff[1] == "loss"


def test_per_rank_logs_are_followed_instead_of_stdout(tmp_path):
    ref_dir = tmp_path / "golden"
    for rank in (0, 1):
        path = ref_dir / "log" / f"worker_{rank}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(line("mindformers", s, rank) + "\n" for s in (1, 2, 3)))
    comparator = StreamingComparator(load_run(ref_dir, "mindformers"))
    run = tmp_path / "run"
    (run / "log").mkdir(parents=True)
    # msrun's console interleaves both ranks in stdout.log; compared as one rank they would differ.
    (run / "stdout.log").write_text("".join(line("mindformers", s, r) + "\n" for s in (1, 2) for r in (0, 1)))
    for rank in (0, 1):
        (run / "log" / f"worker_{rank}.log").write_text(
            "".join(line("mindformers", s, rank + (1e-3 if (rank, s) == (1, 3) else 0)) + "\n" for s in (1, 2, 3)))
    live = LiveMetrics(run, config("mindformers"), comparator)
    live.progress()
    assert live.first_diff_step == 3 and comparator.first_diff == (1, "loss")
    assert sorted(p.name for p in live.feeds) == ["worker_0.log", "worker_1.log"]


def test_a_differing_digest_stops_before_the_metrics_differ(tmp_path):
    records = [DigestRecord(s, r, "layers.0.w", f"{s:016x}") for s in (1, 2, 3) for r in (0, 1)]
    golden_dir = tmp_path / "golden-digests"
    golden_dir.mkdir()
    for rank in (0, 1):  # each rank's own file
        (golden_dir / f"digests.rank{rank}.jsonl").write_text(
            "".join(format_digest_line(r) + "\n" for r in records if r.rank == rank))
    comparator = StreamingComparator(golden(tmp_path, "jsonl"))
    run = tmp_path / "run"
    run.mkdir()
    live = LiveMetrics(run, config("jsonl"), comparator, reference_dir=golden_dir)
    changed = [r._replace(digest="ff") if (r.step, r.rank) == (2, 1) else r for r in records]
    for rank in (0, 1):
        (run / f"digests.rank{rank}.jsonl").write_text(
            "".join(format_digest_line(r) + "\n" for r in changed if r.rank == rank))
    (run / "metrics.jsonl").write_text("".join(line("jsonl", s) + "\n" for s in (1, 2, 3)))
    live.progress()
    assert live.first_diff_step == 2 and comparator.first_diff == (1, "digest of layers.0.w")


JOB = textwrap.dedent("""
    import os, sys, time
    fmt, marker = sys.argv[1], sys.argv[2]
    lines = {lines!r}
    second = os.path.exists(marker)
    open(marker, "a").close()
    run_dir = os.path.dirname(os.environ["BISECT_PREFETCH_PLAN"])
    out = open(os.path.join(run_dir, "metrics.jsonl"), "w") if fmt == "jsonl" else sys.stdout
    for s in range(1, 31):
        v = 10.0 / s + (1e-6 if second and s >= 4 else 0.0)
        out.write(lines[fmt].format(s=s, v=v, g=1.0 + s / 100) + "\\n")
        out.flush()
        time.sleep(0.03)
""")


@pytest.mark.parametrize("fmt", ["mindformers", "regex", "jsonl"])
def test_a_real_job_is_stopped_at_its_first_differing_step(tmp_path, fmt):
    job = tmp_path / "job.py"
    job.write_text(JOB.format(lines=LINES))
    pattern = f", pattern: {json.dumps(PATTERN)}" if fmt == "regex" else ""
    exp_path = tmp_path / "exp.yaml"
    exp_path.write_text(textwrap.dedent(f"""
        name: live
        command: [{json.dumps(sys.executable)}, {json.dumps(str(job))}, {fmt}, {json.dumps(str(tmp_path / "marker"))}]
        metrics: {{format: {fmt}, names: [loss, grad_norm]{pattern}}}
        graph: {{source: static, policy: fsdp2-chain, layers: 2}}
        steps: 30
        timeout_s: 60
    """))
    experiment = load_experiment(exp_path)
    with StateDir(tmp_path / "state", "live") as state:
        runner = Runner(experiment, state).open()
        ref = runner.run(runner.key("golden", mask=None, guard="none", steps=30, index=0), label="golden")
        run = runner.run(runner.key("trial", mask=None, guard="none", steps=30, index=1), label="trial",
                         reference=ref.run_id)
    assert (ref.outcome, ref.steps_done) == ("ok", 30), ref.reason
    assert run.outcome == "stopped-early" and run.first_diff_step == 4
    assert run.steps_done < 15  # stopped within a few polls, not at the end


LIVE_LINES = st.lists(
    st.tuples(st.sampled_from(["mindformers", "noise", "percent"]), st.floats(allow_nan=True, allow_infinity=True)),
    min_size=1, max_size=30,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=LIVE_LINES, cuts=st.lists(st.integers(1, 400), max_size=20))
def test_live_reads_what_the_final_parse_reads_however_the_log_is_written(tmp_path_factory, lines, cuts):
    text, step = "", 0
    for kind, value in lines:
        if kind == "mindformers":
            step += 1
            text += LINES["mindformers"].format(s=step, v=value, g=abs(value)) + "\n"
        else:
            text += "[WARNING] checkpoint saved\n" if kind == "noise" else "  10.0% |███     | 71.4 samples/s/p }\n"
    data = text.encode()
    root = tmp_path_factory.mktemp("live")
    (root / "final").mkdir()
    (root / "final" / "stdout.log").write_bytes(data)
    try:
        final = load_run(root / "final", "mindformers")
    except BisectPrefetchError:
        return  # nothing to compare with (no metric line)
    comparator = StreamingComparator(final)
    (root / "run").mkdir()
    live = LiveMetrics(root / "run", config("mindformers"), comparator)
    at = 0
    with open(root / "run" / "stdout.log", "ab") as f:
        for cut in [*cuts, len(data)]:  # written in arbitrary slices, cut mid-line and mid-character
            f.write(data[at:at + cut])
            f.flush()
            at += cut
            live.progress()
    assert not live.diverged and comparator.unmatched == 0
    assert live.steps_seen == step
