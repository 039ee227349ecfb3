"""Everything that differs between one device, DataParallel, DDP and FSDP, behind one interface:
the Strategy protocol below is all the trainer, the loop, the checkpoints and the tools call.
One device's strategy lives in single.py (with what each method means when there is nobody else to
agree with), DDP's in ddp.py, FSDP's in fsdp.py; DataParallel's is here, beside the choice
(make_strategy).
"""
import os
from typing import Protocol

import torch
from torch import nn

from training.config.settings import check_parallel_args
from training.distributed.ddp import DistributedStrategy
from training.distributed.single import SingleDevice
from training.reporting.logger import describe, memory_fields, read_memory, reset_peaks


class Strategy(Protocol):
    """What a run's strategy offers; SingleDevice, DataParallelStrategy, DistributedStrategy and
    FullyShardedStrategy implement it."""
    device: torch.device
    name: str  # single | dp | ddp | fsdp
    rank: int
    local_rank: int
    world_size: int
    is_main: bool  # the one process that writes files and logs
    data_parallel_size: int  # model replicas one step's batch is split over
    other_gpus: list  # GPUs besides `device` this process draws random numbers on

    # The model: wrapped for training, laid out like it, seen whole for evaluation and checkpoints.
    def describe(self) -> str: ...
    def wrap(self, model, precision): ...
    def shard_like(self, module): ...
    def eval_model(self, model): ...
    def no_sync(self): ...
    def clip_grad_norm_(self, parameters, max_norm): ...
    def module_state(self, module): ...
    def optimizer_state(self, model, optimizer): ...
    def load_from_rank0(self, module, state_dict): ...
    def sync_buffers(self, module): ...
    def evaluation_batches(self, loader): ...
    # Agreement between ranks.
    def sum_over_ranks(self, tensor): ...
    def max_over_ranks(self, tensor): ...
    def max_ints(self, values): ...
    def start_max_ints(self, values): ...
    def gather_concat(self, tensor): ...
    def gather_objects(self, value): ...
    def check_same_on_all_ranks(self, value, what): ...
    # Figures, and the end.
    def memory_report(self): ...
    def model_state_report(self, model, optimizer): ...
    def reset_memory_peaks(self): ...
    def synchronize(self): ...
    def close(self): ...


class DataParallelStrategy(SingleDevice):
    """nn.DataParallel: one process scatters each batch over several GPUs."""

    def __init__(self, gpu_ids):
        super().__init__(torch.device("cuda", gpu_ids[0]), label="dp")
        self.gpu_ids = gpu_ids
        self._wrapped = None

    @property
    def data_parallel_size(self):
        return len(self.gpu_ids)

    @property
    def other_gpus(self):
        return self.gpu_ids[1:]  # replicas' dropout draws from their own GPU's stream

    def describe(self):
        return f"dp over GPUs {','.join(map(str, self.gpu_ids))} (outputs gathered on cuda:{self.gpu_ids[0]})"

    def wrap(self, model, precision):
        # DataParallel's worker threads re-enter autocast without its dtype (they would run
        # fp16 under a bf16 run), so each replica enters the run's autocast itself.
        self._wrapped = nn.DataParallel(_AutocastForward(model, precision), device_ids=self.gpu_ids,
                                        output_device=self.gpu_ids[0])
        return self._wrapped

    def eval_model(self, model):
        return self._wrapped or model  # no collectives in DP, so evaluation uses every GPU too

    def memory_report(self):
        # Replica 0 also holds the gathered outputs and the optimizer, so it shows the imbalance.
        return [describe(f"cuda:{i}", memory_fields(torch.device("cuda", i)), read_memory(torch.device("cuda", i)))
                for i in self.gpu_ids]

    def reset_memory_peaks(self):
        for i in self.gpu_ids:
            reset_peaks(torch.device("cuda", i))

    def synchronize(self):
        for i in self.gpu_ids:
            torch.cuda.synchronize(i)


class _AutocastForward(nn.Module):
    """Runs the wrapped model's forward under the run's autocast; shares its parameters."""

    def __init__(self, model, precision):
        super().__init__()
        self.model, self.precision = model, precision

    def forward(self, *inputs):
        with self.precision.autocast():
            return self.model(*inputs)


def choose_deterministic_algorithms():
    """--deterministic: cuDNN and PyTorch pick the same algorithms in every process (cuDNN's autotuning
    times candidates and may pick another one run to run), and cuBLAS gets a fixed workspace, which it
    reads when it starts (so before the first matrix product)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True, warn_only=True)


def make_strategy(config, placement=None):
    """The strategy for --multi-gpu none, dp, ddp or fsdp, with its device chosen. `placement`: the
    (device type, backend) check_parallel_args already gave for this config, so the checks run once."""
    device_type, backend = placement or check_parallel_args(config)
    hardware, multi_gpu = config.hardware, config.parallel.multi_gpu
    if hardware.deterministic:
        choose_deterministic_algorithms()
    elif device_type == "cuda":
        torch.backends.cudnn.benchmark = True  # fixed window shapes: the tuned kernels are reused every step
    if multi_gpu == "ddp":
        return DistributedStrategy(device_type, backend, hardware.gpu_ids, hardware.sync_bn, hardware.dist_timeout,
                                   config.parallel.grad_compression)
    if multi_gpu == "fsdp":
        # Imported here: FSDP's modules (DTensor, distributed checkpoints) take seconds to import,
        # which runs that do not shard need not pay.
        from training.distributed.fsdp import FullyShardedStrategy
        return FullyShardedStrategy(device_type, backend, hardware.gpu_ids, hardware.dist_timeout,
                                    config.parallel.reshard_after_forward)
    if multi_gpu == "dp" and device_type == "cuda":
        return DataParallelStrategy(hardware.gpu_ids or list(range(torch.cuda.device_count())))
    label = "dp" if multi_gpu == "dp" else "single"
    if device_type == "cuda":
        return SingleDevice(torch.device("cuda", (hardware.gpu_ids or [0])[0]), label=label)
    return SingleDevice(torch.device("cpu"), label=label)
