"""Two Slurm nodes on this machine, each slurmd in a network namespace of its own
(tests/slurm_cluster.py): the README's multi-node torchrun template (`--nnodes=2`, the
rendezvous at `$MASTER_ADDR:{port}`, `expand_env`) runs `aa` of a user's FSDP2 script
(examples/fsdp2_train.py, which imports nothing of ours) with 2 ranks a node through the
slurm executor: with a planted fault, its edge alone diverges and the job without it
(every other edge on) is consistent, masks reaching every rank of both nodes; in that
consistent group every rank's files arrive, every rank is compared, each file of a run
dir has one writer. A machine where a network
namespace cannot be made fails here with that reason, never skips.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bisect_prefetch.metrics.localize import compare_run_digests
from tests.conftest import run_dir_writers
from tests.slurm_cluster import TwoNodeCluster, running_two_node_cluster

pytest.importorskip("torch")
JOB = Path(__file__).resolve().parents[2] / "examples" / "fsdp2_train.py"
RANKS = 4
FAULT_EDGE = "bwd:layers.4->layers.3"  # FSDP2's implicit backward chain into layers.3


def _experiment(tmp_path: Path, name: str, *job_args: str, steps: int = 3) -> Path:
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=2",
            "--rdzv_backend=c10d", "--rdzv_endpoint=$MASTER_ADDR:{port}", str(JOB),
            "--steps", "{steps}", "--accumulate", "1", *job_args]
    path = tmp_path / f"{name}.yaml"
    path.write_text(textwrap.dedent(f"""
        name: {name}
        command: {json.dumps(argv)}
        metrics: {{format: torchtitan, names: [loss, grad_norm]}}
        graph: {{source: runtime}}
        steps: {steps}
        timeout_s: 240
        executor: {{kind: slurm, slots: 1, nodes: 2, expand_env: [MASTER_ADDR]}}
    """))
    return path


def _cli(cluster: TwoNodeCluster, tmp_path: Path, *argv: str) -> tuple[int, dict, str]:
    """The tool on the first node, as a user starts it on a node of the cluster."""
    out = tmp_path / f"{argv[0]}.json"
    done = subprocess.run(
        cluster.inside([sys.executable, "-m", "bisect_prefetch.cli", *argv, "--state-dir",
                        str(tmp_path / "state"), "--json", str(out)]),
        env={**os.environ, **cluster.env, "OMP_NUM_THREADS": "1"}, cwd=tmp_path,
        capture_output=True, text=True, timeout=900)
    return done.returncode, json.loads(out.read_text()) if out.exists() else {}, done.stdout + done.stderr


def test_two_nodes_run_aa_with_every_rank_s_files_and_the_planted_edge(tmp_path):
    with running_two_node_cluster(tmp_path / "slurm") as cluster:
        experiment = _experiment(tmp_path, "two-fault", "--fault-target", "layers.3",
                                 "--fault-hazard", "1.0")
        # What a bisection would name, in two groups: the planted edge alone diverges, and
        # without it (every other edge on) the job is consistent, on every rank of both
        # nodes (the search on real runs: tests/e2e/test_two_causes.py).
        code, alone, out = _cli(cluster, tmp_path, "aa", str(experiment), "--runs", "2",
                                "--mask", f"keep-only:{FAULT_EDGE}")
        assert code == 1 and alone.get("verdict") == "diverged", out
        code, dropped, out = _cli(cluster, tmp_path, "aa", str(experiment), "--runs", "2",
                                  "--mask", f"drop-only:{FAULT_EDGE}")
        assert code == 0 and dropped.get("verdict") == "consistent", out
        # The consistent group's runs: every rank's files arrived, each with one writer, and
        # every rank's every record was compared.
        masked = {r["run_id"] for r in dropped["run_details"]}
        runs = sorted(p for p in (tmp_path / "state" / "two-fault" / "runs").iterdir()
                      if p.name in masked and "-aa-" in p.name)
        assert len(runs) == 2, (masked, runs)
        for run_dir in runs:
            writers = run_dir_writers(run_dir, RANKS)
            for rank in range(RANKS):
                for name in (f"digests.rank{rank}.jsonl", f"probe.rank{rank}.json",
                             f"env.rank{rank}.json", f"graph.rank{rank}.json"):
                    assert writers.get(name) == f"rank {rank}", (run_dir.name, name, writers)
            hosts = [json.loads((run_dir / f"env.rank{r}.json").read_text())["host"]
                     for r in range(RANKS)]
            assert sorted(hosts) == sorted([*cluster.nodes, *cluster.nodes])  # 2 ranks a node
        digests = compare_run_digests(runs[0], runs[1], ranks=RANKS)
        assert digests.first_diff_step is None and digests.problems == []
        lines = sum(len((d / f"digests.rank{r}.jsonl").read_text().splitlines())
                    for d in runs[:1] for r in range(RANKS))
        assert digests.records_compared == lines > 0  # every rank's every record
