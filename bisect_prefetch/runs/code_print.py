"""Which program a job runs, as a short hash for its run key: the command's first word,
found on the job's PATH and made absolute (a venv's python is a link: kept as the link).

What the program then reads (its code, its packages, the numerics variables) is not in the
key: the job records it itself (adapters/manifest.py) and a finished run is reused only
while all of it is the same (runs/reuse.py), which can say what changed; a key that
differs could not.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Sequence
from pathlib import Path


def code_fingerprint(argv: Sequence[str], *, cwd: Path, env_path: str | None) -> str:
    """A short hash of the program argv[0] names (empty argv: of nothing)."""
    word = argv[0] if argv else ""
    found = shutil.which(word, path=env_path) if word and os.sep not in word else word
    program = os.path.abspath(os.path.join(cwd, found)) if found else word
    return hashlib.sha256(f"program {program}\n".encode()).hexdigest()[:12]
