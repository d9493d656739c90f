"""Digests on torch without torch.hash_tensor (before 2.9): the same bits as with it.

adapters/torch_digest.py takes each tensor's xor with torch.hash_tensor where torch has it and
by folding halves in plain tensor ops where it does not. A run on torch 2.8 and a run on 2.14
must write the same digest for the same bytes, so the two are compared here on every dtype a
gradient can have, with the values that convert oddly (NaN, infinities, -0.0, subnormals), and
against the host-side implementation MindSpore's adapter uses (adapters/numpy_digest.py).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from bisect_prefetch.adapters.numpy_digest import array_digest  # noqa: E402
from bisect_prefetch.adapters.torch_digest import (  # noqa: E402
    TensorBatch,
    xor_by_folding,
    xor_by_hash_tensor,
)

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
          torch.int8, torch.uint8, torch.bool]


def _values(dtype: torch.dtype, n: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        values = torch.randn(n, generator=generator, dtype=torch.float64) * 1e3
        odd = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0, 1e-310, 5e-45],
                           dtype=torch.float64)
        values[: min(n, len(odd))] = odd[: min(n, len(odd))]
        return values.to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=generator).bool()
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -(1 << 62)), min(info.max, 1 << 62), (n,),
                         generator=generator, dtype=torch.int64).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("width", [1, 2, 3, 7, 64, 1025])
def test_folding_gives_hash_tensors_bits_row_by_row_and_whole(dtype, width):
    rows = _values(dtype, 5 * width, seed=width).view(5, width)
    folded = xor_by_folding(rows)
    assert folded.dtype == torch.int64 and folded.shape == (5,)
    assert folded.tolist() == xor_by_hash_tensor(rows).tolist()
    whole = rows.reshape(-1)
    assert xor_by_folding(whole).tolist() == xor_by_hash_tensor(whole).tolist()


def test_folding_leaves_its_input_unchanged():
    rows = torch.randn(3, 9, dtype=torch.float64)
    kept = rows.clone()
    xor_by_folding(rows)
    xor_by_folding(rows[0])
    assert torch.equal(rows.view(torch.int64), kept.view(torch.int64))


def test_a_batchs_digests_are_the_same_with_either_xor_and_on_the_host():
    grads = [_values(torch.float32, 10_000, 1), _values(torch.float32, 7, 2),
             _values(torch.float32, 7, 3), _values(torch.float64, 2000, 4),
             _values(torch.float32, 40_000, 5),  # large: measured where it lies
             _values(torch.bfloat16, 33, 6), _values(torch.float16, 40_001, 7)]
    names = [f"p{k}" for k in range(len(grads))]
    with_hash_tensor = TensorBatch(names, grads, xor=xor_by_hash_tensor).measure(grads)
    by_folding = TensorBatch(names, grads, xor=xor_by_folding).measure(grads)
    assert by_folding[:2] == with_hash_tensor[:2]  # names, digests (norms hold NaN)
    for grad, digest in zip(grads, by_folding[1], strict=True):
        if grad.dtype != torch.bfloat16:  # numpy has no bfloat16
            assert digest == array_digest(grad.numpy())
    assert len(set(by_folding[1])) == len(grads)


def test_the_host_side_xor_is_hash_tensors_too():
    """numpy_digest widens as hash_tensor does: its xor half of a digest is the same."""
    for dtype in (torch.float32, torch.float16, torch.int32, torch.int8, torch.uint8):
        values = _values(dtype, 999, 11)
        xor = int(xor_by_folding(values)[0]) & ((1 << 64) - 1)
        assert array_digest(values.numpy())[:16] == f"{xor:016x}"
        assert np.bitwise_xor.reduce(
            (values.numpy().astype(np.float64) if values.is_floating_point()
             else values.numpy().astype(np.int64)).view(np.uint64)) == xor
