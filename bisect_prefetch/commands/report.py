"""`bisect-prefetch report`: rebuild a state dir's HTML report from its journal and run dirs.

Given the state dir of several experiments (`--state-dir` of a bisect, which holds one
directory an experiment), it lists them and says which to pass. What is missing from an
experiment's dir (no bisection, unreadable journal lines, run dirs deleted by hand) is
said in one line and exits 2, after the page is written with what is there.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.files import check_writable
from bisect_prefetch.report.html import build_report
from bisect_prefetch.runs.store import JOURNAL


def report(state: Path, *, html_out: Path | None, console: Console) -> int:
    if not state.is_dir():
        raise BisectPrefetchError(f"no such state dir: {state}")
    if not (state / JOURNAL).exists() and (inside := experiments_in(state)):
        listed = "; ".join(f"{path.name} ({runs} run(s))" for path, runs in inside)
        raise BisectPrefetchError(
            f"{state} holds the state of {len(inside)} experiment(s), one directory each: "
            f"{listed}; pass one, e.g. bisect-prefetch report {inside[0][0]}")
    if html_out is not None:
        check_writable(html_out)
    problems: list[str] = []
    console.print(f"wrote {build_report(state, html_out, problems=problems)}", markup=False)
    if problems:
        raise BisectPrefetchError("; ".join(problems))
    return 0


def experiments_in(state: Path) -> list[tuple[Path, int]]:
    """The experiments' dirs directly under a state dir, with the lines of their journals."""
    found = []
    for path in sorted(p for p in state.iterdir() if p.is_dir()):
        journal = path / JOURNAL
        if journal.is_file():
            try:
                runs = sum(1 for line in journal.read_bytes().split(b"\n")
                           if line.strip() and b"\"submitted\"" not in line)
            except OSError:
                runs = 0
            found.append((path, runs))
    return found
