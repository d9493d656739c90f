"""A user's job on a torch that lacks one name: ``python torch_lacking.py NAME SCRIPT ARGS...``.

A test device, as a hostile user or an old torch would be: it deletes the attribute NAME (a
dotted name under torch, e.g. ``torch.cpu.Stream.record_event``, which torch 2.6 and 2.7 lack)
before anything imports FSDP, then runs SCRIPT as ``__main__`` with ARGS. It imports nothing
of bisect-prefetch.
"""

from __future__ import annotations

import importlib
import os
import runpy
import sys


def main() -> None:
    name, script, *args = sys.argv[1:]
    owner_name, attribute = name.rsplit(".", 1)
    parts = owner_name.split(".")
    owner = importlib.import_module(parts[0])
    for part in parts[1:]:
        owner = getattr(owner, part)
    delattr(owner, attribute)
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python SCRIPT` would have it
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
