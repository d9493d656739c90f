"""A stand-in for a hyper-parallel build whose parameters hold their tensors under names no
lineage uses (neither ``sharded_param`` nor ``param``): the adapter finds units and edges
but no tensor to digest. Only the scheduler interface the adapter hooks is kept.

With HP_STANDIN_BUILD=unknown in the environment its parameters have neither lineage's
early gather (no ``unshard``, no ``prefetch_unsharded``): a version the adapter does not
recognize.
"""

import os


class _Param:
    shard_world_size = 2
    is_sharded = True

    def __init__(self):
        self.sharded_param = None  # the tensor lives elsewhere in this build
        self.local_tensor_elsewhere = object()

    def unshard(self, async_op=False):
        return None


class _BareParam:
    shard_world_size = 2
    is_sharded = True

    def gather_somehow(self):
        return None


class _State:
    def __init__(self):
        unknown = os.environ.get("HP_STANDIN_BUILD") == "unknown"
        self.hsdp_params = [_BareParam() if unknown else _Param()]
        self.sharded_hsdp_params = list(self.hsdp_params)
        self.is_shard = True

    def prefetch(self):
        for param in self.sharded_hsdp_params:
            if isinstance(param, _BareParam):
                param.gather_somehow()
            else:
                param.unshard(async_op=True)


class HSDPSchedulerV2:
    def __init__(self, module):
        module.hsdp_scheduler = self
        self.cell = module
        self.hsdp_state = _State()
        self.forward_prefetch_cells = []
        self.backward_prefetch_cells = []

    def set_forward_prefetch_cells(self, hsdp_cell_list):
        self.forward_prefetch_cells = hsdp_cell_list

    def set_backward_prefetch_cells(self, hsdp_cell_list):
        self.backward_prefetch_cells = hsdp_cell_list

    def _hsdp_forward_pre_hook(self, cell, args):
        for target in self.forward_prefetch_cells:
            target.hsdp_scheduler.hsdp_state.prefetch()

    def _hsdp_backward_pre_hook(self, cell, grad_outputs):
        for target in self.backward_prefetch_cells:
            target.hsdp_scheduler.hsdp_state.prefetch()
