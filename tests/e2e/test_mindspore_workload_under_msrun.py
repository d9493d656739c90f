"""The MindSpore reference workload under hyper-parallel's double, through msrun: 1 rank
(every unit size one: the chain discovered, the guard, the planted fault and its mask) and
2 ranks (every unit sharded over 2, real AllGathers; the older lineage; the audit of a build
guard), all runs started together and shared by the tests. The audit's size-one kind on
these runs (every edge at 1 rank, none at 2); through `audit` on the workload:
tests/e2e/test_bisect.py. The adapter over a toy scheduler,
and on real MindSpore tensors in-process: tests/adapters/test_hyper_parallel.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bisect_prefetch.adapters import hyper_parallel as hp
from bisect_prefetch.graph import from_policy
from bisect_prefetch.judge.audit import audit_run_dir
from bisect_prefetch.metrics.localize import compare_run_digests
from tests.conftest import failing_findings, rank_lines

REPO = Path(__file__).resolve().parents[2]
SITE = REPO / "bisect_prefetch" / "adapters" / "site"


# -- the MindSpore reference workload through msrun -------------------------------------
MSRUN = Path(sys.executable).parent / "msrun"
LAYERS, STEPS = 2, 4
FAULT_EDGE = "bwd:decoder.layers.1->decoder.layers.0"


def mindspore_run(test):
    """Marks a test that runs the MindSpore workload through msrun."""
    for mark in (
        pytest.mark.mindspore,
        pytest.mark.skipif(not MSRUN.exists(), reason="msrun (mindspore) not installed"),
    ):
        test = mark(test)
    return test


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WorkloadRun:
    """One msrun of bisect_prefetch.workloads.mindspore under a plan, and what it recorded."""

    def __init__(self, run_dir: Path, ranks: int) -> None:
        self.dir = run_dir
        self.ranks = ranks

    def metrics(self) -> dict[tuple[int, int], dict]:
        lines = rank_lines(self.dir, "metrics")
        rows = [json.loads(line) for line in lines]
        return {(row["step"], row["rank"]): row for row in rows}

    def graph(self, rank: int = 0) -> dict:
        return json.loads((self.dir / f"graph.rank{rank}.json").read_text())

    def probe(self, rank: int = 0) -> dict:
        return json.loads((self.dir / f"probe.rank{rank}.json").read_text())

    def worker_log(self, rank: int = 0) -> str:
        return (self.dir / "logs" / f"worker_{rank}.log").read_text()


def run_workload(root: Path, name: str, *, ranks: int, mask=None, guard="none", args=()):
    run_dir = root / name
    run_dir.mkdir()
    plan = {"version": 1, "experiment": "test", "run_id": name, "out_dir": str(run_dir),
            "mask": mask, "guard": guard, "seed": 7, "steps": STEPS,
            "record": {"digests": "*", "digest_every": 1}}  # on by default in the tool
    (run_dir / "plan.json").write_text(json.dumps(plan))
    env = {
        **os.environ,
        "PATH": f"{MSRUN.parent}{os.pathsep}{os.environ.get('PATH', '')}",  # msrun runs `python`
        "PYTHONPATH": f"{SITE}{os.pathsep}{REPO}",
        "BISECT_PREFETCH_PLAN": str(run_dir / "plan.json"),
        "GLOG_v": "3",
    }
    command = [
        str(MSRUN), f"--worker_num={ranks}", f"--local_worker_num={ranks}",
        f"--master_port={free_port()}", "--join=True", f"--log_dir={run_dir / 'logs'}",
        "--cluster_time_out=60", "python", "-m", "bisect_prefetch.workloads.mindspore",
        "--layers", str(LAYERS), "--steps", str(STEPS), "--seed", "7", *args,
    ]
    with open(run_dir / "msrun.log", "w") as log:
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=240)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGINT)  # msrun kills its workers on SIGINT
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            pytest.fail(f"msrun run {name} timed out")
    run = WorkloadRun(run_dir, ranks)
    assert proc.returncode == 0, (run_dir / "msrun.log").read_text()[-3000:]
    return run


FAULT = ["--fault-edge", FAULT_EDGE, "--fault-hazard", "1"]
RUN_SPECS = {  # the 2-rank runs first: they take longest
    "two-ranks-guarded": {
        "ranks": 2, "guard": "size-one", "args": ["--shard-size-source", "shard_world_size"],
    },
    "two-ranks-pitfall": {
        "ranks": 2,
        "args": ["--build-guard", "shard-size", "--shard-size-source", "shard_world_size"],
    },
    "older-two-ranks": {"ranks": 2, "args": ["--lineage", "hsdp"]},
    "reference": {"ranks": 1},
    "older-one-rank": {"ranks": 1, "args": ["--lineage", "hsdp"]},
    "size-one-copy": {"ranks": 1, "args": [*FAULT, "--fault-mode", "size-one-copy"]},
    "size-one-copy-guarded": {
        "ranks": 1, "guard": "size-one", "args": [*FAULT, "--fault-mode", "size-one-copy"],
    },
    "nudge": {"ranks": 1, "args": [*FAULT, "--fault-mode", "nudge"]},
    "nudge-masked": {
        "ranks": 1,
        "mask": sorted(set(from_policy("mindformers", LAYERS).edge_ids()) - {FAULT_EDGE}),
        "args": [*FAULT, "--fault-mode", "nudge"],
    },
}
# An msrun spends most of its time waiting on its cluster (start-up, a 5 s exit poll): overlap.
CONCURRENT_RUNS = 4


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """All RUN_SPECS, started together on first use and shared by the tests below."""
    root = tmp_path_factory.mktemp("mindspore-runs")
    with ThreadPoolExecutor(max_workers=CONCURRENT_RUNS) as pool:
        futures = {
            name: pool.submit(run_workload, root, name, **spec) for name, spec in RUN_SPECS.items()
        }
        yield lambda name: futures[name].result()


def _edge_ids(graph: dict) -> set[str]:
    return {e["id"] for e in graph["edges"]}


@mindspore_run
def test_one_rank_discovers_the_mindformers_chain_every_edge_size_one(runs):
    run = runs("reference")
    graph = run.graph()
    assert _edge_ids(graph) == set(from_policy("mindformers", LAYERS).edge_ids())
    assert {n["name"]: n["shard_size"] for n in graph["nodes"] if n["kind"] != "root"} == {
        "embedding": 1, "decoder.layers.0": 1, "decoder.layers.1": 1,
        "decoder.final_layernorm": 1, "output_layer": 1,
    }
    probe = run.probe()
    extra = probe["hyper_parallel"]["edges"]
    for edge in _edge_ids(graph):
        assert probe["edges"][edge]["issued"] == STEPS
        assert extra[edge]["async_unshards"] > 0  # the redundant local copies of the bug
    result = audit_run_dir(run.dir)
    assert (result["guard"], result["ok"]) == ("absent", False)
    assert set(result["size_one_edges_unsharding"]) == _edge_ids(graph)
    # At world size one every edge is size-one, and that is the only failing kind.
    assert result["order_recorded"]
    assert failing_findings(result) == {("size-one", edge) for edge in _edge_ids(graph)}


@mindspore_run
def test_one_rank_guard_stops_every_async_unshard_and_the_size_one_drift(runs):
    reference = runs("reference")
    assert runs("size-one-copy").metrics() != reference.metrics()
    guarded = runs("size-one-copy-guarded")
    probe = guarded.probe()
    assert all(n == {"async_unshards": 0, "already_unsharded": 0}
               for n in probe["hyper_parallel"]["edges"].values())
    assert {c["guarded"] for c in probe["edges"].values()} == {STEPS}
    assert guarded.metrics() == reference.metrics()  # bitwise: the drift is gone
    assert "nudged 0 times" in guarded.worker_log()
    result = audit_run_dir(guarded.dir)
    assert (result["guard"], result["ok"]) == ("present", True)


@mindspore_run
def test_masking_the_faulty_backward_edge_removes_the_drift(runs):
    reference = runs("reference")
    drifting = runs("nudge")
    steps_differing = [k for k, row in reference.metrics().items() if drifting.metrics()[k] != row]
    assert steps_differing and min(steps_differing)[0] <= 2
    masked = runs("nudge-masked")  # every edge on but the faulty one
    assert masked.metrics() == reference.metrics()
    # The workload leaves each shard's gradient where hyper-parallel does, so the adapter
    # digests it: the drift shows in the digests no later than in the metrics, and the
    # masked run's digests equal the reference's.
    digests = compare_run_digests(reference.dir, drifting.dir,
                                   metric_first_diff=min(steps_differing)[0])
    assert digests.records_compared >= STEPS and not digests.problems
    assert digests.first_diff_step is not None and digests.lead_steps >= 0
    same = compare_run_digests(reference.dir, masked.dir)
    assert same.first_diff_step is None and same.records_differing == 0
    counts = masked.probe()["edges"][FAULT_EDGE]
    assert (counts["issued"], counts["masked"]) == (0, STEPS)
    assert masked.probe()["hyper_parallel"]["edges"][FAULT_EDGE]["async_unshards"] == 0


@mindspore_run
def test_older_lineage_two_ranks_prefetch_gathers_and_every_rank_digests(runs):
    """hyper_parallel.hsdp's lineage over 2 ranks: prefetch_unsharded() starts real
    AllGathers (never read as lost prefetch), and param holds the digested tensors."""
    run = runs("older-two-ranks")
    assert run.graph(0) == run.graph(1)
    assert _edge_ids(run.graph()) == set(from_policy("mindformers", LAYERS).edge_ids())
    for rank in (0, 1):
        probe = run.probe(rank)
        units = probe["hyper_parallel"]["units"]
        assert {u["lineage"] for u in units.values()} == {"hsdp"}
        assert {u["shard_size"] for u in units.values() if u["params"]} == {2}
        assert all(e["async_unshards"] > 0 for e in probe["hyper_parallel"]["edges"].values())
        assert probe["digests"]["fewest_tensors"] > 0 and probe["digests"]["gradients"] > 0
    result = audit_run_dir(run.dir)
    assert result["real_prefetch_lost"] == [] and result["size_one_edges"] == []
    assert result["guard"] != "present" and result["ok"]


@mindspore_run
def test_older_lineage_one_rank_registers_no_prefetch_hooks_and_says_why(runs):
    run = runs("older-one-rank")
    probe = run.probe()
    assert probe["hyper_parallel"]["no_prefetch_hooks"] == hp.NO_HOOKS
    assert not (run.dir / "graph.rank0.json").exists()
    assert "registered no prefetch hooks" in (run.dir / "msrun.log").read_text() + run.worker_log()


@mindspore_run
def test_two_ranks_no_unit_is_size_one_and_the_guard_keeps_all_gathers(runs):
    # The later parameter line (no shard_size): the guard must read shard_world_size.
    run = runs("two-ranks-guarded")
    assert run.graph(0) == run.graph(1)
    for rank in (0, 1):
        probe = run.probe(rank)
        units = probe["hyper_parallel"]["units"]
        assert {u["shard_size"] for name, u in units.items() if name != "root"} == {2}
        assert {u["params_with_shard_size"] for u in units.values()} == {0}
        assert {c["guarded"] for c in probe["edges"].values()} == {0}
        assert all(c["issued"] == STEPS for c in probe["edges"].values())
        assert all(n["async_unshards"] > 0 for n in probe["hyper_parallel"]["edges"].values())
        assert len(set(probe["plan_hashes"])) == 1
    metrics = run.metrics()
    assert {rank for _, rank in metrics} == {0, 1}
    assert all(metrics[(s, 0)]["loss"] == metrics[(s, 1)]["loss"] for s in range(1, STEPS + 1))
    # At world size two no edge is size-one (the guard had nothing to act on), nothing fails.
    result = audit_run_dir(run.dir)
    assert result["ok"] is True and result["order_recorded"]
    assert len(_edge_ids(run.graph())) == 7
    assert not [f for f in result["findings"] if f["kind"] == "size-one"] and not failing_findings(result)


@mindspore_run
def test_audit_catches_a_build_guard_that_disables_real_prefetch(runs):
    run = runs("two-ranks-pitfall")
    result = audit_run_dir(run.dir)
    assert (result["guard"], result["ok"]) == ("disables-real-prefetch", False)
    assert set(result["real_prefetch_lost"]) == _edge_ids(run.graph())
    assert "decoder.layers.0" in result["pitfall_units"]


@mindspore_run
def test_msrun_jobs_get_every_signal_from_the_optimizer_call_alone(runs):
    """The workload calls report_step only for its metrics line: boundaries, digests, order and
    step times come from the optimizer Cell's call, on both ranks."""
    run = runs("two-ranks-guarded")
    for rank in range(2):
        probe = run.probe(rank)
        assert probe["step_source"] == "optimizer" and probe["steps_counted"] == STEPS
        assert [s for s, _ in probe["step_seconds"]] == list(range(1, STEPS + 1))
        assert probe["step_notes"] == []  # report_step agreed with the optimizer's count
        assert (run.dir / f"order.rank{rank}.jsonl").read_text().count("\n") == min(STEPS, 3)
    ranks = {json.loads(line)["rank"] for line in rank_lines(run.dir, "digests")}
    assert ranks == {0, 1}


@mindspore_run
def test_a_nudged_parameter_is_localized_to_the_target_of_its_edge(runs):
    from bisect_prefetch.metrics.localize import judge_digests, units_in_graph

    reference, nudged = runs("reference"), runs("nudge")
    verdict = judge_digests(reference.dir, nudged.dir, units=units_in_graph(
        nudged.dir / "graph.rank0.json"), ranks=1)
    where = verdict.localization
    assert where is not None and where.step == 1, verdict
    assert (where.unit, where.rule) == ("decoder.layers.0", "values")


