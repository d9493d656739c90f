"""Digests of tensors read as numpy arrays on the host (adapters/digest.py says what).

For engines whose tensors are not torch's to measure in place: a MindSpore tensor
(``asnumpy()``) or a torch tensor through ``numpy()``. numpy is the job's own (MindSpore
and torch both bring it); it is imported only when a digest is taken. Standard library
only otherwise.
"""

from __future__ import annotations

import math
from typing import Any

from . import digest


def local_array(tensor: Any) -> Any:
    """A tensor's local shard as a flat numpy array on the host."""
    local = getattr(tensor, "_local_tensor", None)  # a torch DTensor's shard
    if local is None:
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    try:
        array = _numpy(local)
    except (TypeError, RuntimeError):  # a dtype numpy lacks (bfloat16): widened, exactly
        array = _numpy(local.float())
    return array.reshape(-1)  # contiguous (copied if it was not)


def array_digest(array: Any) -> str:
    """adapters/digest.py's digest of a flat numpy array, in numpy (uint arithmetic wraps)."""
    import numpy as np

    bits = digest.lane_bits(array.itemsize)
    signed, unsigned = (np.int64, np.uint64) if bits == 64 else (np.int32, np.uint32)
    # Each pattern as a signed integer, widened to the lane (sign-extended, as torch widens).
    patterns = array.view(f"i{array.itemsize}").astype(signed).view(unsigned)
    weights = ((np.arange(1, array.size + 1, dtype=np.uint64) * np.uint64(digest.GOLDEN))
               | np.uint64(1)).astype(unsigned)
    products = (patterns * weights).view(signed)
    weighted = int(products.sum(dtype=signed))  # modulo 2^L: numpy wraps, as torch does
    # xor of the patterns widened to 64 bits as torch.hash_tensor widens them
    wide = array.astype(np.float64) if array.dtype.kind == "f" else array.astype(np.int64)
    xor = int(np.bitwise_xor.reduce(wide.view(np.uint64)))
    return digest.spell(xor, weighted)


def measure(names: list[str], arrays: list[Any]) -> tuple[list[str], list[str], list[float],
                                                          list[float]]:
    """(names, digests, norms, max abs) of the flat arrays; an empty one (an uneven split
    leaves a rank an empty shard) is left out."""
    kept, digests, norms, peaks = [], [], [], []
    for name, array in zip(names, arrays):
        if not array.size:
            continue
        wide = array.astype("float64")
        kept.append(name)
        digests.append(array_digest(array))
        norms.append(math.sqrt(float(wide.dot(wide))))
        peaks.append(float(abs(wide).max()))  # exact: a max does not round
    return kept, digests, norms, peaks


def _numpy(tensor: Any) -> Any:
    if hasattr(tensor, "asnumpy"):  # MindSpore
        return tensor.asnumpy()
    return tensor.detach().cpu().numpy()  # torch
