"""The in-job manifest of what a process read: which opened files it keeps (read, r+ too; not
written; not the run dir's; under the job's own directories), the symlinks on the way, what
it looked for and did not find, its bound on opened files, large files by size and mtime, a
file the job wrote into after reading it, the lines it appends (only what is new) and the one
that closes it, and the merge of its processes' manifests for the journal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from bisect_prefetch.adapters import manifest as m
from bisect_prefetch.runs.launch_env import launch_print
from bisect_prefetch.runs.reuse import ReuseCheck, collect, gather, summary

REPO = Path(__file__).resolve().parents[2]


def _manifest(tmp_path, monkeypatch, **kw):
    project = tmp_path / "project"
    run_dir = project / "state" / "run"
    run_dir.mkdir(parents=True)
    monkeypatch.chdir(project)
    return project, run_dir, m.Manifest(out_dir=str(run_dir), argv=[str(project / "train.py")], **kw)


def _open(manifest, path, flags=os.O_RDONLY):
    manifest._audit("open", (str(path), "r", flags))


def _lines(run_dir):
    [path] = run_dir.glob("manifest.*.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_files_read_under_the_jobs_dirs_are_kept_written_and_run_dir_ones_are_not(tmp_path, monkeypatch):
    project, run_dir, manifest = _manifest(tmp_path, monkeypatch)
    for name in ("conf.json", "out.txt", "log.txt", "mmap.bin"):
        (project / name).write_text("{}")
    (run_dir / "plan.json").write_text("{}")
    (tmp_path / "elsewhere.txt").write_text("x")
    _open(manifest, project / "conf.json")
    _open(manifest, project / "mmap.bin", os.O_RDWR)  # r+ (a numpy.memmap): read too
    _open(manifest, "out.txt", os.O_WRONLY | os.O_CREAT)  # written only
    _open(manifest, "log.txt", os.O_RDWR | os.O_CREAT | os.O_TRUNC)  # w+: its old bytes unread
    _open(manifest, run_dir / "plan.json")
    _open(manifest, tmp_path / "elsewhere.txt")
    manifest._audit("open", (3, "r", os.O_RDONLY))  # a descriptor: no path
    manifest.write(closed=True)
    files = gather(run_dir)["files"]
    assert {str((project / n).resolve()) for n in ("conf.json", "mmap.bin")} <= set(files)
    assert not any(p.endswith(("out.txt", "log.txt", "plan.json", "elsewhere.txt")) for p in files)


def test_each_line_holds_only_what_is_new_and_the_last_one_closes(tmp_path, monkeypatch):
    project, run_dir, manifest = _manifest(tmp_path, monkeypatch)
    (project / "a.json").write_text("1")
    (project / "b.json").write_text("2")
    _open(manifest, project / "a.json")
    manifest.write()  # a step end
    manifest.write()  # another, nothing new: no line
    _open(manifest, project / "b.json")
    manifest.write(closed=True)
    manifest.write(closed=True)  # atexit after os._exit's: once
    first, last = _lines(run_dir)
    assert any(p.endswith("a.json") for p in first["files"]) and "closed" not in first
    assert [p for p in last["files"] if p.endswith(".json")] == [str((project / "b.json").resolve())]
    assert last["closed"] is True


def test_a_process_killed_before_it_closed_leaves_the_run_not_reusable_unless_stopped_after_its_steps(
        tmp_path, monkeypatch):
    _, run_dir, manifest = _manifest(tmp_path, monkeypatch)
    manifest.write()  # begun
    manifest.write(step=1)  # a step end with nothing new: the step alone
    manifest.write(step=2)
    assert _lines(run_dir)[1:] == [{"step": 1}, {"step": 2}]  # then killed
    record = collect(run_dir)
    assert record["unclosed"] == [{"pid": os.getpid(), "rank": 0, "step": 2}]

    def why(outcome, first_diff_step=None):
        run = {"run_id": "run", "outcome": outcome, "first_diff_step": first_diff_step,
               "manifest": record, "launched": launch_print(os.environ, cwd=None)}
        return ReuseCheck(os.environ, records=[], runs_path=run_dir.parent).why_not(run)

    assert "was killed before it ended its manifest" in why("ok")
    # Stopped by the orchestrator at its first difference (step 3): it recorded step 2.
    assert why("stopped-early", 3) is None
    assert "which ends at step 2, before step 3" in why("stopped-early", 4)


def test_a_process_stopped_in_its_first_step_stands_on_its_start(tmp_path, monkeypatch):
    """Stopped at a difference in step 1, nothing came before it but the start-up: the run
    is reusable on what its manifest recorded then; a later stop is not."""
    _, run_dir, manifest = _manifest(tmp_path, monkeypatch)
    manifest.write()  # begun, then killed inside step 1
    record = collect(run_dir)
    assert record["unclosed"] == [{"pid": os.getpid(), "rank": 0, "step": None}]

    def why(first_diff_step):
        run = {"run_id": "run", "outcome": "stopped-early", "first_diff_step": first_diff_step,
               "manifest": record, "launched": launch_print(os.environ, cwd=None)}
        return ReuseCheck(os.environ, records=[], runs_path=run_dir.parent).why_not(run)

    assert why(1) is None
    assert "which ends before any step, before step 1" in why(2)


def test_opened_files_are_bounded_and_a_bounded_manifest_is_not_reusable(tmp_path, monkeypatch):
    monkeypatch.setattr(m, "OPENED_LIMIT", 2)
    project, run_dir, manifest = _manifest(tmp_path, monkeypatch)
    for i in range(4):
        (project / f"f{i}").write_text(str(i))
        _open(manifest, project / f"f{i}")
    manifest.write(closed=True)
    record = collect(run_dir)
    assert record["opened_truncated"] is True and record["opened_limit"] == 2
    assert sum(p.endswith(("f0", "f1", "f2", "f3")) for p in record["files"]) == 2
    assert "opened more files than a manifest keeps (2): its manifest is not complete" in record["incomplete"]


def test_a_file_the_job_wrote_into_after_reading_it_is_marked(tmp_path, monkeypatch):
    project, run_dir, manifest = _manifest(tmp_path, monkeypatch)
    data = project / "counter.bin"
    data.write_bytes(b"0")
    _open(manifest, data, os.O_RDWR)
    data.write_bytes(b"12")  # the job wrote into it (r+)
    manifest.write(closed=True)
    assert gather(run_dir)["files"][str(data.resolve())][2] == m.CHANGED_IN_RUN


def test_links_on_the_way_and_paths_looked_for_are_kept(tmp_path, monkeypatch):
    project, run_dir, manifest = _manifest(tmp_path, monkeypatch)
    (project / "run1").mkdir()
    (project / "run1" / "x.json").write_text("{}")
    (project / "latest").symlink_to("run1")
    _open(manifest, project / "latest" / "x.json")
    manifest._looked(project / "override.json")  # os.path.exists said no
    manifest._looked(project / "made.json")  # ... and the job made it later: not absent
    (project / "made.json").write_text("{}")
    manifest.write(closed=True)
    whole = gather(run_dir)
    root = project.resolve()
    assert whole["links"][str(project / "latest" / "x.json")] == str(root / "run1" / "x.json")
    assert str(project / "override.json") in whole["absent"]
    assert str(project / "made.json") not in whole["absent"]


def test_a_large_file_is_judged_by_size_and_mtime(tmp_path, monkeypatch):
    monkeypatch.setattr(m, "HASH_LIMIT_BYTES", 4)
    project, run_dir, manifest = _manifest(tmp_path, monkeypatch)
    data = project / "data.bin"
    data.write_bytes(b"0123456789")
    _open(manifest, data)
    manifest.write(closed=True)
    record = collect(run_dir)
    assert record["files"][str(data.resolve())][2] is None
    assert str(data.resolve()) in record["by_stat"]
    assert "large file(s) by size and mtime" in summary(record)
    run = {"run_id": "run", "outcome": "ok", "finished_at": 0, "manifest": record,
           "launched": launch_print(os.environ, cwd=None)}
    runs = run_dir.parent
    assert ReuseCheck(os.environ, records=[], runs_path=runs).why_not(run) is None
    os.utime(data, ns=(1, 1))  # same bytes, another mtime: a large file is not hashed
    assert "data.bin changed since run run" in ReuseCheck(os.environ, records=[],
                                                          runs_path=runs).why_not(run)


def test_processes_that_read_different_bytes_are_never_reused(tmp_path):
    for pid, digest in ((1, "a"), (2, "b")):
        (tmp_path / f"manifest.h-{pid}.jsonl").write_text(json.dumps(
            {"v": 2, "pid": pid, "files": {"/x/model.py": [1, 1, digest]}, "closed": True}) + "\n")
    record = collect(tmp_path)
    run = {"run_id": "0002", "outcome": "ok", "manifest": record,
           "launched": launch_print(os.environ, cwd=None)}
    why = ReuseCheck(os.environ, records=[]).why_not(run)
    assert "was read with different contents by different processes" in why


def test_a_sigterm_inside_a_write_closes_the_manifest_once_the_write_is_done(tmp_path):
    """Stopped at its first difference just as it ended, a job gets SIGTERM inside the exit's
    write: the write finishes, the file is closed, and the process dies of the signal."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal
        from bisect_prefetch.adapters import manifest as m
        manifest = m.Manifest(out_dir={str(run_dir)!r}, rank=0)
        manifest.start()
        m._write_on_sigterm(manifest, lambda: manifest.write(closed=True))
        real = os.write
        def write_then_term(fd, data):  # the orchestrator's SIGTERM lands inside the write
            os.write = real
            os.kill(os.getpid(), signal.SIGTERM)
            return real(fd, data)
        os.write = write_then_term
        manifest.write(closed=True)  # the exit's write
        print("not reached")
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert done.returncode == -signal.SIGTERM and "not reached" not in done.stdout, done.stderr
    assert _lines(run_dir)[-1].get("closed") is True
    assert collect(run_dir)["unclosed"] == []
