"""The job's own environment, as the job sees it: what one rank's numbers may depend on
besides the seed and the mask (env.rank{R}.json in the run dir).

Taken inside the job, not by the orchestrator: a job often runs in another venv, another
Python, on another node, and only there can its interpreter, its packages and its
launcher's world size be read. Written once the first training step ended (by then the job
has imported what it trains with), or at exit by a process that did something; never by a
launcher's agent process, which inherits the plan but trains nothing.

Standard library only, Python 3.9 and later.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
import sys
from importlib import metadata
from typing import Any

from bisect_prefetch import __version__
from bisect_prefetch.vocab import ENV_LIBRARIES, ENV_VARIABLES

# Launchers' words for the world size and the ranks on this node.
_WORLD_SIZE = ("WORLD_SIZE", "MS_WORKER_NUM", "RANK_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE")
_LOCAL_WORLD_SIZE = ("LOCAL_WORLD_SIZE", "MS_LOCAL_WORKER", "SLURM_NTASKS_PER_NODE",
                     "OMPI_COMM_WORLD_LOCAL_SIZE")


def _first_int(names: tuple[str, ...]) -> int | None:
    for name in names:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
    except Exception:  # a broken dist-info must not stop the job
        return None


def _installed() -> dict[str, Any]:
    """How many distributions the job's interpreter can import, and a hash of their names
    and versions: a `pip install` in the job's venv changes it."""
    names = set()
    for dist in metadata.distributions():
        try:
            names.add(f"{dist.metadata['Name']}=={dist.version}")
        except Exception:
            continue
    digest = hashlib.sha256("\n".join(sorted(names)).encode()).hexdigest()[:16]
    return {"count": len(names), "hash": digest}


def _imported() -> dict[str, str] | None:
    """Distributions of the top-level modules the job imported, with their versions.

    None where the interpreter cannot map modules to distributions (Python 3.9).
    """
    mapping = getattr(metadata, "packages_distributions", None)
    if mapping is None:
        return None
    try:
        owners = mapping()
    except Exception:
        return None
    tops = {name.partition(".")[0] for name in list(sys.modules)}
    out: dict[str, str] = {}
    for top in sorted(tops):
        for dist in owners.get(top, ()):
            version = _version(dist)
            if version is not None:
                out[dist] = version
    return out


def job_fingerprint(rank: int) -> dict[str, Any]:
    """One rank's environment fingerprint (see the module docstring)."""
    return {
        "rank": rank,
        "python": platform.python_version(),
        "executable": sys.executable,
        "prefix": sys.prefix,
        "libraries": {name: _version(name) for name in ENV_LIBRARIES},
        "imported": _imported(),
        "installed": _installed(),
        "variables": {name: os.environ.get(name) for name in ENV_VARIABLES},
        "world_size": _first_int(_WORLD_SIZE),
        "local_world_size": _first_int(_LOCAL_WORLD_SIZE),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "adapter": __version__,
    }


def render(rank: int) -> str:
    return json.dumps(job_fingerprint(rank), indent=1, sort_keys=True) + "\n"
