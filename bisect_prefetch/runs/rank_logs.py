"""Per-rank logs of a launcher's workers, for `init`: msrun writes its workers' output
merged on its own stdout, two ranks' lines glued together, unless ``--log_dir`` gives
each worker its own ``worker_<rank>.log``; the run's ``{rank_log_dir}`` is that place.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from bisect_prefetch.judge.faults import RANK_LOG_DIR
from bisect_prefetch.vocab import METRICS_FILE, Placeholders

MSRUN = ("msrun", "mindspore.parallel.cluster.run")
WORKER_LOGS = f"{RANK_LOG_DIR}/worker_*.log"  # msrun --log_dir: worker_<rank>.log each


def per_rank_logs(p: Placeholders) -> bool:
    """msrun writes its workers' output merged on its own stdout (two ranks' lines glued
    together): give each worker its own log under the run dir, as the README's msrun
    template does (``--log_dir={rank_log_dir}``). True for an msrun command."""
    if p.launcher not in MSRUN:
        return False
    argv = p.argv
    for i, word in enumerate(argv):
        if word.startswith("--log_dir="):
            argv[i] = "--log_dir={rank_log_dir}"
            return True
        if word == "--log_dir" and i + 1 < len(argv):
            argv[i + 1] = "{rank_log_dir}"
            return True
    at = next(i for i, word in enumerate(argv) if word.rsplit("/", 1)[-1] in MSRUN) + 1
    argv.insert(at, "--log_dir={rank_log_dir}")
    p.marked[:] = [replace(m, index=m.index + (m.index >= at)) for m in p.marked]
    return True


def log_files(run_dir: Path, p: Placeholders, job_logs: Sequence[str]) -> list[Path]:
    """Where a run's metric lines may be: msrun's per-worker logs (and metrics.jsonl), else
    the job's own ``job_logs`` in the run dir."""
    if p.launcher in MSRUN:
        return [*sorted((run_dir / RANK_LOG_DIR).glob("worker_*.log")), run_dir / METRICS_FILE]
    return [run_dir / name for name in job_logs]
