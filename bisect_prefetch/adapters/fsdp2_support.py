"""Which torch the FSDP2 adapter runs on, and the one line that refuses any other.

Standard library only (it is asked before anything of FSDP2 is patched). The adapter supports
torch 2.8 through 2.15: every name it patches has the same meaning there, and three names that
differ have fallbacks in adapters/fsdp2.py and adapters/torch_digest.py (``_dynamo_disable``
from 2.12, ``FSDPState._fsdp_param_groups`` from 2.12, ``torch.hash_tensor`` from 2.9). torch
2.6 and 2.7 cannot run FSDP2 on a CPU device mesh at all (``torch.cpu.Stream`` has no
``record_event`` before 2.8), so nothing older is tested, and nothing newer is known.

A job whose torch is outside the range, or lacks a name below, is refused: the adapter does not
activate, and the job stops with the line (adapters/__init__.py), so that no run goes on
without its mask.
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Callable, Iterable

from bisect_prefetch.vocab import ADAPTER_NOT_ACTIVE

OLDEST = (2, 8)
NEWEST = (2, 15)
_STATE = "torch.distributed.fsdp._fully_shard._fsdp_state.FSDPState"
_GROUP = "torch.distributed.fsdp._fully_shard._fsdp_param_group.FSDPParamGroup"
# Every name the adapter patches or reads on a class or module (instance attributes such as
# _all_gather_result cannot be looked up before a state exists), and the stream method FSDP2
# calls on a CPU device mesh.
NEEDED = (
    *(f"{_STATE}.{name}" for name in (
        "_lazy_init", "_root_post_backward_final_callback", "_pre_forward", "_pre_backward",
        "_post_forward")),
    *(f"{_GROUP}.{name}" for name in (
        "_record_post_forward", "_prefetch_unshard", "unshard", "pre_forward", "pre_backward",
        "_to_sharded", "_to_sharded_post_forward", "is_unsharded", "post_backward",
        "wait_for_unshard")),
    "torch.distributed.fsdp._fully_shard._fsdp_common.TrainingState.PRE_BACKWARD",
    "torch.distributed.distributed_c10d._get_default_store",
    "torch.cpu.Stream.record_event",
)


def minor_version(version: str) -> tuple[int, int] | None:
    """(major, minor) of a torch version string ("2.14.1+cu130", "2.16.0.dev20261201")."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else None


def refusal(version: str, lacking: Iterable[str]) -> str | None:
    """The one line refusing this torch (its version, and the needed names it lacks), or None."""
    lacking = list(lacking)
    reasons = []
    minor = minor_version(version)
    if minor is None or not OLDEST <= minor <= NEWEST:
        reasons.append("is outside the supported range "
                       f"{OLDEST[0]}.{OLDEST[1]}-{NEWEST[0]}.{NEWEST[1]}")
    if lacking:
        reasons.append("lacks " + ", ".join(_short(name) for name in lacking))
    if not reasons:
        return None
    return f"{ADAPTER_NOT_ACTIVE}: torch {version} " + " and ".join(reasons)


def lacking(names: Iterable[str], *, resolve: Callable[[str], object] | None = None) -> list[str]:
    """The names that cannot be resolved (``resolve`` raises or gives None)."""
    resolve = resolve or resolve_name
    missing = []
    for name in names:
        try:
            found = resolve(name) is not None
        except (ImportError, AttributeError):
            found = False
        if not found:
            missing.append(name)
    return missing


def resolve_name(dotted: str) -> object:
    """The object a dotted name names: the longest importable module, then attributes.

    Every needed name is torch's, and its modules are imported already by the time this is
    asked (the job's import of torch.distributed.fsdp activates the adapter)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        module = sys.modules.get(module_name)
        if module is None:
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                continue
        found: object = module
        for attribute in parts[cut:]:
            found = getattr(found, attribute)
        return found
    raise ImportError(dotted)


def _short(name: str) -> str:
    """A needed name as a user finds it: FSDP2's private modules cut to the class."""
    for prefix in (_STATE, _GROUP):
        if name.startswith(prefix + "."):
            return prefix.rsplit(".", 1)[1] + name[len(prefix):]
    return name
