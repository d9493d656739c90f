"""Delta debugging (Zeller's ddmin) as a state machine driven by verdicts (the ddmin baseline).

ddmin finds a 1-minimal failing subset: one that fails while removing any single
element makes it pass. Here "fails" means "the mask enabling exactly these edges
diverges". The caller runs `test`, reports its verdict, and asks again; how a
verdict is reached (one run, or runs until a divergence or enough clean runs)
is the caller's business. Pure: no I/O, no randomness.
"""

from __future__ import annotations

from collections.abc import Sequence


def split(items: Sequence[int], parts: int) -> list[tuple[int, ...]]:
    """items cut into `parts` contiguous chunks of near-equal size (larger ones first)."""
    parts = max(1, min(parts, len(items)))
    size, extra = divmod(len(items), parts)
    chunks, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        chunks.append(tuple(items[start:end]))
        start = end
    return chunks


class DeltaDebugger:
    """ddmin over `items`, which are assumed to fail together.

    Order of tests at granularity n: each chunk alone, then (for n > 2) each
    complement. A failing chunk restarts at granularity 2; a failing complement
    keeps granularity n - 1; when nothing fails, granularity doubles up to the
    set size, and at the set size a pass of all complements proves 1-minimality.
    """

    def __init__(self, items: Sequence[int]) -> None:
        self.current: tuple[int, ...] = tuple(items)
        self.granularity = 2
        self.tested: list[tuple[tuple[int, ...], bool]] = []
        self._plan()

    def _plan(self) -> None:
        if len(self.current) <= 1:
            self._tests: list[tuple[tuple[int, ...], bool]] = []
        else:
            chunks = split(self.current, self.granularity)
            tests = [(c, False) for c in chunks]
            if len(chunks) > 2:
                tests += [
                    (tuple(x for x in self.current if x not in set(c)), True) for c in chunks
                ]
            self._tests = tests
        self._at = 0

    @property
    def done(self) -> bool:
        return self._at >= len(self._tests)

    @property
    def test(self) -> tuple[int, ...] | None:
        """The subset to try next, or None when `current` is 1-minimal."""
        return None if self.done else self._tests[self._at][0]

    def report(self, failed: bool) -> None:
        if self.done:
            raise ValueError("ddmin is finished; nothing to report")
        subset, is_complement = self._tests[self._at]
        self.tested.append((subset, failed))
        if failed:
            self.current = subset
            self.granularity = max(self.granularity - 1, 2) if is_complement else 2
            self._plan()
            return
        self._at += 1
        if self.done and self.granularity < len(self.current):
            self.granularity = min(len(self.current), 2 * self.granularity)
            self._plan()
