"""A stand-in for a sharded engine around a script that has none: ``python gated.py SCRIPT ARGS``.

A job must show that it applied a run's mask (judge/merge.mask_not_applied): FSDP2's hooks send
every prefetch through the in-job adapter's gate. This test device does the same for the two
edges of a 2-unit chain (the static policy ``fsdp2-chain`` with 2 layers), once, then runs
SCRIPT as ``__main__`` with ARGS: tests of something else (reuse, resume) bisect a job that
only writes metrics.
"""

from __future__ import annotations

import os
import runpy
import sys

from bisect_prefetch.adapters import session  # on the job's path, as for every job

EDGES = ("fwd:layers.0->layers.1", "bwd:layers.1->layers.0")


def main() -> None:
    script, *args = sys.argv[1:]
    gate = session()
    if gate is not None:  # no plan, no gate
        for edge in EDGES:
            gate.prefetch(edge, target_shard_size=2, target_module=None, run=lambda: True)
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python SCRIPT` would have it
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
