"""The one error type the library raises for user mistakes and bad input.

Only cli.py prints errors and exits: it turns a BisectPrefetchError into a
one-line message on stderr and exit code 2 (exit code 1 is for findings).
"""


class BisectPrefetchError(Exception):
    """A usage or input error: bad file, bad selector, missing metrics, ..."""


class ToolFailure(Exception):
    """bisect-prefetch itself failed inside a job (its in-job code): not the user's input.

    cli.py turns it into one line (the message names the rank's log) and exit code 3."""


class ResumableError(BisectPrefetchError):
    """Runs cannot go on here, but the command can go on elsewhere with what it has: the
    journal holds every finished run (the Slurm allocation it ran in ended, or lost too many
    nodes). A command adds how to resume; `where` says where (" in a new allocation")."""

    def __init__(self, message: str, *, where: str = "") -> None:
        super().__init__(message)
        self.where = where
