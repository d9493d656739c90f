"""Where a job's optimizer steps: the step boundary the clock (adapters/steps.py) counts.

- torch: ``torch.optim.optimizer.register_optimizer_step_pre_hook`` and ``..._post_hook``
  are global (every optimizer of the process): the pre-hook runs before the update, with
  the gradients it is about to apply still in place. ``Optimizer.__init__`` is wrapped to
  learn that an optimizer exists at all (a job without one counts steps by backward
  passes).
- MindSpore: an optimizer is a Cell whose call receives the gradients it applies; its
  ``__call__`` is wrapped. In graph mode the call runs inside a compiled graph and is never
  seen: such a job shows no optimizer boundary, and the clock says so.

Each framework is hooked only when the job has imported it (``sys.modules``), once per
process; the hooks tell the clock of the latest session (one a process, but for tests).
Standard library only, Python 3.9.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from .steps import StepClock

_hooked: set = set()
_clock: StepClock | None = None


def hook_optimizers(clock: StepClock) -> None:
    """Hook the optimizers of every framework the job has imported (idempotent)."""
    global _clock
    _clock = clock
    if "torch" in sys.modules and "torch" not in _hooked:
        _hooked.add("torch")
        _hook_torch()
    if "mindspore" in sys.modules and "mindspore" not in _hooked:
        _hooked.add("mindspore")
        _hook_mindspore()


def _hook_torch() -> None:
    import torch.optim.optimizer as torch_optimizer  # the job imported torch

    def pre_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
        if _clock is not None:
            _clock.optimizer_built = True
            _clock.optimizer_begins(id(optimizer))

    def post_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
        if _clock is not None:
            _clock.optimizer_ends()

    torch_optimizer.register_optimizer_step_pre_hook(pre_hook)
    torch_optimizer.register_optimizer_step_post_hook(post_hook)
    _note_construction(torch_optimizer.Optimizer)


def _hook_mindspore() -> None:
    try:
        from mindspore.nn.optim.optimizer import Optimizer
    except ImportError:  # a MindSpore without this module: no optimizer boundary
        return
    original = Optimizer.__call__

    @functools.wraps(original)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        clock = _clock
        if clock is None:
            return original(self, *args, **kwargs)
        clock.optimizer_built = True
        clock.optimizer_begins(id(self))
        try:
            return original(self, *args, **kwargs)
        finally:
            clock.optimizer_ends()

    Optimizer.__call__ = call
    _note_construction(Optimizer)


def _note_construction(cls: type) -> None:
    """Tell the clock when an optimizer is built (subclasses call this __init__ too)."""
    original = cls.__init__

    @functools.wraps(original)
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        if _clock is not None:
            _clock.optimizer_built = True
        original(self, *args, **kwargs)

    cls.__init__ = init
