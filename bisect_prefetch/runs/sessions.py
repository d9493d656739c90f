"""Which journaled runs a command may take instead of running them: its scope.

A session is one command's runs, named by the command and when it began
(``bisect/20261204T143355-4242-9f1c``); every run a command journals carries it (``session``).
By default a command takes only the runs it made itself: a run of an earlier command is
run again, because its job may have read something that changed in a way no check sees
(git bisect and Go's bisect keep nothing across sessions). ``--resume`` continues the
latest session of the same command and experiment: its finished runs are taken again
after the checks of runs/reuse.py, and the runs the command adds carry that session, so
a resume of a resume continues the same journal. ``--reuse`` takes any earlier command's
run after those checks. Runs journaled before sessions carry none: ``--resume`` continues
them as one session when the journal holds no other of the command.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Mapping, Sequence
from typing import Any

SESSION_FIELD = "session"  # the journal record's field
NOT_IN_SCOPE = "runs of earlier commands are taken again only with --reuse (or --resume, its own)"


class Scope:
    """One command's scope (command: aa, bisect, explain, matrix:NAME); its session is
    decided once, at the first state dir it opens (``decide``)."""

    def __init__(self, command: str, *, resume: bool = False, earlier: bool = False,
                 per_experiment: bool = True) -> None:
        self.command = command
        self.resume = resume
        self.earlier = earlier  # --reuse
        # whether --resume looks for a session of the same experiment (a matrix's cells
        # override it: any of its sessions)
        self.per_experiment = per_experiment
        # Unique even for two commands of one process in one second (a program calling ours).
        self.session: str | None = (f"{command}/{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-"
                                    f"{secrets.token_hex(2)}")
        self.resumed = False  # whether session is one found in the journal
        self._decided = False

    def decide(self, records: Sequence[Mapping[str, Any]], *, fingerprint: str | None) -> None:
        """The session this command's runs carry: with --resume, the latest of the same
        command (and experiment fingerprint, where given) in the journal, if any."""
        if self._decided:
            return
        self._decided = True
        if not self.resume:
            return
        legacy = False
        for record in reversed(records):
            session = record.get(SESSION_FIELD)
            if session is None:
                legacy = True
                continue
            if (str(session).partition("/")[0] == self.command and (
                    not self.per_experiment or fingerprint is None
                    or str(record.get("variant", "")).endswith("@" + fingerprint))):
                self.session, self.resumed = session, True
                return
        if legacy:  # a journal from before sessions: its runs are one session
            self.session, self.resumed = None, True

    def admits(self, record: Mapping[str, Any]) -> str | None:
        """None when the record is one this command may take (after the checks); else why not."""
        if self.earlier or (self.resumed and record.get(SESSION_FIELD) == self.session):
            return None
        return NOT_IN_SCOPE

    @property
    def takes_earlier(self) -> bool:
        """Whether runs of other commands or sessions may be taken (with the checks)."""
        return self.earlier or self.resumed
