"""A stand-in job that writes gradient digests: the same metrics every run, digests per mode.

The first run of a group (run id ending in k0) always writes clean digests; later runs
follow the mode (argv[1]):
- clean: the same digests;
- late-diff: layers.1's digests differ from step 3 on (the printed metrics never do);
- cut: rank 1's digest file ends mid-line;
- silent-rank: rank 1 writes no digests;
- other-params: rank 0 digests one parameter under another name.
"""

import json
import os
import sys

from bisect_prefetch.adapters.plan import plan_hash

PARAMS = ("layers.0.w", "layers.1.w", "layers.1.b", "output.weight")


def main() -> None:
    mode = sys.argv[1]
    with open(os.environ["BISECT_PREFETCH_PLAN"]) as f:
        plan = json.load(f)
    out, steps = plan["out_dir"], plan["steps"]
    later = not plan["run_id"].endswith("k0")
    graph = {"nodes": [{"name": f"layers.{i}", "kind": "layer", "order": i, "shard_size": 2}
                       for i in range(2)], "edges": []}
    for rank in (0, 1):
        with open(os.path.join(out, f"graph.rank{rank}.json"), "w") as f:
            json.dump(graph, f)
        with open(os.path.join(out, f"probe.rank{rank}.json"), "w") as f:
            json.dump({"rank": rank, "plan_hash": plan_hash(plan), "edges": {}}, f)
    lines: dict[int, list[str]] = {0: [], 1: []}
    for step in range(1, steps + 1):
        for rank in (0, 1):
            if later and mode == "silent-rank" and rank == 1:
                continue
            for param in PARAMS:
                digest, norm = f"{step:04d}{rank}{param}", 1.0 + step
                if later and mode == "late-diff" and step >= 3 and param.startswith("layers.1"):
                    digest, norm = digest + "x", norm * (1.5 if param.endswith("w") else 1.01)
                if later and mode == "other-params" and rank == 0 and param == "output.weight":
                    param = "output.bias"
                lines[rank].append(json.dumps({"step": step, "rank": rank, "param": param,
                                               "digest": digest, "norm": norm, "max_abs": 0.5}) + "\n")
    for rank, rank_lines in lines.items():  # each rank's own file, as the adapter writes them
        text = "".join(rank_lines)
        if later and mode == "cut" and rank == 1:
            text = text[:-20]
        if text:
            with open(os.path.join(out, f"digests.rank{rank}.jsonl"), "w") as f:
                f.write(text)
    with open(os.path.join(out, "metrics.jsonl"), "w") as f:
        for step in range(1, steps + 1):
            for rank in (0, 1):
                f.write(json.dumps({"step": step, "rank": rank, "loss": 2.0 / step}) + "\n")


if __name__ == "__main__":
    main()
