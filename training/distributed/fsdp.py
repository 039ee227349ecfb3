"""--multi-gpu fsdp: FSDP2 (torch.distributed.fsdp.fully_shard) on the process group DDP uses.

Each rank keeps 1/N of the parameters, gradients and optimizer state: a block's parameters are
all-gathered for its forward (and again for its backward when resharded after forward), and its
gradients reduce-scattered. The loop, sampler, checkpoints and stop signals are DDP's; what
differs is here: how the model is laid out, how gradients skip their exchange during
accumulation, how clipping sees the whole gradient, and how checkpoints gather full tensors, so
that the files in --save-dir are the same as a single device's and load without FSDP.

Mixed precision (--amp) is autocast, as on one device and under DDP, over fp32 sharded parameters;
not FSDP's param_dtype policy, which casts every parameter to the AMP dtype at its gather but
leaves the float buffers as they are: a BatchNorm's running statistics (fp32) then meet bf16
activations, and a norm layer's bf16 weight fp32 inputs, which CPU kernels refuse ("expected
scalar type BFloat16 but found Float"). Autocast decides per operation, so every model that trains
with AMP on one device trains so here, with the same numerics. The cost: the all-gathers move fp32
parameters, twice bf16's bytes; gradients are reduced in fp32 either way.
"""
import contextlib

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from training.distributed.ddp import DistributedStrategy

# Gathered to rank 0 in CPU memory: what a checkpoint file holds.
FULL_TO_RANK0 = StateDictOptions(full_state_dict=True, cpu_offload=True)


class FullyShardedStrategy(DistributedStrategy):
    def __init__(self, *, placement, reshard_after_forward):
        super().__init__(placement=placement, sync_bn=False, label="fsdp")
        self.reshard_after_forward = reshard_after_forward
        self._sharded = None

    def describe(self):
        kept = "resharded" if self.reshard_after_forward else "kept whole"
        return f"{super().describe()}, parameters {kept} between forward and backward"

    def wrap(self, model, precision):
        # AMP, where on, is the step's autocast over these fp32 shards (the module docstring says why).
        self._sharded = shard_model(model, self.reshard_after_forward)
        return model  # fully_shard turns the module itself into an FSDP module

    def shard_like(self, module):
        # The weight average only runs forward passes: resharding after each keeps its memory 1/N.
        shard_model(module, reshard_after_forward=True)

    def eval_model(self, model):
        return model

    def _drop_wrapped_model(self):
        sharded, self._sharded = self._sharded is not None, None
        return super()._drop_wrapped_model() or sharded

    @contextlib.contextmanager
    def no_sync(self):
        """Accumulate without the reduce-scatter; the micro-batch that closes the window sends it."""
        self._sharded.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            self._sharded.set_requires_gradient_sync(True)

    def register_comm_hook(self, state, hook):
        raise NotImplementedError("FSDP exchanges gradients by reduce-scatter: DDP's communication hooks do not apply")

    def clip_grad_norm_(self, parameters, max_norm):
        return clip_sharded_grad_norm_(parameters, max_norm)

    def module_state(self, module):
        return _FullModuleState(module)

    def optimizer_state(self, model, optimizer):
        return _FullOptimizerState(model, optimizer)

    def load_from_rank0(self, module, state_dict):
        set_model_state_dict(module, state_dict if self.is_main else {},
                             options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))

    def evaluation_batches(self, loader):
        # Every forward all-gathers parameters, so a rank whose shard of the split is shorter
        # takes empty forward passes until the longest one is done.
        return int(self.max_over_ranks(torch.tensor(len(loader), device=self.device)))


def clip_sharded_grad_norm_(parameters, max_norm):
    """Clip by the norm of the whole gradient: each rank holds a shard, so the norm is summed over
    ranks (DTensor) before the coefficient is applied."""
    parameters = list(parameters)
    total_norm = torch.nn.utils.get_total_norm([p.grad for p in parameters if p.grad is not None])
    if isinstance(total_norm, DTensor):
        total_norm = total_norm.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, total_norm)
    return total_norm


def shard_model(module, reshard_after_forward=True):
    """fully_shard each block the model declares (fsdp_blocks(): the transformer's encoder blocks) as a
    unit of its own, gathered just before it runs, then the rest of the model (stem, head, or a whole
    convolutional model) as the root's unit."""
    for block in module.fsdp_blocks():
        fully_shard(block, reshard_after_forward=reshard_after_forward)
    fully_shard(module, reshard_after_forward=reshard_after_forward)
    return module


class _FullModuleState:
    """A sharded module read and written as full tensors under its own names: gathered to rank 0 to
    save, and sharded from the full state every rank loads."""

    def __init__(self, module):
        self.module = module

    def state_dict(self):
        return get_model_state_dict(self.module, options=FULL_TO_RANK0)

    def load_state_dict(self, state_dict):
        set_model_state_dict(self.module, state_dict, options=StateDictOptions(full_state_dict=True))


class _FullOptimizerState:
    """The sharded optimizer read and written in torch's own format (parameters numbered in group
    order), so that a checkpoint moves between FSDP, DDP and one device."""

    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer
        name_of = {id(parameter): name for name, parameter in model.named_parameters()}
        self.names = [name_of[id(p)] for group in optimizer.param_groups for p in group["params"]]

    def state_dict(self):
        full = get_optimizer_state_dict(self.model, self.optimizer, options=FULL_TO_RANK0)
        if not full:
            return {}  # ranks other than 0 receive nothing to write
        number = {name: index for index, name in enumerate(self.names)}
        return {"state": {number[name]: state for name, state in full["state"].items()},
                "param_groups": [{**group, "params": [number[name] for name in group["params"]]}
                                 for group in full["param_groups"]]}

    def load_state_dict(self, state_dict):
        full = {"state": {self.names[index]: state for index, state in state_dict["state"].items()},
                "param_groups": [{**group, "params": [self.names[index] for index in group["params"]]}
                                 for group in state_dict["param_groups"]]}
        set_optimizer_state_dict(self.model, self.optimizer, full, options=StateDictOptions(full_state_dict=True))


def sharded_units(module):
    """The parameters of each unit shard_model makes: every block's, then the rest (the root's)."""
    blocks = [list(block.parameters()) for block in module.fsdp_blocks()]
    in_blocks = {id(p) for block in blocks for p in block}
    return [*blocks, [p for p in module.parameters() if id(p) not in in_blocks]]
