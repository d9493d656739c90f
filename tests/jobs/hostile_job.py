"""A user's training script whose numbers hang on a flag it reads one of the ways a user's
job reads its inputs (argv[1] names the way; the tests change the flag the same way).

With the flag on, every step's loss gets OS entropy, so two runs differ: a change of the
flag turns a consistent experiment into a diverged one, which a run of the old job must not
hide. A flags file may also hold a `scale` of every loss (a deterministic change). And it
has a prefetch culprit of its own, as tests/jobs/fake_job.py: with `bwd:layers.1->layers.0`
in the plan's mask, entropy from step 2 on. The ways (where the flag comes from):

- env-dir: a file in a data dir named only by $HOSTILE_DATA;
- config-value: a file a config beside the script names by its path;
- shell-var: the shell variable $HOSTILE_NOISE;
- symlink: data/latest/flags.json, latest a symlink to a run's dir (symlink-scale: only
  its scale);
- fork: a worker forked as a DataLoader's is (multiprocessing, fork) reads flags.json;
- cat: `cat flags.json` (another program);
- sqlite: a SQLite database, flags.db;
- memmap: a numpy.memmap of flags.bin opened r+;
- exit-after-step-1: flags.json read after step 1, the job ending with os._exit;
- many-files: the 10,001st file it opens, files/f10000;
- override-file: override.json beside the script, when it exists;
- override-module: a module hostile_override beside the script, when it exists;
- module: a module hostile_flag found on the job's path (PYTHONPATH, or an installed package);
- size-mtime: flags.json, which the test edits keeping its size and mtime;
- transient-failure: no flag; the job fails as on an NCCL timeout while $HOSTILE_DATA/down
  is there.

It imports nothing of bisect-prefetch: the plan's out_dir is read as any job reads a path it
is given. It writes what an adapter that hooks its engine writes (the graph it ran and a probe
of the plan it applied), as tests/jobs/fake_job.py does: a run whose mask was never applied
gives no verdict.
"""

import hashlib
import json
import os
import random
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


CULPRIT = "bwd:layers.1->layers.0"


def _flags(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def _json_flag(path: str) -> bool:
    return bool(_flags(path)["noise"])


def _forked_read(conn) -> None:
    conn.send(_json_flag(os.path.join(HERE, "flags.json")))


def flag(way: str) -> bool:
    """The flag, read the given way."""
    if way == "env-dir":
        return _json_flag(os.path.join(os.environ["HOSTILE_DATA"], "flags.json"))
    if way == "config-value":
        with open(os.path.join(HERE, "conf.json")) as f:
            return _json_flag(json.load(f)["flags"])
    if way == "shell-var":
        return os.environ.get("HOSTILE_NOISE") == "1"
    if way == "symlink":
        return _json_flag(os.path.join(HERE, "data", "latest", "flags.json"))
    if way == "symlink-scale":
        return False
    if way == "fork":
        import multiprocessing

        parent, child = multiprocessing.get_context("fork").Pipe()
        worker = multiprocessing.get_context("fork").Process(target=_forked_read, args=(child,))
        worker.start()
        value = parent.recv()
        worker.join()
        return value
    if way == "cat":
        out = subprocess.run(["cat", os.path.join(HERE, "flags.json")], capture_output=True,
                             text=True, check=True).stdout
        return bool(json.loads(out)["noise"])
    if way == "sqlite":
        import sqlite3

        with sqlite3.connect(os.path.join(HERE, "flags.db")) as db:
            return bool(db.execute("select noise from flags").fetchone()[0])
    if way == "memmap":
        import numpy

        return bool(numpy.memmap(os.path.join(HERE, "flags.bin"), mode="r+", dtype="uint8")[0])
    if way == "many-files":
        value = False
        for i in range(10_001):
            with open(os.path.join(HERE, "files", f"f{i}")) as f:
                value = f.read().strip() == "1"
        return value
    if way == "override-file":
        path = os.path.join(HERE, "override.json")
        return _json_flag(path) if os.path.exists(path) else False
    if way == "override-module":
        try:
            import hostile_override
        except ImportError:
            return False
        return bool(hostile_override.NOISE)
    if way == "module":
        import hostile_flag

        return bool(hostile_flag.NOISE)
    if way == "transient-failure":  # fails as on an NCCL timeout while $HOSTILE_DATA/down is there
        if os.path.exists(os.path.join(os.environ["HOSTILE_DATA"], "down")):
            print("Watchdog caught collective operation timeout: WorkNCCL(OpType=ALLREDUCE) ran "
                  "for 600000 milliseconds before timing out", file=sys.stderr)
            raise SystemExit(1)
        return False
    if way == "size-mtime":
        return _json_flag(os.path.join(HERE, "flags.json"))
    raise SystemExit(f"unknown way {way}")


def _acknowledge(plan: dict, out: str) -> None:
    """The graph and the probe of an engine's hooks: the plan (its sha256 over sorted keys,
    as the adapter hashes it) applied, each edge of its mask gone through the gate once."""
    graph = {"nodes": [{"name": f"layers.{i}", "kind": "layer", "order": i, "shard_size": 2}
                       for i in range(2)], "edges": []}
    with open(os.path.join(out, "graph.rank0.json"), "w") as f:
        json.dump(graph, f)
    canonical = json.dumps(plan, sort_keys=True, separators=(",", ":")).encode()
    probe = {"rank": 0, "plan_hash": hashlib.sha256(canonical).hexdigest(),
             "edges": {e: {"fired": 1, "issued": 1} for e in sorted(plan.get("mask") or [])}}
    with open(os.path.join(out, "probe.rank0.json"), "w") as f:
        json.dump(probe, f)


def main() -> None:
    way = sys.argv[1]
    with open(os.environ["BISECT_PREFETCH_PLAN"]) as f:
        plan = json.load(f)
    out, racy = plan["out_dir"], CULPRIT in (plan.get("mask") or [])
    _acknowledge(plan, out)
    late = way == "exit-after-step-1"
    noisy = False if late else flag(way)
    scale = _flags(os.path.join(HERE, "data", "latest", "flags.json")).get("scale", 1) if (
        way.startswith("symlink")) else 1
    rng = random.SystemRandom()
    with open(os.path.join(out, "metrics.jsonl"), "w") as f:
        for step in range(1, plan["steps"] + 1):
            if late and step == 2:
                noisy = _json_flag(os.path.join(HERE, "flags.json"))  # read after step 1
            loss = scale * 2.0 * 0.9 ** step + (rng.random() if noisy else 0.0)
            loss += 1e-3 * rng.random() if racy and step >= 2 else 0.0
            f.write(json.dumps({"step": step, "loss": round(loss, 6)}) + "\n")
            f.flush()
    if late:
        os._exit(0)  # no exit handlers: what it read must be on record already


if __name__ == "__main__":
    main()
