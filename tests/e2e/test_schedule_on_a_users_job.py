"""A plan's schedule of masks on a user's FSDP2 script (examples/fsdp2_train.py, which imports
and calls nothing of ours) on 2 CPU ranks: a three-segment schedule followed per step and per
rank (the probe and the order record), and every value bitwise the all-off run's. The plan
file and the gate's switch alone: tests/adapters/test_schedule.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bisect_prefetch.adapters.gate import Gate
from bisect_prefetch.adapters.plan import parse_plan
from bisect_prefetch.experiment import Experiment
from bisect_prefetch.runs.plan import build_plan, write_plan
from tests.conftest import rank_lines, read_probe, step_outcomes

REPO = Path(__file__).resolve().parents[2]
SITE = REPO / "bisect_prefetch" / "adapters" / "site"
JOB = REPO / "examples" / "fsdp2_train.py"


# -- a user's FSDP2 job on 2 CPU ranks ------------------------------------------------------
ONE_EDGE = "bwd:layers.4->layers.3"
LOSS_LINE = re.compile(r"step:\s+(\d+)\s+loss:\s+(\S+)\s+grad_norm:\s+(\S+)")


def run_user_job(run_dir: Path, *, job_args: tuple[str, ...], steps: int, mask=None,
                 schedule=None) -> str:
    """examples/fsdp2_train.py under torchrun, 2 ranks, with the plan the orchestrator writes
    (runs/plan.build_plan): the in-job adapter comes in through sitecustomize alone."""
    from tests.conftest import free_port

    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
            f"--master_port={free_port()}", str(JOB), "--steps", str(steps), *job_args]
    experiment = Experiment(name="sched", command=argv, record={"order_steps": steps})
    plan = build_plan(experiment=experiment, run_id=run_dir.name, out_dir=run_dir, mask=mask,
                      guard="none", steps=steps, schedule=schedule)
    run_dir.mkdir(parents=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(SITE), str(REPO)]),
               BISECT_PREFETCH_PLAN=str(write_plan(run_dir, plan)))
    done = subprocess.run(argv, cwd=run_dir, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


def digest_records(run_dir: Path) -> list[tuple]:
    """(step, rank, param, digest, norm, max_abs), sorted: ranks append in any order."""
    records = [json.loads(line) for line in rank_lines(run_dir, "digests")]
    return sorted((r["step"], r["rank"], r["param"], r["digest"], r["norm"], r["max_abs"])
                  for r in records)


@pytest.mark.parametrize(
    ("source", "job_args"),
    [
        ("optimizer", ()),  # AdamW, gradient accumulation 2: two forward/backward a step
        ("backward", ("--manual-update", "--accumulate", "1")),  # no torch.optim at all
    ],
)
def test_a_users_fsdp2_job_follows_a_schedule_step_by_step_on_every_rank(tmp_path, source,
                                                                         job_args):
    pytest.importorskip("torch")
    steps = 6
    off_dir, scheduled_dir = tmp_path / "all-off", tmp_path / "scheduled"
    off_out = run_user_job(off_dir, job_args=job_args, steps=steps, mask=frozenset())
    edges = {e["id"] for e in json.loads((off_dir / "graph.rank0.json").read_text())["edges"]}
    assert ONE_EDGE in edges and len(edges) == 6, edges  # FSDP2's implicit backward chain
    schedule = [(1, frozenset(edges)), (3, frozenset()), (5, frozenset({ONE_EDGE}))]
    scheduled_out = run_user_job(scheduled_dir, job_args=job_args, steps=steps,
                                 schedule=schedule)
    plan = parse_plan(json.loads((scheduled_dir / "plan.json").read_text()))

    for rank in (0, 1):
        probe = read_probe(scheduled_dir, rank)
        assert probe["step_source"] == source and probe["steps_counted"] == steps
        assert probe["schedule_followed"] == [[0, 1], [1, 3], [2, 5]], rank
        assert "schedule_refused" not in probe and not probe.get("errors")
        outcomes = step_outcomes(probe)
        assert sorted(outcomes) == list(range(1, steps + 1))  # no partial step
        assert not any(entry.get("partial") for entry in probe["steps"])
        for step, seen in outcomes.items():
            mask = Gate(plan).mask_at(step)
            # Every edge fired each step; those in the step's mask ran, the others were
            # masked, and none was both (no switch inside a step).
            assert seen["issued"] | seen["noop"] | seen["masked"] == edges, (rank, step)
            assert seen["issued"] | seen["noop"] == mask, (rank, step, seen)
            assert seen["masked"] == edges - mask, (rank, step, seen)
            assert not seen["guarded"]
        assert probe["edges"][ONE_EDGE]["masked"] == probe["edges"][ONE_EDGE]["fired"] // 3
        # The order record, prefetch by prefetch: each in its step's mask ran, the others
        # were masked.
        lines = (scheduled_dir / f"order.rank{rank}.jsonl").read_text().splitlines()
        assert [json.loads(line)["step"] for line in lines] == list(range(1, steps + 1))
        for line in map(json.loads, lines):
            mask = Gate(plan).mask_at(line["step"])
            prefetches = [event[1:] for event in line["events"] if event[0] == "prefetch"]
            assert len(prefetches) == len(edges) * (2 if source == "optimizer" else 1)
            assert all((outcome == "masked") == (edge not in mask) for edge, outcome in prefetches)

    # The mask changes when parameters are gathered, not what is computed: every gradient
    # and parameter value on every rank at every step is bitwise the all-off run's.
    scheduled, off = digest_records(scheduled_dir), digest_records(off_dir)
    assert len(scheduled) == steps * 2 * 2 * 39  # steps x ranks x (gradient, value) x params
    assert scheduled == off
    # ... and so is the loss the job prints (4 decimals, as printed).
    assert LOSS_LINE.findall(scheduled_out) == LOSS_LINE.findall(off_out)
    assert len(LOSS_LINE.findall(off_out)) == steps
