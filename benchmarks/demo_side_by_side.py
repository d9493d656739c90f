"""`make demo`'s last lines: the bisection with segments beside the same one with one mask
a run, from their bisect JSONs (docs/contract.md): verdict, training runs launched (the
golden runs included, the graph's discovery run apart), trials, steps and time to the
verdict.

    python -m benchmarks.demo_side_by_side SEGMENTS.json ONE_MASK.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _figures(path: str) -> dict:
    data = json.loads(Path(path).read_text())
    return {"verdict": f"{data['verdict']} {','.join(data['minimal_set'])}".strip(),
            "runs launched": data["runs_launched"] + data["runs_reused"],
            "trials": data["runs_used"], "steps": data["steps_used"],
            "time to verdict": f"{data.get('elapsed_s', 0):.0f} s"}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    segments, one = (_figures(p) for p in argv)
    print(f"{'':<16} {'segments':>44} {'one mask a run':>44}")
    for key in segments:
        print(f"{key:<16} {segments[key]!s:>44} {one[key]!s:>44}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
