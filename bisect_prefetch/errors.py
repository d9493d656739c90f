"""The one error type the library raises for user mistakes and bad input.

Only cli.py prints errors and exits: it turns a BisectPrefetchError into a
one-line message on stderr and exit code 2 (exit code 1 is for findings).
"""


class BisectPrefetchError(Exception):
    """A usage or input error: bad file, bad selector, missing metrics, ..."""
