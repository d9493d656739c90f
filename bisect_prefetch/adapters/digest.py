"""Digests of a job's tensors: what a digest covers, and how it is spelled.

Shared by the framework adapters (fsdp2, hyper_parallel). Each computes the two sums
below where its tensors lie (torch: on the tensor's device, for all parameters in a few
ops; MindSpore: in numpy, on the bytes it already copied to the host) and hands them
here to be spelled. Standard library only, Python 3.9.

When: at the step boundary (adapters/steps.py), when the optimizer is about to apply the
step's gradients. Nothing inside forward or backward waits for the host: every result of a
step leaves the device in one transfer, then. Two records per parameter and rank:

- the parameter's local gradient shard (the gradient the optimizer is about to apply),
  under the parameter's name;
- the parameter's local value shard, under the name plus vocab.VALUE_SUFFIX. A corrupted
  persistent parameter (a prefetch that wrote into the wrong buffer) shows here, in its
  own unit only, one step before its effect spreads through the next forward.

A digest covers every element. Each element's bit pattern is a signed integer b_i (16-
and 8-bit patterns sign-extended to 32 bits), and two sums are taken:

- ``xor``: the xor of every element's pattern, widened to 64 bits the way
  ``torch.hash_tensor`` does (a float through float64, exactly);
- ``weighted``: the sum of b_i * w_i modulo 2^L (L = 64 for 64-bit dtypes, else 32: the
  lane the products and their sum wrap in), with w_i = ((i + 1) * GOLDEN mod 2^L) | 1, as
  a signed L-bit integer.

Integer sums do not depend on the order they are added in, so both are as reproducible as
the bytes. xor alone is blind to a permutation and to pairs of changes that cancel; the
weighted sum is position-sensitive, and since every weight is odd, a change to any one
element (d_i != 0 modulo 2^L) always changes it. The digest is the two sums in hex,
``xor`` first (32 hex digits). The norm and max abs written beside a digest are for the
report; the digest decides.
"""

from __future__ import annotations

GOLDEN = 0x9E3779B97F4A7C15  # odd; spreads consecutive positions over the whole word
MASK64 = (1 << 64) - 1


def lane_bits(itemsize: int) -> int:
    """The width L the weighted sum multiplies in, for elements of ``itemsize`` bytes."""
    return 64 if itemsize == 8 else 32


def weight(i: int, bits: int) -> int:
    """w_i for lanes of ``bits`` bits, as an unsigned integer."""
    return (((i + 1) * GOLDEN) & ((1 << bits) - 1)) | 1


def spell(xor: int, weighted: int) -> str:
    """The digest text of one tensor from its two sums (either sign; taken modulo 2^64)."""
    return f"{xor & MASK64:016x}{weighted & MASK64:016x}"

