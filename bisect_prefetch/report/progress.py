"""Progress for long work (bisections, matrices): which subset, run k of n, divergences so far,
elapsed time and an ETA from measured run times.

On a terminal it is a live rich display; elsewhere (CI logs, pipes) it prints
one plain line per event, so logs stay readable and greppable. Runs reused
from the journal take no time: they count as done but not in the timing.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn

from bisect_prefetch.vocab import CLEAN, DIVERGED


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class RunProgress:
    """Told about groups and runs by the bisection driver or the matrix; shows them.

    total_runs, when the caller knows it (a matrix does), makes the ETA cover
    the whole job; otherwise it covers the current group.
    """

    def __init__(
        self,
        console: Console | None = None,
        *,
        total_runs: int | None = None,
        live: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.console = console or Console(highlight=False)
        self.total_runs = total_runs
        self.live = self.console.is_terminal if live is None else live
        self.clock = clock
        self.started_at = clock()
        self.group_name = ""
        self.group_runs = 0
        self.group_done = 0
        self.runs_done = 0
        self.divergences = 0
        self.run_seconds: list[float] = []
        self._bar: Progress | None = None
        self._task = None

    # -- measurements -----------------------------------------------------
    def elapsed(self) -> float:
        return self.clock() - self.started_at

    def mean_run_seconds(self) -> float | None:
        return sum(self.run_seconds) / len(self.run_seconds) if self.run_seconds else None

    def eta(self) -> float | None:
        """Seconds left: runs left times the mean measured run time (None before any run)."""
        mean = self.mean_run_seconds()
        if mean is None:
            return None
        if self.total_runs is not None:
            left = self.total_runs - self.runs_done
        else:
            left = self.group_runs - self.group_done
        return max(left, 0) * mean

    def status_text(self) -> str:
        return (f"{self.divergences} diverged so far, elapsed {fmt_duration(self.elapsed())}, "
                f"ETA {fmt_duration(self.eta())}")

    # -- events -----------------------------------------------------------
    def start_group(self, name: str, runs: int) -> None:
        self.group_name, self.group_runs, self.group_done = name, runs, 0
        if self.live:
            self._open_bar()
            self._bar.update(self._task, description=name, total=runs, completed=0,
                             status=self.status_text())
        else:
            self._line(f"{name}: {runs} runs")

    def run_started(self, k: int) -> None:
        if self.live:
            self._bar.update(self._task, status=f"run {k}/{self.group_runs}; {self.status_text()}")
        else:
            self._line(f"  run {k}/{self.group_runs} started")

    def run_finished(self, k: int, outcome: str, seconds: float, *, reused: bool = False) -> None:
        self.group_done += 1
        self.runs_done += 1
        if outcome == DIVERGED:
            self.divergences += 1
        if not reused:
            self.run_seconds.append(seconds)
        if self.live:
            self._bar.update(self._task, completed=self.group_done, status=self.status_text())
            if outcome not in (DIVERGED, CLEAN):  # a failed run and why: kept above the bar
                self._bar.console.print(f"  run {k}/{self.group_runs} {outcome}", markup=False,
                                        highlight=False, soft_wrap=True)
        else:
            how = "reused from the journal" if reused else f"in {seconds:.1f}s"
            self._line(f"  run {k}/{self.group_runs} {outcome} {how} ({self.status_text()})")

    def reuse(self, reused: int, refused: list[tuple[str, str]]) -> None:
        """The group's runs taken from the journal, and the first reason others were not."""
        if reused:
            self._say(f"  {reused} run(s) reused from the journal")
        if refused:
            self._say(f"  {len(refused)} run(s) of the journal run again: {refused[0][1]}")

    def _say(self, text: str) -> None:
        if self.live and self._bar is not None:
            self._bar.console.print(text, markup=False, highlight=False, soft_wrap=True)
        else:
            self._line(text)

    def end_group(self, verdict: str) -> None:
        text = f"{self.group_name}: -> {verdict} ({self.group_done} runs)"
        if self.live:
            self._bar.console.print(text, markup=False)
        else:
            self._line(text)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def __enter__(self) -> RunProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- output -----------------------------------------------------------
    def _open_bar(self) -> None:
        if self._bar is not None:
            return
        self._bar = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("run {task.completed}/{task.total}"),
            TextColumn("{task.fields[status]}"),
            console=self.console,
            transient=True,
        )
        self._task = self._bar.add_task("", total=1, status="")
        self._bar.start()

    def _line(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)
