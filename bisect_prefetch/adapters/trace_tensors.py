"""What the op tracer can read of a tensor, whatever kind of tensor the job hands an op.

Imported only by adapters/op_trace.py, inside a torch job (torch is the job's own). Python 3.9.

A traced op's arguments are not always plain tensors. The tracer fingerprints the memory
that holds a tensor's elements, so it first finds the plain tensor behind each argument:

- a DTensor (tensor parallelism, FSDP2's sharded parameters): this rank's local tensor;
- a functional collective's result (``AsyncCollectiveTensor``, as tensor parallelism's
  ``_c10d_functional`` ops hand it back): the waited result, waited on only where the op
  would wait itself (every op but a view: a view of an unwaited result is left unwaited,
  as torch leaves it); a view's argument is only keyed, never fingerprinted;
- any other wrapper subclass, or a tensor whose storage cannot be read (a wrapper
  without memory of its own, a fake or functional tensor of a compiled region): not
  fingerprinted, and named by ``unreadable``'s reason, so the trace says what it could
  not see instead of the job dying on it.

``key`` says which memory a plain tensor's elements are, in which order (None where its
storage cannot be read); ``storage_ref`` holds its storage weakly, to tell when that memory
may have become another tensor's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

_NESTING = 4  # wrappers inside wrappers (a DTensor of a waited result...) this deep at most


def readable(t: Any, *, wait: bool) -> tuple[torch.Tensor | None, str | None]:
    """(the plain tensor holding ``t``'s elements, None), or (None, why it has none).

    wait: the op is about to read the elements (not a view), so a functional collective's
    result may be waited on, as the op itself would."""
    for _ in range(_NESTING):
        if not is_traceable_wrapper_subclass(t):
            return t, None
        inner = getattr(t, "_local_tensor", None)  # DTensor: this rank's shard
        if inner is None and callable(getattr(t, "trigger_wait", None)):
            # A functional collective's result: the op waits on it anyway; a view does not.
            inner = t.trigger_wait() if wait else getattr(t, "elem", None)
        if inner is None:
            return None, f"tensor subclass {type(t).__name__}"
        t = inner
    return None, f"tensor subclass {type(t).__name__} nested more than {_NESTING} deep"


def key(t: torch.Tensor) -> tuple[Any, ...] | None:
    """Which memory a tensor's elements are, in which order (the same key: the same
    fingerprint); None where its storage cannot be read."""
    try:
        start = t.data_ptr()  # the storage's address plus the offset: where it begins
        if t.is_contiguous():
            return (start, t.numel(), t.dtype)
        return (start, t.numel(), t.dtype, tuple(t.shape), t.stride())
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def storage_of(t: torch.Tensor) -> int | None:
    """The address of a tensor's storage (what views of it share); None where unreadable."""
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def storage_ref(t: torch.Tensor) -> Any:
    """A weak reference to a tensor's storage (``expired()`` once it is freed), or None."""
    try:
        return StorageWeakRef(t.untyped_storage())
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def unreadable(t: Any) -> str | None:
    """Why a plain tensor has no fingerprint (None: it has one to take)."""
    if type(t) is torch.Tensor and t.layout == torch.strided and not t.is_meta and (
            not t.is_quantized):
        return None  # the common case, in a few attribute reads
    try:
        if t.layout != torch.strided:
            return f"{t.layout} layout"
        if t.device.type == "meta":
            return "meta tensor"
        if t.is_quantized:
            return "quantized tensor"
    except (RuntimeError, NotImplementedError, TypeError) as e:
        return f"unreadable tensor ({type(e).__name__})"
    if storage_of(t) is None:
        return f"storage of {type(t).__name__} cannot be read"
    return None


def unwaited(t: Any) -> bool:
    """Whether ``t`` is a functional collective's result not waited on yet (not filled)."""
    return callable(getattr(t, "trigger_wait", None)) and not getattr(t, "completed", True)
