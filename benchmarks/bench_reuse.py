"""Cost of keying reuse on what the job read (adapters/manifest.py, runs/reuse.py).

A synthetic job imports ``--modules`` source files of its own (a project package beside
the script, not installed: every one is in its manifest) and writes its manifest the way
the adapter does when its first step ends (everything imported so far); the orchestrator
then checks the run for reuse the way `--reuse` or `--resume` does before taking it:

- ``write``: the in-job manifest (sys.modules walk, stat and sha256 of each own file, stat of
  each installed module file, the distributions on sys.path), timed inside the job; later
  writes (each step end, exit) hold only what is new;
- ``check unchanged``: every file's size and mtime as recorded (no hashing), the installed
  module files' too (read back from the run dir), the variables it started with;
- ``check touched``: every file's mtime moved, bytes unchanged (each file hashed again,
  the run still reused);
- ``check edited``: one file edited (found, reason said).

Where .venv-torchtitan is built (``--skip-torchtitan`` leaves it out), the same for a process of that venv that
imports torchtitan's trainer: how many source files it imported, how many of them its
manifest hashes (installed distributions' files are in it by size and mtime only), and the
write and check times.
Each figure is the median of ``--repeats``. Run: ``python -m benchmarks.bench_reuse
[--modules N] [--repeats R] [--skip-torchtitan] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bisect_prefetch.runs.launch_env import launch_print
from bisect_prefetch.runs.reuse import ReuseCheck, collect

REPO = Path(__file__).resolve().parent.parent

JOB = """
import json, os, sys, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import proj
from bisect_prefetch.adapters.manifest import Manifest
m = Manifest(out_dir=sys.argv[1])
began = time.perf_counter()
m.write(closed=True)
imported = sum(1 for mod in list(sys.modules.values()) if str(getattr(mod, "__file__", "") or "").endswith(".py"))
print(json.dumps({"write_s": time.perf_counter() - began, "imported": imported}))
"""

TITAN_JOB = """
import json, sys, time
import torchtitan.train
from bisect_prefetch.adapters.manifest import Manifest
m = Manifest(out_dir=sys.argv[1])
began = time.perf_counter()
m.write(closed=True)
imported = sum(1 for mod in list(sys.modules.values()) if str(getattr(mod, "__file__", "") or "").endswith(".py"))
print(json.dumps({"write_s": time.perf_counter() - began, "imported": imported}))
"""


def _project(root: Path, modules: int) -> None:
    package = root / "proj"
    per_dir = 100
    imports = []
    for i in range(modules):
        sub = package / f"part{i // per_dir}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / "__init__.py").touch()
        (sub / f"m{i}.py").write_text(f"VALUE = {i}\n" + "def f(x):\n    return x + VALUE\n" * 20)
        imports.append(f"import proj.part{i // per_dir}.m{i}")
    (package / "__init__.py").write_text("\n".join(imports) + "\n")


def _job(python: str, script: Path, run_dir: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([python, str(script), str(run_dir)], capture_output=True, text=True,
                         env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _check_s(root: Path, manifest: dict, repeats: int) -> tuple[float, str | None]:
    times, why = [], None
    record = {"run_id": "run0", "outcome": "ok", "finished_at": 0, "manifest": manifest,
              "launched": launch_print(os.environ, cwd=None)}
    for _ in range(repeats):
        began = time.perf_counter()
        why = ReuseCheck(os.environ, records=[], runs_path=root).why_not(record)
        times.append(time.perf_counter() - began)
    return statistics.median(times), why


def measure(python: str, job: str, repeats: int, modules: int | None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        script = root / "job.py"
        script.write_text(job)
        writes, imported = [], 0
        for k in range(repeats):
            run_dir = root / f"run{k}"
            run_dir.mkdir()
            if modules is not None and k == 0:
                _project(root, modules)
            done = _job(python, script, run_dir)
            writes.append(done["write_s"])
            imported = done["imported"]
        manifest = collect(root / "run0")
        files = manifest["files"]
        figures = {"imported_source_files": imported, "manifest_files": len(files),
                   "installed_module_files": manifest["installed"]["count"],
                   "write_ms": round(statistics.median(writes) * 1000, 1)}
        unchanged, why = _check_s(root, manifest, repeats)
        assert why is None, why
        figures["check_unchanged_ms"] = round(unchanged * 1000, 1)
        own = [p for p in files if p.startswith(str(root))]
        if own:
            for path in own:
                info = os.stat(path)
                os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns + 1000))
            touched, why = _check_s(root, manifest, 1)  # once: the next would hash nothing
            assert why is None, why
            figures["check_touched_ms"] = round(touched * 1000, 1)
            Path(own[-1]).write_text(Path(own[-1]).read_text() + "# edited\n")
            edited, why = _check_s(root, manifest, 1)
            figures["check_edited_ms"] = round(edited * 1000, 1)
            figures["edited_reason"] = why
        return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-torchtitan", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args([] if argv is None and __name__ != "__main__" else argv)
    result = {"synthetic": measure(sys.executable, JOB, args.repeats, args.modules)}
    print("synthetic job:", json.dumps(result["synthetic"]))
    titan = REPO / ".venv-torchtitan" / "bin" / "python"
    if not args.skip_torchtitan and titan.exists():
        result["torchtitan"] = measure(str(titan), TITAN_JOB, args.repeats, None)
        print("torchtitan trainer imports:", json.dumps(result["torchtitan"]))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
