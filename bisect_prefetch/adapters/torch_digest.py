"""Digests of many torch tensors in a few ops, where they lie (adapters/digest.py says what).

Imported only by adapters that run in a torch job (torch is the job's own).

With many small tensors the cost is per tensor op, not per byte. Small tensors are copied
into one flat buffer per dtype, ordered so that tensors of the same size lie side by side:
each run of equal sizes is a (count, numel) view, whose per-row norm, max abs, xor and
weighted sum are one op each. Large tensors get a few ops each, in place. Every result of a
step (four 64-bit numbers a tensor) leaves the device in one transfer.

The xor is ``torch.hash_tensor`` where torch has it (2.9 and later); before, the same sum in
plain tensor ops (``xor_by_folding``): the patterns widened as hash_tensor widens them, then
halves xored together until one word a row is left. Both give the same bits, so digests of
one run agree across torch versions (tests/adapters/test_torch_digest.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torch._utils import _flatten_dense_tensors

from bisect_prefetch.adapters import digest

# Tensors of up to BATCHED_MAX_BYTES are copied into a flat buffer; larger ones are
# measured where they lie, so no step copies a large tensor.
BATCHED_MAX_BYTES = 1 << 16
_SIGNED_GOLDEN = digest.GOLDEN - (1 << 64)  # the same 64 bits as a torch int64


def lanes(tensor: torch.Tensor) -> torch.Tensor:
    """The elements' bit patterns as signed integers of the width the weighted sum uses."""
    size = tensor.element_size()
    if size == 8:
        return tensor.view(torch.int64)
    if size == 4:
        return tensor.view(torch.int32)
    return tensor.view(torch.int16 if size == 2 else torch.int8).to(torch.int32)


def xor_by_hash_tensor(rows: torch.Tensor) -> torch.Tensor:
    """The xor of each row's patterns widened to 64 bits (a 1-D tensor: the rows of a 2-D
    ``rows``, else one element), as int64."""
    if rows.dim() == 2:
        return torch.hash_tensor(rows, dim=1).view(torch.int64)
    return torch.hash_tensor(rows).view(torch.int64).reshape(1)


def xor_by_folding(rows: torch.Tensor) -> torch.Tensor:
    """What ``xor_by_hash_tensor`` returns, in tensor ops every torch has (before 2.9).

    hash_tensor widens a float through float64 and any other dtype to int64 (sign-extended),
    exactly: the same conversions here. Then about log2(numel) xors of halves: each pass
    reads what is left, so the whole costs about two passes over the widened words."""
    words = rows if rows.dim() == 2 else rows.reshape(1, -1)
    wide = torch.float64 if words.is_floating_point() else torch.int64
    words = words.to(wide).view(torch.int64)
    while words.shape[1] > 1:
        half = words.shape[1] // 2
        folded = torch.bitwise_xor(words[:, :half], words[:, half:2 * half])
        if words.shape[1] % 2:  # the odd word out joins the first column
            folded[:, 0] ^= words[:, -1]
        words = folded
    return words[:, 0].clone()


# torch.hash_tensor came with torch 2.9.
xor_rows = xor_by_hash_tensor if hasattr(torch, "hash_tensor") else xor_by_folding


class Weights:
    """w_i of adapters/digest.py for each lane width and device, grown as needed (cached)."""

    def __init__(self) -> None:
        self._cache: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}

    def first(self, n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        cached = self._cache.get((dtype, device))
        if cached is None or cached.numel() < n:
            positions = torch.arange(1, n + 1, dtype=torch.int64, device=device) * _SIGNED_GOLDEN
            if dtype == torch.int32:
                positions = positions & 0xFFFFFFFF
            cached = self._cache[(dtype, device)] = (positions | 1).to(dtype)
        return cached[:n]


class TensorBatch:
    """How to digest one list of tensors (fixed names and shapes) in a few tensor ops."""

    def __init__(self, names: list[str], tensors: list[torch.Tensor], *,
                 xor: Any = None) -> None:
        self.names = names
        # The xor of each tensor's patterns: xor_rows, unless told (the benchmark compares both).
        self.xor = xor or xor_rows
        # An uneven split can leave a rank an empty shard: nothing to measure.
        self.kept = [k for k, t in enumerate(tensors) if t.numel()]
        self.kept_names = [names[k] for k in self.kept]
        tensors = [tensors[k] for k in self.kept]
        by_dtype: dict[torch.dtype, list[int]] = {}
        self.large: list[int] = []
        for k, t in enumerate(tensors):
            if t.numel() * t.element_size() > BATCHED_MAX_BYTES:
                self.large.append(k)
            else:
                by_dtype.setdefault(t.dtype, []).append(k)
        # Per flat buffer: its tensors, and its runs of equal size (count, numel).
        self.flats: list[tuple[list[int], list[tuple[int, int]]]] = []
        row_order: list[int] = []  # tensor index of each result row, in op order
        for members in by_dtype.values():
            members.sort(key=lambda k: tensors[k].numel())
            runs: list[tuple[int, int]] = []
            for k in members:
                numel = tensors[k].numel()
                if runs and runs[-1][1] == numel:
                    runs[-1] = (runs[-1][0] + 1, numel)
                else:
                    runs.append((1, numel))
            self.flats.append((members, runs))
            row_order += members
        row_order += self.large
        self.row = [0] * len(tensors)
        for row, k in enumerate(row_order):
            self.row[k] = row
        self.weights = Weights()

    def measure(self, tensors: list[torch.Tensor]) -> tuple[list[str], list[str], list[float],
                                                           list[float]]:
        """(names, digests, norms, max abs) of the non-empty tensors, in the order of names."""
        if len(self.kept) < len(tensors):
            tensors = [tensors[k] for k in self.kept]
        if not tensors:
            return [], [], [], []
        norms, peaks, xors, sums = [], [], [], []
        for members, runs in self.flats:
            flat = _flatten_dense_tensors([tensors[k] for k in members])
            bits = lanes(flat)
            sizes = [count * numel for count, numel in runs]
            for (count, numel), values, lane in zip(runs, flat.split(sizes), bits.split(sizes)):
                rows = values.view(count, numel)
                # The norm is for the report (the digest decides): float32 accumulates it,
                # several times faster than float64; a max abs is exact in any dtype.
                norms.append(torch.linalg.vector_norm(rows, 2, dim=1, dtype=_norm_dtype(rows)))
                peaks.append(rows.abs().amax(dim=1))  # (an inf-norm is several times slower)
                xors.append(self.xor(rows))
                weights = self.weights.first(numel, lane.dtype, lane.device)
                sums.append((lane.view(count, numel) * weights).sum(dim=1, dtype=lane.dtype)
                            .to(torch.int64))
        large = [tensors[k].reshape(-1) for k in self.large]  # a view where contiguous
        if large:
            norms.append(torch.stack([torch.linalg.vector_norm(t, dtype=_norm_dtype(t))
                                      for t in large]))
            peaks.append(torch.stack([t.abs().amax() for t in large]))
            for t in large:
                xors.append(self.xor(t))
                lane = lanes(t)
                weights = self.weights.first(t.numel(), lane.dtype, lane.device)
                sums.append((lane * weights).sum(dtype=lane.dtype).to(torch.int64).reshape(1))
        norms = [n.to(torch.float64) for n in norms]
        peaks = [p.to(torch.float64) for p in peaks]
        packed = torch.cat([torch.cat(norms), torch.cat(peaks), torch.cat(xors).view(torch.float64),
                            torch.cat(sums).view(torch.float64)])
        n = len(tensors)
        host = packed.cpu()  # the one transfer (and sync) of the step
        floats = host[: 2 * n].tolist()
        sums = host[2 * n:].view(torch.int64).tolist()
        mask = digest.MASK64
        # Every digest in one formatting op (digest.spell's text: xor, then the weighted sum).
        text = ("%016x%016x" * n) % tuple(
            v & mask for pair in zip(sums[:n], sums[n:]) for v in pair)
        rows = self.row
        return (self.kept_names, [text[32 * rows[k]: 32 * rows[k] + 32] for k in range(n)],
                [floats[rows[k]] for k in range(n)], [floats[n + rows[k]] for k in range(n)])


def _norm_dtype(tensor: torch.Tensor) -> torch.dtype:
    return torch.float32 if tensor.element_size() < 4 else tensor.dtype


def local(tensor: Any) -> Any:
    """A DTensor's local shard; any other tensor as it is."""
    return getattr(tensor, "_local_tensor", tensor)
