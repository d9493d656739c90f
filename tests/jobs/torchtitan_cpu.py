"""torchtitan's own trainer on CPU ranks, for the tests: `torchtitan.train`, unchanged.

A test device, not a way to train: real torchtitan users run on GPUs. torchtitan 0.3.0 has no
CPU path; this wrapper removes the five things that block one, from outside torchtitan's files,
then runs ``torchtitan.train`` as ``python -m torchtitan.train`` would, with the same
arguments (tyro: ``--module llama3 --config llama3_debugmodel --training.steps N ...``; add
``--parallelism.spmd-backend partial_dtensor``: the default fails inside ``fully_shard`` at 2
ranks). It imports nothing of bisect-prefetch and calls nothing of it: it runs in
torchtitan's own venv under torchrun, as a user's job does.

1. torchtitan picks its device type once, when ``torchtitan.tools.utils`` is imported
   (``_get_available_device_type() or "cuda"``): it must see "cpu", and ``torch.cpu`` must
   answer the device-module calls torchtitan makes (name, properties, memory stats, empty
   cache, ``current_device()`` as an index: a barrier passes it as a device id). With device
   "cpu" torchtitan picks gloo itself.
2. torch refuses FlexAttention backward on CPU at its front door (``_validate_device``);
   its eager path computes the gradients correctly on CPU.
3. torchtitan compiles flex attention and ``create_block_mask`` with inductor (again under
   ``--debug.deterministic``), whose CPU flex kernel has no backward: both run eager here
   (as torchtitan does itself on ROCm for determinism).
4. torch 2.13 has no ``torch.distributed.set_timeout``; ``_set_pg_timeout`` is that function.
5. torchtitan sets FSDP's gradient divide factor to 1.0, so FSDP2 reduce-scatters with
   ``PREMUL_SUM``, which gloo lacks: ``set_force_sum_reduction_for_comms(True)`` reduces with
   SUM, then multiplies by 1.0: the same gradients.

The wrapper's own knob, which the tool is never told about:

- ``--fault-target layers.K --fault-hazard H`` (taken off the arguments before torchtitan
  reads them): drift on the backward prefetch into unit ``layers.K`` (FSDP2's implicit chain:
  ``layers.K+1`` prefetches it). Each time a backward prefetch into that unit really starts an
  all-gather, with chance H (OS entropy, not the seed) one element of the unit's local shard
  moves by one ulp, as a prefetch that wrote into the wrong buffer would. A prefetch that
  does not start an all-gather (switched off by a mask, or already done) plants nothing.
"""

from __future__ import annotations

import math
import random
import runpy
import sys
import types


def _cpu_device() -> None:
    """Blocker 1: device type "cpu" and a torch.cpu that answers torchtitan's calls."""
    import torch
    import torch._utils

    assert "torchtitan.tools.utils" not in sys.modules, "must run before torchtitan is imported"
    torch._utils._get_available_device_type = lambda: "cpu"
    cpu = torch.cpu
    cpu.get_device_name = lambda device=None: "cpu"
    cpu.get_device_properties = lambda device=None: types.SimpleNamespace(
        name="cpu", total_memory=64 * 1024**3)
    cpu.memory_stats = lambda device=None: {}
    cpu.reset_peak_memory_stats = lambda device=None: None
    cpu.empty_cache = lambda: None
    cpu.current_device = lambda: 0


def _eager_flex_attention() -> None:
    """Blockers 2 and 3: flex attention's backward on CPU, eager instead of inductor."""
    import torch.nn.attention.flex_attention as flex
    from torchtitan.models.common import attention

    flex._validate_device = lambda query, key, value: None
    attention._compiled_create_block_mask = flex.create_block_mask

    def eager(q, k, v, *, score_mod, block_mask, scale, enable_gqa, return_aux, kernel_options):
        # In place of the compiled call; set_determinism may re-assign _compiled_flex_attn.
        return flex.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask,
                                   scale=scale, enable_gqa=enable_gqa, return_aux=return_aux,
                                   kernel_options=kernel_options)

    attention.FlexAttention.compiled_flex_attn = staticmethod(eager)


def _gloo_collectives() -> None:
    """Blockers 4 and 5: set_timeout, and SUM for the reduce-scatter (gloo has no PREMUL_SUM)."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _set_pg_timeout
    from torch.distributed.fsdp import FSDPModule

    if not hasattr(dist, "set_timeout"):
        dist.set_timeout = _set_pg_timeout
    original = FSDPModule.set_gradient_divide_factor

    def set_gradient_divide_factor(self, factor: float) -> None:
        original(self, factor)
        self.set_force_sum_reduction_for_comms(True)

    FSDPModule.set_gradient_divide_factor = set_gradient_divide_factor


def _plant_fault(target: str, hazard: float) -> None:
    """The wrapper's own drift on the backward prefetch into one unit (module docstring)."""
    import torch
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    entropy = random.SystemRandom()
    # Whatever is there now (bisect-prefetch's adapter, when it is in the job, has already
    # wrapped it: a masked edge never reaches the original, so nothing starts and nothing is
    # planted).
    original = FSDPParamGroup._prefetch_unshard

    def prefetch(group, pass_type):
        before = group.is_unsharded or group._all_gather_result is not None
        original(group, pass_type)
        after = group.is_unsharded or group._all_gather_result is not None
        if (pass_type == "backward" and group._module_fqn == target and not before and after
                and entropy.random() < hazard):
            with torch.no_grad():
                for fsdp_param in group.fsdp_params:
                    shard = fsdp_param.sharded_param.to_local().view(-1)
                    if shard.numel():
                        k = entropy.randrange(shard.numel())
                        shard[k] = torch.nextafter(shard[k], torch.tensor(math.inf))
                        break

    FSDPParamGroup._prefetch_unshard = staticmethod(prefetch)


def _take_option(argv: list[str], name: str) -> str | None:
    if name in argv:
        i = argv.index(name)
        value = argv[i + 1]
        del argv[i:i + 2]
        return value
    return None


def main() -> None:
    argv = sys.argv[1:]
    target = _take_option(argv, "--fault-target")
    hazard = float(_take_option(argv, "--fault-hazard") or 0.3)
    _cpu_device()  # first: before anything imports torchtitan.tools.utils
    _eager_flex_attention()
    _gloo_collectives()
    if target is not None:
        _plant_fault(target, hazard)
    sys.argv = [sys.argv[0], *argv]
    runpy.run_module("torchtitan.train", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
