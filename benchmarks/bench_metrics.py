"""Benchmark of the metrics layer: compare two big runs, follow one live, then digests.

Generates, in a temporary directory, two runs of 100,000 steps x 8 ranks of MindFormers
1.9 worker logs (msrun's log/worker_<rank>.log: `loss:[step/mean]`, `global_norm: [x]`,
the percent lines and a few warnings) that diverge late, and 1,000,000 digest records per
run; then times
1. compare of the metrics, parsing included (load_runs on both runs + compare_trajectories),
2. live following (metrics/live.py, the parser compare uses): a writer process appends
   one run's 8 logs while the follower polls them as the orchestrator does and compares
   every step with the other run; the follower's CPU is measured over the whole log,
3. compare of the digest files,
and prints each time, the peak Python memory of 1 and 3 (tracemalloc, in a second,
untimed pass) and the log sizes, so that flat memory in the log size can be seen.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from bisect_prefetch.metrics.compare import StreamingComparator, compare_trajectories, earliest
from bisect_prefetch.metrics.digests import compare_digest_files
from bisect_prefetch.metrics.live import LiveMetrics
from bisect_prefetch.metrics.loading import load_run, load_runs

STEPS = 100_000
RANKS = 8
METRIC_DIVERGE_AT = 70_001
DIGEST_STEPS, DIGEST_RANKS, DIGEST_PARAMS = 1_000, 2, 500  # 1,000,000 records a run
DIGEST_DIVERGE_AT = 600
PREFIX = "[INFO] 2026-01-01 10:{:02d}:{:02d},123 [mindformers/core/callback/callback.py:361] print_output_info: "
LINE = (
    "{{ Epoch:[  1/  1], step:[{:6d}/{:6d}], loss:[{:.6f}/{:.6f}], per_step_time: {:d}ms, "
    "lr: 0.0009054635, overflow cond: False, loss_scale: 1.0, global_norm: [{:.7f}], "
    "train_throughput_per_npu: {:.3f}T\n"
)
PERCENT = "[INFO] 2026-01-01 10:00:00,123 [mindformers/core/callback/callback.py:375] print_output_info:   {:4.1f}% |{:<50}| 71.42857 samples/s/p  0:00:01 }}\n"
NOISE = "[WARNING] 2026-01-01 10:00:00,123 [mindformers/trainer/base_trainer.py:88] checkpoint saved\n"


def write_worker_log(path: Path, rank: int, run: int) -> None:
    rng = np.random.default_rng(rank)  # the same numbers in both runs...
    loss = 10.0 * rng.random(STEPS)
    grad = 20.0 * rng.random(STEPS)
    aux = rng.random(STEPS)
    if run == 1:  # ... until the divergence
        loss[METRIC_DIVERGE_AT - 1 :] += 1e-6
        grad[METRIC_DIVERGE_AT - 1 :] += 1e-5
    timing = np.random.default_rng(100 * run + rank).integers(690, 730, STEPS)  # differs per run
    # Python numbers format several times faster than numpy scalars.
    loss, grad, aux, timing = loss.tolist(), grad.tolist(), aux.tolist(), timing.tolist()
    with open(path, "w") as f:
        for start in range(0, STEPS, 10_000):
            f.write(NOISE)
            f.write(
                "".join(
                    PREFIX.format((i // 60) % 60, i % 60)
                    + LINE.format(i + 1, STEPS, loss[i], aux[i], timing[i], grad[i], 0.012)
                    + PERCENT.format(100 * (i + 1) / STEPS, "")
                    for i in range(start, min(start + 10_000, STEPS))
                )
            )


def write_digests(path: Path, run: int) -> None:
    params = [f"model.layers.{i // 10}.block{i % 10}.weight" for i in range(DIGEST_PARAMS)]
    first = {(0, params[53]), (1, params[53])}  # the story: one parameter on two ranks first
    rng = np.random.default_rng(7)
    with open(path, "w") as f:
        for step in range(1, DIGEST_STEPS + 1):
            digests = rng.integers(0, 2**63, DIGEST_RANKS * DIGEST_PARAMS).tolist()
            lines = []
            for rank in range(DIGEST_RANKS):
                for i, param in enumerate(params):
                    d = digests[rank * DIGEST_PARAMS + i]
                    if run == 1 and (
                        (step == DIGEST_DIVERGE_AT and (rank, param) in first)
                        or (step == DIGEST_DIVERGE_AT + 1 and i % 10 == 3)
                        or step > DIGEST_DIVERGE_AT + 1
                    ):
                        d ^= 1
                    # What format_digest_line writes (json.dumps), spelled out: 10x faster.
                    lines.append(f'{{"step": {step}, "rank": {rank}, "param": "{param}", "digest": "{d:016x}"}}')
            f.write("\n".join(lines) + "\n")


def generate(root: Path) -> tuple[Path, Path]:
    runs = []
    for run in (0, 1):
        run_dir = root / f"run{run}"
        (run_dir / "log").mkdir(parents=True)
        for rank in range(RANKS):
            write_worker_log(run_dir / "log" / f"worker_{rank}.log", rank, run)
        write_digests(run_dir / "digests.jsonl", run)
        runs.append(run_dir)
    return runs[0], runs[1]


def compare_metrics(a: Path, b: Path, workers: int | None = None) -> dict:
    """What `compare` does with the metrics of two runs (compare_paths, less the digests)."""
    return compare_trajectories(*load_runs([a, b], workers=workers))


FOLLOW_S = 20.0  # the writer appends the whole run in about this long
POLL_S = 0.05  # as the orchestrator polls a running job (runs/launcher.py)
MINDFORMERS_STEP_S = 0.027  # a real MindFormers 1.9 step on CPU, as measured: ~45 min for 100k steps
# Appends each worker log of SRC under DST in slices, so that the whole run takes about
# FOLLOW_S: the pace of a job ~130x faster than the real one, to make the follower work.
WRITER = """
import sys, time
from pathlib import Path
src, dst, seconds = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])
logs = sorted(src.glob("log/worker_*.log"))
data = [p.read_bytes() for p in logs]
(dst / "log").mkdir(parents=True)
outs = [open(dst / "log" / p.name, "ab") for p in logs]
ticks = int(seconds / 0.05)
start = time.monotonic()
for tick in range(1, ticks + 1):
    for d, out in zip(data, outs):
        a, b = len(d) * (tick - 1) // ticks, len(d) * tick // ticks  # a cut mid-line on purpose
        out.write(d[a:b]); out.flush()
    time.sleep(max(0.0, start + tick * 0.05 - time.monotonic()))
"""


def follow_live(golden: Path, source: Path, root: Path) -> tuple[float, float, int, int | None]:
    """(wall s, follower CPU s, steps seen, first diff step) of following source's logs live."""
    reference = load_run(golden, "mindformers")
    comparator = StreamingComparator(reference)
    run_dir = root / "live"
    run_dir.mkdir()
    config = SimpleNamespace(format="mindformers", files=None, pattern=None, names=["loss", "grad_norm"])
    live = LiveMetrics(run_dir, config, comparator)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(source), str(run_dir), str(FOLLOW_S)])
    cpu0, t0 = time.process_time(), time.perf_counter()
    while writer.poll() is None:
        live.progress()
        time.sleep(POLL_S)
    live.progress()
    return time.perf_counter() - t0, time.process_time() - cpu0, live.steps_seen, live.first_diff_step


def measure(fn: Callable[..., object], **in_process) -> tuple[float, float, int, object]:
    """(wall seconds, CPU seconds of this process and its children, peak traced bytes, result).

    Memory is measured in a second, untimed pass run with `in_process` keyword arguments
    (workers=1: tracemalloc sees only this process).
    """
    cpu0 = _cpu()
    t0 = time.perf_counter()
    result = fn()
    wall = time.perf_counter() - t0
    cpu = _cpu() - cpu0
    tracemalloc.start()
    fn(**in_process)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return wall, cpu, peak, result


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="bench-metrics-") as tmp:
        print(f"generating 2 runs: {STEPS:,} steps x {RANKS} ranks of mindformers logs, "
              f"{DIGEST_STEPS * DIGEST_RANKS * DIGEST_PARAMS:,} digest records each ...", flush=True)
        a, b = generate(Path(tmp))
        log_bytes = sum(p.stat().st_size for run in (a, b) for p in (run / "log").glob("*.log"))
        digest_bytes = sum((run / "digests.jsonl").stat().st_size for run in (a, b))

        print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} "
              "(target: under 2 s wall each on an idle 2-core machine)")
        wall, cpu, peak, diffs = measure(lambda workers=None: compare_metrics(a, b, workers), workers=1)
        found = earliest(diffs)
        kept = 2 * RANKS * STEPS * 2 * 16  # the parsed numbers: step + value, 2 metrics
        print(f"compare metrics ({log_bytes / 2**20:.0f} MiB of logs, parsing included): "
              f"{wall:.2f} s wall, {cpu:.2f} s CPU; peak Python memory {peak / 2**20:.1f} MiB "
              f"({kept / 2**20:.0f} MiB of it the parsed numbers) "
              f"-> first diff at step {found[0] if found else None}")

        wall, cpu, seen, live_diff = follow_live(a, b, Path(tmp))
        real_run_s = STEPS * MINDFORMERS_STEP_S
        print(f"live following ({STEPS:,} steps x {RANKS} ranks written in {wall:.1f} s, polled every {POLL_S} s): "
              f"{cpu:.2f} s CPU = {100 * cpu / wall:.1f}% of that wall time; over a real MindFormers run of "
              f"{STEPS:,} steps ({MINDFORMERS_STEP_S * 1000:.0f} ms a step: {real_run_s / 60:.0f} min) "
              f"{100 * cpu / real_run_s:.3f}% CPU (target: <= 1%) -> saw step {seen:,}, first diff at step {live_diff}")

        wall, cpu, peak, digests = measure(
            lambda: compare_digest_files(a / "digests.jsonl", b / "digests.jsonl", found[0] if found else None)
        )
        print(f"compare digests ({digest_bytes / 2**20:.0f} MiB, 2 x {DIGEST_STEPS * DIGEST_RANKS * DIGEST_PARAMS:,} records): "
              f"{wall:.2f} s wall, {cpu:.2f} s CPU, peak Python memory {peak / 2**20:.1f} MiB "
              f"-> first diff at step {digests.first_diff_step}, {len(digests.at_first)} record(s) there, "
              f"{digests.records_differing:,} differing")
        ok = (
            found is not None
            and found[0] == METRIC_DIVERGE_AT
            and live_diff == METRIC_DIVERGE_AT
            and seen == STEPS
            and digests.first_diff_step == DIGEST_DIVERGE_AT
            and len(digests.at_first) == 2
        )
        if not ok:
            print("unexpected result: the benchmark's planted divergences were not found", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
