"""Gradient digests: which bytes of a gradient a digest covers, and how they are hashed.

Shared by the framework adapters (fsdp2, hyper_parallel); each reads its gradients its own
way and hands the bytes here. Standard library only.

A digest is blake2b (16 bytes, hex) over the gradient's raw bytes as it lies in memory
(dtype and byte order included). A gradient of up to FULL_BYTES is hashed whole. A larger
one is hashed through CHUNKS evenly spaced chunks of CHUNK_BYTES (chunk i starts at
i * (size // CHUNKS)), followed by its exact max abs as a float64 (a max does not depend on
summation order, so it is as reproducible as the bytes). That bounds the hashing (and, on
an accelerator, the copy to the host) to a few KiB a parameter however large the model.

What sampling gives up: in a gradient over FULL_BYTES, a difference confined to the
unsampled bytes that leaves the max abs bit-equal is not seen by that digest at that step.
An 8 KiB gradient is half covered; a large one only through its 4 KiB of samples and its
max, so a change confined to a few rows of a large embedding gradient is seen only if it
moves the max. The norm written next to a digest is not hashed (it is for the report: a
float sum may round differently if a framework changes its reduction order). Such drift
rarely stays hidden: once the optimizer applies it, the changed parameter alters the
activations, hence most elements of the next steps' gradients, which the samples and the
other parameters' digests then show. Gradients of up to FULL_BYTES (biases, norms, small
shards) are covered bit for bit.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

CHUNKS = 4
CHUNK_BYTES = 1024
FULL_BYTES = CHUNKS * CHUNK_BYTES


def is_sampled(size: int) -> bool:
    """Whether a gradient of ``size`` bytes is hashed through samples (else whole)."""
    return size > FULL_BYTES


def chunk_starts(size: int) -> range:
    """Byte offsets of the sampled chunks of a gradient of ``size`` bytes (> FULL_BYTES)."""
    row = size // CHUNKS
    return range(0, row * CHUNKS, row)


def covered_bytes(size: int) -> int:
    """How many of a gradient's ``size`` bytes its digest covers."""
    return CHUNKS * CHUNK_BYTES if is_sampled(size) else size


def gradient_digest(data: bytes | memoryview, max_abs: float, *, size: int | None = None) -> str:
    """The digest of one gradient.

    data: the gradient's bytes (``size`` None), or only the bytes its digest covers, in
    order (``size``: the gradient's full byte count), as an accelerator copies them out.
    max_abs: the gradient's max abs over every element (hashed in when sampled).
    """
    return gradient_digests([data], [max_abs], [len(data) if size is None else size])[0]


def gradient_digests(
    data: Sequence[bytes | memoryview], max_abs: Sequence[float], sizes: Sequence[int]
) -> list[str]:
    """gradient_digest of many gradients at once (a tight loop: the cost is per gradient)."""
    blake2b, pack = hashlib.blake2b, struct.Struct("=d").pack
    out = []
    for buffer, peak, size in zip(data, max_abs, sizes, strict=True):
        if size <= FULL_BYTES:
            out.append(blake2b(buffer, digest_size=16).hexdigest())
            continue
        digest = blake2b(digest_size=16)
        if len(buffer) < size:  # the covered bytes, already gathered
            digest.update(buffer)
        else:
            row = size // CHUNKS
            for start in range(0, row * CHUNKS, row):
                digest.update(buffer[start : start + CHUNK_BYTES])
        digest.update(pack(peak))
        out.append(digest.hexdigest())
    return out
