"""The in-job manifest of what a job read: which opened files it keeps (read, not written;
not the run dir's; under the job's own directories), its bound on opened files, large files
by size and mtime, and the merge of its processes' manifests for the journal."""

from __future__ import annotations

import json
import os

from bisect_prefetch.adapters import manifest as m
from bisect_prefetch.runs.reuse import ReuseCheck, collect, summary


def _manifest(tmp_path, monkeypatch, **kw):
    project = tmp_path / "project"
    run_dir = project / "state" / "run"
    run_dir.mkdir(parents=True)
    monkeypatch.chdir(project)
    return project, run_dir, m.Manifest(out_dir=str(run_dir), argv=[str(project / "train.py")], **kw)


def test_files_read_under_the_jobs_dirs_are_kept_written_and_run_dir_ones_are_not(tmp_path, monkeypatch):
    project, run_dir, manifest = _manifest(tmp_path, monkeypatch)
    (project / "conf.json").write_text("{}")
    (project / "out.txt").write_text("")
    (run_dir / "plan.json").write_text("{}")
    (tmp_path / "elsewhere.txt").write_text("x")
    manifest._audit("open", (str(project / "conf.json"), "r", os.O_RDONLY))
    manifest._audit("open", ("out.txt", "w", os.O_WRONLY | os.O_CREAT))
    manifest._audit("open", (str(run_dir / "plan.json"), "r", os.O_RDONLY))
    manifest._audit("open", (str(tmp_path / "elsewhere.txt"), "r", os.O_RDONLY))
    manifest._audit("open", (3, "r", os.O_RDONLY))  # a descriptor: no path
    manifest._audit("import", ("x",))
    files = manifest.record()["files"]
    assert str((project / "conf.json").resolve()) in files
    assert not any(p.endswith(("out.txt", "plan.json", "elsewhere.txt")) for p in files)


def test_opened_files_are_bounded_and_the_bound_is_said(tmp_path, monkeypatch):
    monkeypatch.setattr(m, "OPENED_LIMIT", 2)
    project, _, manifest = _manifest(tmp_path, monkeypatch)
    for i in range(4):
        (project / f"f{i}").write_text(str(i))
        manifest._audit("open", (str(project / f"f{i}"), "r", os.O_RDONLY))
    record = manifest.record()
    assert record["opened_truncated"] is True and record["opened_limit"] == 2
    assert sum(p.endswith(("f0", "f1", "f2", "f3")) for p in record["files"]) == 2


def test_a_large_file_is_judged_by_size_and_mtime(tmp_path, monkeypatch):
    monkeypatch.setattr(m, "HASH_LIMIT_BYTES", 4)
    project, run_dir, manifest = _manifest(tmp_path, monkeypatch)
    data = project / "data.bin"
    data.write_bytes(b"0123456789")
    manifest._audit("open", (str(data), "rb", os.O_RDONLY))
    manifest.write(0, trained=True)
    record = collect(run_dir)
    assert record["files"][str(data.resolve())][2] is None
    assert str(data.resolve()) in record["by_stat"]
    assert "large file(s) by size and mtime" in summary(record)
    check = ReuseCheck(os.environ, records=[])
    run = {"run_id": "0001-aa-k0", "finished_at": 0, "manifest": record}
    assert check.why_not(run) is None
    os.utime(data, ns=(1, 1))  # same bytes, another mtime: a large file is not hashed
    assert "data.bin changed since run 0001-aa-k0" in ReuseCheck(os.environ, records=[]).why_not(run)


def test_processes_that_read_different_bytes_are_never_reused(tmp_path):
    for name, digest in (("manifest.rank0.json", "a"), ("manifest.rank1.json", "b")):
        (tmp_path / name).write_text(json.dumps({"files": {"/x/model.py": [1, 1, digest]}}))
    record = collect(tmp_path)
    why = ReuseCheck(os.environ, records=[]).why_not({"run_id": "0002", "manifest": record})
    assert "was read with different contents by different ranks" in why
