"""What every command does the same way: write an output file, stop on a signal, say how to
resume, and build every command line it prints from the options it was given (Given)."""

from __future__ import annotations

import json
import shlex
import signal
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from bisect_prefetch.errors import BisectPrefetchError, ResumableError
from bisect_prefetch.experiment import Experiment
from bisect_prefetch.files import check_writable, write_text_atomic
from bisect_prefetch.runs.store import StateDir
from bisect_prefetch.search.evidence import Settings

PROGRAM = "bisect-prefetch"
INTERRUPTED_LINE = "interrupted: finished runs are in the journal; to resume, run again:"


def write_text(path: Path, text: str, console: Console) -> None:
    """Write an output file the user asked for, and say so (never onto a state dir's files:
    check_writable says why)."""
    check_writable(path)
    write_text_atomic(path, text)
    console.print(f"wrote {path}", markup=False)


def check_outputs(*paths: Path | None, state_dir: Path | None = None, name: str | None = None) -> None:
    """Every output file asked for, checked before any run starts: a run's hours are not
    lost to a `--json` that cannot be written (or that would replace the journal)."""
    if state_dir is not None and name is not None:
        StateDir(state_dir, name)  # its journal and lock are no output's place
    for path in paths:
        if path is not None:
            check_writable(path)


def write_json(path: Path, data: Any, console: Console) -> None:
    write_text(path, json.dumps(data, indent=2) + "\n", console)


def command_line(*argv: str) -> str:
    """A command line to copy and paste: `bisect-prefetch ARGS`, quoted for a shell."""
    return shlex.join([PROGRAM, *argv])


@contextmanager
def resume_hint_on_interrupt(console: Console, resume: str) -> Iterator[None]:
    """On Ctrl-C or SIGTERM, print the command that resumes (once), then stop as before.
    When runs cannot go on here (a ResumableError), its one line ends with that command."""
    try:
        yield
    except KeyboardInterrupt:
        console.print(INTERRUPTED_LINE, markup=False)
        console.print(f"  {resume}", markup=False, soft_wrap=True)
        raise
    except ResumableError as exc:
        raise BisectPrefetchError(f"{exc}; to resume{exc.where}, run again: {resume}") from None


@contextmanager
def sigterm_stops_like_ctrl_c() -> Iterator[list[int]]:
    """While a command runs, SIGTERM (a scheduler, CI, `kill`) raises KeyboardInterrupt.

    Runs in flight are then killed, the journal keeps every finished run and
    the command prints how to resume, as for Ctrl-C. Further SIGTERMs are
    ignored so they cannot cut that cleanup short (SIGKILL still can, and
    loses no finished run). Yields a list that records the SIGTERM, if one
    came; the previous handler comes back afterwards.
    """
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received  # signal handlers can only be set from the main thread
        return

    def terminate(signum: int, frame: object) -> None:
        received.append(signum)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield received
    finally:
        signal.signal(signal.SIGTERM, previous)


# The options of each command that prints follow-up commands, by their keyword names, in the
# order a printed command gives them (tests/commands/test_cli_surface.py checks them against
# cli.py). A follow-up carries every option given that its own command accepts.
COMMAND_OPTIONS = {
    "aa": ("runs", "mask", "steps", "guard", "resume", "state_dir", "executor", "slots", "stress",
           "reuse", "no_reuse", "json"),
    "bisect": ("resume", "state_dir", "confidence", "max_runs", "executor", "slots", "stress",
               "segments", "reuse", "no_reuse", "explain", "json"),
    "explain": ("mask", "stress", "runs", "steps", "all_units", "resume", "state_dir",
                "json"),
    "matrix": ("resume", "state_dir", "executor", "slots", "stress", "reuse", "no_reuse", "junit",
               "markdown", "json"),
}
# Output files go only into the same command again: another command's --json must not
# overwrite the file the user asked this one for.
OUTPUT_OPTIONS = ("json", "junit", "markdown")


def reuse_options(reuse: bool | None) -> dict[str, bool | None]:
    """--reuse/--no-reuse as given (None: neither) in the keyword names of COMMAND_OPTIONS."""
    return {"reuse": True if reuse else None, "no_reuse": True if reuse is False else None}


@dataclass(frozen=True)
class Given:
    """A command as the user gave it: its name, its file argument and its options (None and
    False: not given). Every command it prints (resume, rerun, reproduce, explain) is built
    here, from the options actually given."""

    command: str
    target: str | Path
    values: Mapping[str, Any]

    def follow_up(self, command: str | None = None, **changes: Any) -> str:
        """The command line of a follow-up: this command again (resume, a narrower window)
        or another one; it carries every option given that the follow-up's command accepts
        (output files only into this command again), with changes over them."""
        name = command or self.command
        accepted = COMMAND_OPTIONS[name]
        values = {k: v for k, v in self.values.items()
                  if k in accepted and (name == self.command or k not in OUTPUT_OPTIONS)}
        values.update(changes)
        return command_line(name, str(self.target),
                            *options(**{k: values[k] for k in accepted if k in values}))


def options(**values: Any) -> list[str]:
    """`--name=value` for each option that was given (None and False are left out)."""
    argv = []
    for name, value in values.items():
        flag = "--" + name.replace("_", "-")
        items: Sequence[Any] = value if isinstance(value, list | tuple) else [value]
        for item in items:
            if item is True:
                argv.append(flag)
            elif item is not None and item is not False:
                argv.append(f"{flag}={item:g}" if isinstance(item, float) else f"{flag}={item}")
    return argv


def search_settings(experiment: Experiment, *, confidence: float | None,
                    max_runs: int | None) -> Settings:
    """The search's options, the command line's over the experiment file's, checked by the
    one check there is (search/evidence.Settings.of): called before anything runs, so a
    bad --confidence or --max-runs is said before a state dir is opened."""
    search = experiment.search
    return Settings.of(confidence=search.confidence if confidence is None else confidence,
                       max_runs=search.max_runs if max_runs is None else max_runs,
                       calibration_runs=None, all_off_runs=search.all_off_runs)


def repeated_steps_note(repeated: int) -> str | None:
    """Said once when a log gave several values for one step (several ranks printing into
    one stdout, as torchrun's children do): never a difference, but only one rank counts."""
    if not repeated:
        return None
    return (f"note: {repeated} value(s) for steps logged before (several ranks into one log without "
            "ranks, or a resumed run): the last value of each step is compared. To compare every "
            "rank, give each its own log: torchrun --log-dir {rank_log_dir} --redirects 3 (read "
            "per rank without more settings), or metrics.files naming the job's own per-rank files")
