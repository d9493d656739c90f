"""What a job runs, as a short hash for its run key: the files of its own code named in its
argv, the program that runs them, and the packages installed beside that program.

A run is reused from the journal only when this is the same: edit the training script or
`pip install` another library, and the same command runs afresh instead of reusing runs of
code that no longer exists. Cheap by design (no program is started): a file's bytes are
hashed up to FULL_HASH_BYTES, a larger one by size and mtime; packages by the names of their
dist-info directories (name and version). Not covered: edits inside an editable install or
a package imported from elsewhere on PYTHONPATH.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

FULL_HASH_BYTES = 16 << 20


def _file_digest(path: Path) -> str:
    info = path.stat()
    if info.st_size > FULL_HASH_BYTES:
        return f"{info.st_size}:{info.st_mtime_ns}"
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _program(word: str, env_path: str | None) -> Path | None:
    found = shutil.which(word, path=env_path) if os.sep not in word else word
    return Path(os.path.abspath(found)) if found else None  # a venv's python is a link: keep it


def _packages(program: Path) -> list[str]:
    """dist-info names in the site-packages of the environment the program sits in."""
    root = program.parent.parent
    names: list[str] = []
    for site in sorted(root.glob("lib/python*/*-packages")) + sorted(root.glob("lib/site-packages")):
        try:
            names += sorted(p.name for p in site.iterdir() if p.name.endswith((".dist-info", ".egg-info")))
        except OSError:
            continue
    return names


def code_fingerprint(argv: Sequence[str], *, cwd: Path, env_path: str | None) -> str:
    """A short hash of the program, its packages and the code files named in argv."""
    digest = hashlib.sha256()
    program = _program(argv[0], env_path) if argv else None
    if program is not None and program.is_file():
        digest.update(f"program {program} {_file_digest(program.resolve())}\n".encode())
        for name in _packages(program):
            digest.update(f"package {name}\n".encode())
    for word in argv[1:]:
        for candidate in {word, word.partition("=")[2]} - {""}:
            if "{" in candidate or "\0" in candidate:
                continue  # a placeholder: the run's own file
            path = cwd / candidate
            try:
                if path.is_file():
                    digest.update(f"file {candidate} {_file_digest(path)}\n".encode())
            except OSError:
                continue
    return digest.hexdigest()[:12]
