"""`bisect-prefetch compare`: two runs' metrics (and gradient digests), side by side."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from bisect_prefetch.commands.common import write_json
from bisect_prefetch.metrics.compare import compare_paths
from bisect_prefetch.report.compare_table import compare_tables


def compare(a: Path, b: Path, *, fmt: str | None, console: Console,
            json_out: Path | None = None, allow_truncated: bool = False) -> int:
    """Print the comparison; exit code 0 identical, 1 different or one run stops before the
    other (unless allow_truncated: then the common steps decide)."""
    result = compare_paths(a, b, fmt, allow_truncated=allow_truncated)
    data = result.to_json()
    for table in compare_tables(data):
        console.print(table)
    paths = {"a": a, "b": b}
    for side, path in paths.items():
        # A truncated or garbled log still compares on what it holds: say what was skipped.
        cut_only = data["truncated"] is not None and side in data["truncated"]["cut_mid_line"]
        if (unread := data["lines_unread"][side]) and not (cut_only and unread == 1):
            console.print(f"note: {unread} line(s) of {path} could not be read "
                          "(truncated or garbled) and were left out", markup=False, soft_wrap=True)
        if repeated := data["steps_repeated"][side]:
            console.print(f"note: {path} gives {repeated} value(s) for steps it gave before (a resumed run, "
                          "or several ranks in one log: compare per-rank logs then); the last one counts",
                          markup=False, soft_wrap=True)
    if data["gaps"]:
        console.print(f"-> not a clean comparison: {data['gaps']}", markup=False, soft_wrap=True)
    for line in truncation_lines(data["truncated"], allowed=allow_truncated):
        console.print(line, markup=False, soft_wrap=True)
    if json_out is not None:
        write_json(json_out, data, console)
    return 1 if result.finding else 0


def truncation_lines(truncated: dict | None, *, allowed: bool) -> list[str]:
    """What `compare` says when a run stops before the other or a log stops mid-line."""
    if truncated is None:
        return []
    head = "note" if allowed else "truncated"
    lines = []
    last, common = truncated["last_step"], truncated["last_common_step"]
    if last["a"] != last["b"]:
        short, other = ("a", "b") if (last["a"] or 0) < (last["b"] or 0) else ("b", "a")
        lines.append(f"{head}: {short.upper()} stops before {other.upper()}: last common step {common}, "
                     f"A's last step {last['a']}, B's last step {last['b']}")
    elif common != last["a"]:
        lines.append(f"{head}: some rank or metric stops before the others: last common step {common}, "
                     f"last step {last['a']}")
    for side, cut in truncated["cut_mid_line"].items():
        lines.append(f"{head}: {side.upper()}'s log stops mid-line: {cut['file']} line {cut['line']}: {cut['text']!r}")
    lines.append("compared the common steps (--allow-truncated)" if allowed
                 else "-> not a clean comparison (--allow-truncated compares the common steps)")
    return lines
