"""torchtitan 0.3.0's start-up and step time through the tool (issue 24).

torchtitan's own trainer (llama3 `debugmodel`, 2 CPU ranks over gloo, its own venv
`.venv-torchtitan`), launched by the tool's Runner as `aa` launches it: plan, adapter (digests
of every gradient and value, the order record), the launcher, the metrics reading. The job is
started through the tests' CPU wrapper (tests/jobs/torchtitan_cpu.py; real users run on GPUs) with
the tests' locally made assets (tests/jobs/torchtitan_assets.py).

Per run, from its files:
- start-up: launch to step 1's metrics line. The run's wall less the time from step 1's line
  to torchtitan's last log line (both stamped by torchtitan's logger), so it holds the launch,
  imports, process groups, model and data set-up, and step 1 itself.
- step time: the tool's own figure (`step_time_ms`, median after warm-up, from the adapter's
  step clock), and the median gap between consecutive metrics lines as torchtitan stamps them.
- the tool's `first_progress_s` beside them (what the launcher counts as first progress).

Medians over `--repeats` runs. Run: ``python -m benchmarks.bench_torchtitan [--repeats N]
[--steps N] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
from datetime import datetime
from pathlib import Path

from bisect_prefetch.experiment import load_experiment
from bisect_prefetch.runs.execute import Runner
from bisect_prefetch.runs.store import StateDir

REPO = Path(__file__).resolve().parents[1]
VENV = REPO / ".venv-torchtitan"
WRAPPER = REPO / "tests" / "torchtitan_cpu.py"
ASSETS = REPO / "tests" / "torchtitan_assets.py"
STAMP = re.compile(r"\[titan\] (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})")
STEP = re.compile(r"step:\s+(\d+)\s")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _experiment(folder: Path, assets: Path) -> Path:
    command = [
        str(VENV / "bin" / "torchrun"), "--nnodes=1", "--nproc_per_node=2",
        "--master_port={port}", str(WRAPPER), "--module", "llama3", "--config",
        "llama3_debugmodel", "--hf-assets-path", str(assets / "tokenizer"),
        "--dataloader.dataset-path", str(assets / "c4_test"), "--dump-folder", "{run_dir}/dump",
        "--training.seq-len", "128", "--training.local-batch-size", "2",
        "--training.steps", "{steps}", "--debug.seed", "{seed}", "--debug.deterministic",
        "--parallelism.spmd-backend", "partial_dtensor",
    ]  # fmt: skip
    path = folder / "titan.yaml"
    path.write_text(textwrap.dedent(f"""
        name: titan-bench
        command: {json.dumps(command)}
        env: {{HF_HUB_OFFLINE: "1", HF_DATASETS_OFFLINE: "1",
              HF_DATASETS_CACHE: {json.dumps(str(assets / "datasets-cache"))}}}
        metrics: {{format: torchtitan, names: [loss, grad_norm]}}
        graph: {{source: static, policy: torchtitan, layers: 6}}
        seed: 7
        timeout_s: 600
    """))
    return path


def _stamped_lines(stdout: Path) -> tuple[dict[int, datetime], datetime]:
    """Step -> the first stamp of its metrics line; and the last stamp of the log."""
    steps: dict[int, datetime] = {}
    last = None
    for line in stdout.read_text(errors="replace").splitlines():
        stamp = STAMP.search(line)
        if stamp is None:
            continue
        last = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f")
        step = STEP.search(ANSI.sub("", line))
        if step is not None:
            steps.setdefault(int(step.group(1)), last)
    if not steps or last is None:
        raise SystemExit(f"{stdout}: no torchtitan metrics line")
    return steps, last


def measure(*, steps: int, repeats: int) -> dict[str, object]:
    if not (VENV / ".installed").is_file():
        raise SystemExit("torchtitan's venv is not built: make torchtitan-venv")
    startups, tool_steps, log_steps, first_progress = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        subprocess.run([str(VENV / "bin" / "python"), str(ASSETS), str(folder / "assets")],
                       check=True, timeout=300)
        experiment = load_experiment(_experiment(folder, folder / "assets"))
        with StateDir(folder / "state", experiment.name) as state:
            runner = Runner(experiment, state).open()
            for index in range(repeats):
                key = runner.key("bench", mask=None, guard="none", steps=steps, index=index)
                out = runner.run(key, label="bench")
                if out.outcome != "ok" or out.steps_done != steps:
                    raise SystemExit(f"torchtitan: run {out.run_id} ended {out.outcome} "
                                     f"({out.reason}) after {out.steps_done} of {steps} steps")
                stamps, last = _stamped_lines(state.run_dir(out.run_id) / "stdout.log")
                startups.append(out.wall_s - (last - stamps[1]).total_seconds())
                gaps = [(stamps[s + 1] - stamps[s]).total_seconds()
                        for s in range(2, steps) if s in stamps and s + 1 in stamps]
                log_steps.append(statistics.median(gaps) * 1e3)
                if out.step_time_ms is not None:
                    tool_steps.append(out.step_time_ms)
                if out.first_progress_s is not None:
                    first_progress.append(out.first_progress_s)

    def median(values: list[float], digits: int) -> float | None:
        return round(statistics.median(values), digits) if values else None

    return {"startup_to_step1_s": median(startups, 2), "step_ms_tool": median(tool_steps, 1),
            "step_ms_log": median(log_steps, 1), "first_progress_s": median(first_progress, 2),
            "steps": steps, "repeats": repeats, "ranks": 2,
            "per_run": {"startup_to_step1_s": [round(x, 2) for x in startups],
                        "step_ms_tool": [round(x, 1) for x in tool_steps],
                        "step_ms_log": [round(x, 1) for x in log_steps],
                        "first_progress_s": first_progress}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args([] if argv is None else argv)  # None: from `python -m benchmarks`
    f = measure(steps=args.steps, repeats=args.repeats)
    print(f"torchtitan llama3 debugmodel, 2 CPU ranks, {args.steps} steps, median of "
          f"{args.repeats} runs through the tool:", flush=True)
    print(f"  start-up to step 1: {f['startup_to_step1_s']} s  (launcher's first progress: "
          f"{f['first_progress_s']} s)", flush=True)
    print(f"  step time: {f['step_ms_tool']} ms (adapter's step clock), {f['step_ms_log']} ms "
          f"(torchtitan's log stamps)", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(f, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
