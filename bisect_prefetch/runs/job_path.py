"""What a job's Python path gets from bisect-prefetch: the adapter, and nothing else.

A user's job runs in its own environment (often another venv, another Python, another
node). An A/A test of it must run the libraries its normal runs run, so its PYTHONPATH
gets a small tree holding only what runs inside the job: the site hook (sitecustomize.py)
at its top, and ``bisect_prefetch/`` with ``__init__.py``, ``vocab.py`` and ``adapters/``
(standard library only). Never the tool's site-packages (numpy, pydantic, torch of the
tool's venv) and never the checkout root (its ``tests`` and ``benchmarks`` packages).

The tree is copied into each run dir: it is small (about 200 KB), on the filesystem the
nodes share under Slurm, and real files, since the site hook finds the sitecustomize it
shadows by skipping its own directory by resolved path.

Built-in reference workloads that run in the tool's own interpreter (fsdp2, mindspore)
import the whole package: they keep the package's own site dir and its parent.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import bisect_prefetch
from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.vocab import ADAPTER_TREE

PACKAGE = Path(bisect_prefetch.__file__).resolve().parent
PACKAGE_PARENT = PACKAGE.parent
ADAPTER_SITE = PACKAGE / "adapters" / "site"

# The package's files that run inside a job (adapters/ is copied whole, site/ apart).
IN_JOB_FILES = ("__init__.py", "vocab.py")


def tool_paths() -> list[Path]:
    """The path entries of a built-in workload that runs in the tool's interpreter."""
    return [ADAPTER_SITE, PACKAGE_PARENT]


def write_adapter_tree(run_dir: Path) -> Path:
    """Copy the in-job code into run_dir/adapter; the one entry the job's path gets."""
    root = Path(run_dir) / ADAPTER_TREE
    package = root / "bisect_prefetch"
    adapters = package / "adapters"
    try:
        adapters.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ADAPTER_SITE / "sitecustomize.py", root / "sitecustomize.py")
        for name in IN_JOB_FILES:
            shutil.copyfile(PACKAGE / name, package / name)
        for source in sorted((PACKAGE / "adapters").glob("*.py")):
            shutil.copyfile(source, adapters / source.name)
    except OSError as exc:
        raise BisectPrefetchError(f"cannot write the adapter into {root}: {exc.strerror or exc}") from None
    return root
