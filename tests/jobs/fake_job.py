"""A tiny stand-in training job for engine tests: reads the plan, writes metrics.jsonl.

Its numbers follow the mask the way a prefetch fault would, without torch:
- `bwd:layers.1->layers.0` enabled: from step 3 on, a random nudge (OS
  entropy, like a race), so two runs differ;
- `fwd:layers.0->layers.1` enabled with mode `det`: every value shifted by a
  constant (a mask that changes the math deterministically);
- mode `two-causes` (on a graph of 3 layers): `bwd:layers.2->layers.1` is a second cause,
  the same nudge, enough alone.
Modes (argv[1]): clean, det, two-causes, crash, crash-when-fwd, hang, rank-graphs-differ, wrong-plan-hash,
graph-mode (a plan's schedule of several masks is refused, as under MindSpore graph mode),
first-run-drifts (the job's first run in its state dir drifts from step 4 on, whatever the
mask: background drift that hit the golden run).
"""

import json
import os
import random
import sys
import time

# The launcher puts this package on the job's PYTHONPATH, as for a real adapter.
from bisect_prefetch.adapters.plan import plan_hash

RANDOM_EDGE = "bwd:layers.1->layers.0"
DETERMINISTIC_EDGE = "fwd:layers.0->layers.1"
SECOND_RANDOM_EDGE = "bwd:layers.2->layers.1"


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "clean"
    with open(os.environ["BISECT_PREFETCH_PLAN"]) as f:
        plan = json.load(f)
    out = plan["out_dir"]
    mask = set(plan["mask"] or [])
    if mode == "crash" or (mode == "crash-when-fwd" and DETERMINISTIC_EDGE in mask):
        raise SystemExit(3)
    if mode == "hang":
        time.sleep(600)
    graph = {"nodes": [{"name": f"layers.{i}", "kind": "layer", "order": i, "shard_size": 2}
                       for i in range(2)], "edges": []}
    for rank in (0, 1):
        ranked = dict(graph, edges=[{"rank": rank}]) if mode == "rank-graphs-differ" else graph
        with open(os.path.join(out, f"graph.rank{rank}.json"), "w") as f:
            json.dump(ranked, f)
        recorded = "0" * 64 if mode == "wrong-plan-hash" and rank == 1 else plan_hash(plan)
        probe = {"rank": rank, "plan_hash": recorded,
                 "edges": {e: {"fired": 1, "issued": 1} for e in sorted(mask)}}
        if mode == "graph-mode" and plan.get("schedule"):
            probe["schedule_refused"] = "graph mode: hooks compiled once"
        with open(os.path.join(out, f"probe.rank{rank}.json"), "w") as f:
            json.dump(probe, f)
    rng = random.SystemRandom()
    first_run = os.path.join(os.path.dirname(os.path.abspath(out)), ".first-run-drifted")
    drifts = mode == "first-run-drifts" and not os.path.exists(first_run)
    if drifts:
        open(first_run, "w").close()
    loss = 2.0
    with open(os.path.join(out, "metrics.jsonl"), "a") as f:
        for step in range(1, plan["steps"] + 1):
            loss *= 0.9
            racy = RANDOM_EDGE in mask or (mode == "two-causes" and SECOND_RANDOM_EDGE in mask)
            if racy and step >= 3:
                loss += 1e-9 * (1 + rng.random())
            if drifts and step >= 4:
                loss += 1e-9 * (1 + rng.random())
            value = loss + 0.5 if mode == "det" and DETERMINISTIC_EDGE in mask else loss
            for rank in (0, 1):
                f.write(json.dumps({"step": step, "rank": rank, "loss": value}) + "\n")
            f.flush()
            time.sleep(0.02)


if __name__ == "__main__":
    main()
