"""One process on one device: the strategy the others (DataParallel, DDP, FSDP) build on, and what
each of its methods means when there is nobody else to agree with."""
import contextlib

import torch

from training.reporting.logger import describe, memory_fields, read_memory, reset_peaks


class SingleDevice:
    """One process, one device. Also what DataParallel falls back to without a GPU."""

    def __init__(self, device, label="single"):
        self.device = device
        if device.type == "cuda":
            torch.cuda.set_device(device)  # keeps stray allocations and contexts off GPU 0
        self.name = label
        self.rank, self.local_rank, self.world_size = 0, 0, 1
        self.is_main = True
        self.replicated = False  # DDP's replicate_model(): every rank steps the whole batch, no exchange

    @property
    def data_parallel_size(self):
        """How many model replicas split one step's batch (the loader batch is batch_size x this)."""
        return 1

    @property
    def other_gpus(self):
        """GPUs besides self.device that this process draws random numbers on."""
        return []

    def describe(self):
        if self.name == "dp":
            return f"dp requested but no GPU is visible: running the plain module on {self.device}"
        return f"{self.name} on {self.device}"

    def wrap(self, model, precision):
        return model

    def shard_like(self, module):
        """Lay out a copy of the model (the weight average) as wrap() laid out the model."""

    def eval_model(self, model):
        return model

    def no_sync(self):
        return contextlib.nullcontext()

    def clip_grad_norm_(self, parameters, max_norm):
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm)

    def module_state(self, module):
        """`module` as checkpoints read and write it: full tensors under the bare module's names."""
        return module

    def optimizer_state(self, model, optimizer):
        """The optimizer as checkpoints read and write it (torch's own format)."""
        return optimizer

    def load_from_rank0(self, module, state_dict):
        """Load rank 0's `state_dict` (None elsewhere: ranks on other nodes may not see its files) on every rank."""
        if self.is_main:
            module.load_state_dict(state_dict)
        self.broadcast_module(module)

    def evaluation_batches(self, loader):
        """How many evaluation forward passes this rank makes: its own batches, unless every rank must
        take part in every forward (FSDP gathers the parameters there)."""
        return len(loader)

    def model_state_report(self, model, optimizer):
        """Every rank's bytes of parameters, gradients (as a step holds them) and optimizer state, in MB."""
        return [model_state_mb(model, optimizer)]

    def sum_over_ranks(self, tensor):
        return tensor

    def max_over_ranks(self, tensor):
        return tensor

    def max_ints(self, values):
        """The element-wise maximum over ranks of a few Python ints, in one control message."""
        return self.start_max_ints(values).wait()

    def start_max_ints(self, values):
        """max_ints without waiting for it: the returned message's wait() gives the result."""
        return _Ready(list(values))

    def gather_concat(self, tensor):
        return tensor

    def fill_from_owners(self, rows, bounds):
        """Every row is this process's own already."""

    def gather_objects(self, value):
        return [value]

    def check_same_on_all_ranks(self, value, what):
        """One process always agrees with itself."""

    def broadcast_module(self, module):
        """Make every rank hold rank 0's parameters and buffers (nothing to do in one process)."""

    def sync_buffers(self, module):
        """Make every rank hold rank 0's buffers, e.g. BatchNorm statistics (nothing to do in one process)."""

    def align_with_rank0(self, tensors):
        """Give every rank rank 0's values of these tensors: replicas that step alone (DDP's
        replicate_model) stay one model whatever their hardware rounds (nothing to do in one process)."""

    def memory_report(self):
        return [describe(str(self.device), memory_fields(self.device), read_memory(self.device))]

    def reset_memory_peaks(self):
        """Start the next epoch's peak window (CUDA; a process's peak RSS cannot be lowered)."""
        reset_peaks(self.device)

    def synchronize(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def close(self):
        pass


def model_state_mb(model, optimizer):
    """This rank's share of the model state in MB: local shards under FSDP, whole tensors otherwise.
    Gradients count at the size of the parameters they belong to, as a step holds them."""
    def local_bytes(tensor):
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        return local.numel() * local.element_size()
    parameters = sum(local_bytes(p) for p in model.parameters() if p.requires_grad)
    optimizer_bytes = sum(local_bytes(value) for state in optimizer.state.values() for value in state.values()
                          if torch.is_tensor(value) and value.dim() > 0)
    return {"parameters_mb": parameters / 2**20, "gradients_mb": parameters / 2**20,
            "optimizer_mb": optimizer_bytes / 2**20}


class _Ready:
    """A message that needed no sending (one process)."""

    def __init__(self, values):
        self.values = values

    def wait(self):
        return self.values
