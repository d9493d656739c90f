"""End to end: `bisect-prefetch bisect` on the real FSDP2 workload (4 layers, 2 ranks) and on
real MindSpore (1 rank).

A planted fault on one backward edge must be named, with several masks a run; the
orchestrator is SIGKILLed mid-way and `--resume` must reach the verdict without
re-running any finished run. On MindSpore: the audit, the bisection and the size-one guard.
Without a fault the verdict is no-drift-reproduced: on real runs, a clean group is
consistent (tests/e2e/test_aa_on_real_fsdp2.py); the verdict it makes, in the
whole-transcript tests (tests/commands/test_bisect_transcripts.py).
"""

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path


def write_experiment(tmp_path: Path, *, fault: bool, layers: int, world_size: int, steps: int,
                     edge: str = "", hazard: float = 0.3, extra: str = "") -> Path:
    fault_line = f'  fault: {{edge: "{edge}", hazard: {hazard}}}\n' if fault else ""
    path = tmp_path / "exp.yaml"
    path.write_text(
        f"name: e2e\nworkload:\n  builtin: fsdp2\n  layers: {layers}\n  world_size: {world_size}\n"
        f"{fault_line}steps: {steps}\nseed: 7\ntimeout_s: 240\nno_progress_timeout_s: 120\n{extra}"
    )
    return path


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "bisect_prefetch.cli", *args]


def journal_keys(state: Path) -> list[tuple]:
    lines = (state / "e2e" / "journal.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    return [(r["variant"], tuple(r["mask"] or ()), r["steps"], json.dumps(r.get("schedule")),
             r["index"], r["attempt"]) for r in records]


def kill_then_resume(tmp_path: Path, exp: Path, ready: Callable[[list[str]], bool]):
    """`bisect` SIGKILLed once its journal's lines are `ready`, then `bisect --resume` to
    the verdict: (journal keys before the kill, the resumed process, its stdout)."""
    state = tmp_path / "state"
    first = subprocess.Popen(cli("bisect", str(exp), "--state-dir", str(state)), cwd=tmp_path,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    journal = state / "e2e" / "journal.jsonl"
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline and first.poll() is None:
        if journal.exists() and ready(journal.read_text().splitlines()):
            break
        time.sleep(0.5)
    assert first.poll() is None, first.communicate()[0]
    os.kill(first.pid, signal.SIGKILL)
    first.wait(timeout=30)
    before = journal_keys(state)
    done = subprocess.run(cli("bisect", str(exp), "--resume", "--state-dir", str(state),
                              "--json", str(tmp_path / "bisect.json")),
                          cwd=tmp_path, capture_output=True, text=True, timeout=900)
    return before, done, done.stdout


def test_bisect_with_segments_takes_fewer_runs_than_trials_and_resumes_exactly(tmp_path):
    """search.segments auto: several masks a run, switched by every rank at the planned
    steps (their probes say so), the planted edge named, and a search SIGKILLed mid-way
    resumed with the same schedules, re-running nothing. (One mask a run, SIGKILLed and
    resumed: tests/e2e/test_slurm.py.)"""
    edge = "bwd:layers.2->layers.1"
    exp = write_experiment(tmp_path, fault=True, layers=4, world_size=2, steps=8, edge=edge,
                           hazard=0.1, extra="search: {segments: auto}\n")
    state, journal = tmp_path / "state", tmp_path / "state" / "e2e" / "journal.jsonl"
    # Discovery, the golden run, the golden run at the step cap, and a run of the search.
    before, done, out = kill_then_resume(
        tmp_path, exp, lambda lines: any('"schedule"' in line for line in lines))
    assert done.returncode == 1, out + done.stderr
    result = json.loads((tmp_path / "bisect.json").read_text())
    assert (result["verdict"], result["minimal_set"]) == ("culprit-found", [edge])
    assert result["confidence"] >= 0.95 and edge in result["reproduce"]
    assert "verdict: culprit-found" in out
    assert (state / "e2e" / "report.html").is_file()
    segments = result["segments"]
    assert segments["used"] and segments["cap_steps"] > 8
    assert segments["startups"] < segments["trials"] == result["runs_used"]
    assert (f"the search's verdict stands on {segments['trials']} trials in "
            f"{segments['startups']} runs") in out
    # Nothing that finished before the kill ran again: every earlier key was reused,
    # and no key appears twice in the journal.
    after = journal_keys(state)
    assert after[: len(before)] == before and len(set(after)) == len(after)
    assert result["runs_reused"] >= len(before) - 1  # every finished run (the discovery's too)
    records = [json.loads(line) for line in journal.read_text().splitlines() if line.strip()]
    golden = [r for r in records if r["variant"].startswith("search-golden+")]
    assert max(r["steps"] for r in golden) == segments["cap_steps"]
    runs = [r for r in records if r.get("schedule")]
    assert runs and any(len(r["schedule"]) > 1 for r in runs)
    # Every rank of every run of several masks began each segment it reached at its planned step.
    switched = 0
    for r in runs:
        if r["outcome"] not in ("ok", "stopped-early"):
            continue
        planned = [first for first, _ in r["schedule"]]
        probe_file = state / "e2e" / "runs" / r["run_id"] / "probe.json"
        if not probe_file.exists():  # stopped at a difference before any rank wrote one:
            assert r["outcome"] == "stopped-early"  # only then, and within its first segment
            assert len(planned) == 1 or r["first_diff_step"] <= planned[1]
            continue
        probe = json.loads(probe_file.read_text())
        for rank in probe["ranks"].values():
            followed = rank["schedule_followed"]
            assert [step for _, step in followed] == planned[: len(followed)]
            switched += len(followed) > 1
    assert switched


def test_mindspore_size_one_story_audit_bisect_guard(tmp_path):
    """The reported mechanism end to end on real MindSpore (1 rank: every unit size one):
    the audit flags size-one edges that still copy, the bisection names the planted
    backward edge, and with the size-one guard A/A is consistent again."""
    edge = "bwd:decoder.layers.2->decoder.layers.1"
    exp = tmp_path / "ms.yaml"
    exp.write_text(
        "name: e2e\nworkload:\n  builtin: mindspore\n  layers: 3\n  world_size: 1\n"
        f'  fault: {{edge: "{edge}", hazard: 0.3, mode: size-one-copy}}\n'
        "steps: 8\nseed: 3\ntimeout_s: 240\n"
    )
    state = str(tmp_path / "state")
    audit = subprocess.run(cli("audit", str(exp), "--state-dir", state, "--json", str(tmp_path / "audit.json")),
                           cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert audit.returncode == 1, audit.stdout + audit.stderr
    found = json.loads((tmp_path / "audit.json").read_text())
    assert edge in found["size_one_edges_unsharding"] and found["guard"] == "absent"

    bisect = subprocess.run(cli("bisect", str(exp), "--state-dir", state, "--json", str(tmp_path / "b.json")),
                            cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert bisect.returncode == 1, bisect.stdout + bisect.stderr
    assert json.loads((tmp_path / "b.json").read_text())["minimal_set"] == [edge]

    guarded = subprocess.run(cli("aa", str(exp), "--guard", "size-one", "--runs", "3", "--state-dir", state),
                             cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert guarded.returncode == 0, guarded.stdout + guarded.stderr
    assert "-> consistent" in guarded.stdout
