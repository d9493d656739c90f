"""The prefetch graph of an experiment: from a static policy, or learned from a real run.

graph: {source: runtime} runs the job once for a step under the recorder with
no mask (change nothing, only record) and reads the graph the ranks agreed
on. The run is journaled like any other, so the graph is learned once per
experiment and reused afterwards.
"""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from bisect_prefetch import graph as graphs
from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.experiment import Experiment
from bisect_prefetch.judge.merge import GRAPH_FILE, PROBE_FILE
from bisect_prefetch.runs.execute import Runner
from bisect_prefetch.runs.workloads import has_prefetch_graph
from bisect_prefetch.vocab import STDERR_FILE
from bisect_prefetch.workloads import mindformers

DISCOVERY_STEPS = 1


def static_graph(experiment: Experiment) -> graphs.PrefetchGraph:
    source = experiment.graph
    layers = source.layers or (experiment.workload.layers if experiment.workload else None)
    if layers is None:
        raise BisectPrefetchError("graph source static needs graph.layers (no built-in workload)")
    return graphs.from_policy(source.policy, layers, inner=source.inner)


def discover_graph(runner: Runner, console: Console | None = None) -> graphs.PrefetchGraph:
    """The experiment's graph; for a runtime source, one short recorded run (or its journal).

    The runner learns its edges: a later run whose mask switches one off must show that
    the mask was applied (judge/merge.mask_not_applied)."""
    graph = _find_graph(runner, console)
    runner.graph_edges = frozenset(graph.edge_ids())
    return graph


def _find_graph(runner: Runner, console: Console | None) -> graphs.PrefetchGraph:
    experiment = runner.experiment
    if experiment.graph.source == "static":
        return static_graph(experiment)
    if not has_prefetch_graph(experiment):
        if console is not None:
            console.print(f"-> {mindformers.NO_PREFETCH_GRAPH}", markup=False)
        return graphs.PrefetchGraph()
    key = runner.key("discover", mask=None, guard="none", steps=DISCOVERY_STEPS, index=0,
                     stress=False)
    if console is not None and not runner.holds(key):
        console.print(f"discovering the prefetch graph: one {DISCOVERY_STEPS}-step run "
                      "under the recorder...", markup=False)
    out = runner.run(key, label="discover")
    run_dir = runner.state.run_dir(out.run_id)
    said = engine_says(run_dir)  # the adapter's own word first: it names the cause
    if said is not None:
        raise BisectPrefetchError(f"graph discovery run {out.run_id}: {said}")
    if not out.usable:
        raise BisectPrefetchError(
            f"graph discovery run {out.run_id} ended in {out.outcome} ({out.reason}); "
            f"see {run_dir / STDERR_FILE}"
        )
    path = run_dir / GRAPH_FILE
    if not path.is_file():
        raise BisectPrefetchError(
            f"graph discovery run {out.run_id} recorded no prefetch graph: is the job using a "
            f"supported FSDP engine with the adapter loaded? see {run_dir / STDERR_FILE}"
        )
    graph = graphs.PrefetchGraph.load(path)
    if console is not None:
        how = "from the journal" if out.reused else f"in {out.wall_s:.1f}s"
        console.print(f"-> {len(graph.nodes())} units, {len(graph)} edges "
                      f"(run {out.run_id}, {how})", markup=False)
    return graph



def engine_says(run_dir: Path) -> str | None:
    """Why an engine's adapter learned no usable graph, in its own words (the probe's
    hyper_parallel record: a version it does not recognize, or no prefetch hooks because
    every unit has shard size 1); None when it says nothing."""
    try:
        merged = json.loads((Path(run_dir) / PROBE_FILE).read_text())
        records = [probe.get("hyper_parallel") or {} for probe in merged["ranks"].values()]
    except (OSError, ValueError, KeyError, AttributeError, TypeError):
        return None
    for key in ("unrecognized", "no_prefetch_hooks"):
        for record in records:
            if isinstance(record, dict) and isinstance(record.get(key), str):
                return record[key]
    return None


def static_mismatch(experiment: Experiment, run_dir: Path, *, shown: int = 4) -> str | None:
    """What a static graph gets wrong about the job, from one run's probe; None if nothing.

    A static policy describes a framework version; the job may be another. An edge the job
    fires that the graph does not list is masked in every run (all-on silently drops it),
    and an edge the graph lists that never fires is searched for nothing.
    """
    if experiment.graph.source != "static":
        return None
    try:
        probe = json.loads((Path(run_dir) / PROBE_FILE).read_text())
        fired = {edge for edge, counts in (probe.get("edges") or {}).items()
                 if isinstance(counts, dict) and counts.get("fired", 0) > 0}
    except (OSError, ValueError, AttributeError):
        return None  # no probe (nothing was recorded): nothing to compare
    listed = set(static_graph(experiment).edge_ids())
    unlisted, silent = sorted(fired - listed), sorted(listed - fired)
    if not unlisted and not silent:
        return None

    def some(edges: list[str]) -> str:
        more = f", ... {len(edges) - shown} more" if len(edges) > shown else ""
        return ", ".join(edges[:shown]) + more

    policy = experiment.graph.policy
    parts = []
    if unlisted:
        parts.append(f"the job fired {len(unlisted)} edge(s) the graph does not list, masked in "
                     f"every run, all-on included ({some(unlisted)})")
    if silent:
        parts.append(f"{len(silent)} of its {len(listed)} edges never fired ({some(silent)})")
    return (f"warning: the static {policy} graph does not match this job: " + "; ".join(parts)
            + ". Use graph: {source: runtime} to learn the job's own graph")
