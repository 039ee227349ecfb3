"""Everything that differs between one device, DataParallel, DDP and FSDP, behind one interface:
the Strategy protocol below is all the trainer, the loop, the checkpoints and the tools call.
One device's strategy lives in single.py (with what each method means when there is nobody else to
agree with), DDP's in ddp.py, FSDP's in fsdp.py; DataParallel's is here, beside the choice
(make_strategy) and what it is made from: placement, what this process runs on and under (torchrun's
variables, the visible GPUs) and whether the device, GPU and backend settings fit it
(check_parallel_args).
"""
import os
from typing import Protocol

import torch
from torch import nn

from training.config.settings import CUDA_GRAPH_MODES, SHARDED_OR_DDP
from training.distributed.ddp import DistributedStrategy, RankPlacement
from training.distributed.single import SingleDevice
from training.entry_point import launched_by_torchrun
from training.errors import UsageError
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
    replicated: bool  # every rank steps the whole global batch on a replica of its own (ddp's replicate_model)
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
    def align_with_rank0(self, tensors): ...
    def evaluation_batches(self, loader): ...
    # Agreement between ranks.
    def sum_over_ranks(self, tensor): ...
    def max_over_ranks(self, tensor): ...
    def max_ints(self, values): ...
    def start_max_ints(self, values): ...
    def gather_concat(self, tensor): ...
    def fill_from_owners(self, rows, bounds): ...
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
    if multi_gpu in SHARDED_OR_DDP:
        rank_placement = RankPlacement(device_type=device_type, backend=backend, gpu_ids=hardware.gpu_ids,
                                       timeout_s=hardware.dist_timeout, ranks=distributed_env())
    if multi_gpu == "ddp":
        return DistributedStrategy(placement=rank_placement, sync_bn=hardware.sync_bn,
                                   grad_compression=config.parallel.grad_compression)
    if multi_gpu == "fsdp":
        # Imported here: FSDP's modules (DTensor, distributed checkpoints) take seconds to import,
        # which runs that do not shard need not pay.
        from training.distributed.fsdp import FullyShardedStrategy
        return FullyShardedStrategy(placement=rank_placement,
                                    reshard_after_forward=config.parallel.reshard_after_forward)
    if multi_gpu == "dp" and device_type == "cuda":
        return DataParallelStrategy(hardware.gpu_ids or list(range(torch.cuda.device_count())))
    label = "dp" if multi_gpu == "dp" else "single"
    if device_type == "cuda":
        return SingleDevice(torch.device("cuda", (hardware.gpu_ids or [0])[0]), label=label)
    return SingleDevice(torch.device("cpu"), label=label)


def distributed_env():
    """(rank, local_rank, world_size) from the variables torchrun sets; (0, 0, 1) without them."""
    return (int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0)),
            int(os.environ.get("WORLD_SIZE", 1)))


def resolve_device_type(requested):
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda but no GPU is visible to PyTorch; use --device cpu or auto")
    return requested


def check_gpu_ids(gpu_ids):
    count = torch.cuda.device_count()
    for gpu in gpu_ids or ():
        if gpu >= count:
            raise UsageError(f"--gpu-ids names GPU {gpu}, but {count} GPU(s) are visible"
                             + (f" (0..{count - 1})" if count else "") + "; pick from those")


def free_bytes(device):
    """Memory a new allocation can take on `device`: CUDA's free memory, or the host's MemAvailable
    (None where /proc/meminfo is not there)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as handle:
            fields = dict(line.split(":", 1) for line in handle)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


def check_parallel_args(config):
    """Validate device, GPU and backend settings; returns (device_type, backend). Runs before any
    process is launched, so a bad combination fails once, in one line."""
    hardware, multi_gpu = config.hardware, config.parallel.multi_gpu
    device_type = resolve_device_type(hardware.device)
    if device_type == "cpu" and hardware.gpu_ids:
        raise UsageError("--gpu-ids was given with --device cpu (or no visible GPU); drop one of them")
    check_gpu_ids(hardware.gpu_ids)
    backend = hardware.backend if hardware.backend != "auto" else ("nccl" if device_type == "cuda" else "gloo")
    if multi_gpu == "dp" and hardware.compile and device_type == "cuda":
        raise UsageError("--compile does not work through DataParallel's replica threads; "
                         "use --multi-gpu ddp with --compile")
    if hardware.compile_mode in CUDA_GRAPH_MODES and device_type != "cuda":
        raise UsageError(f"--compile-mode {hardware.compile_mode} records CUDA graphs, which need a GPU; on "
                         f"{device_type} use --compile-mode default")
    if hardware.cuda_graphs and device_type != "cuda":
        raise UsageError(f"--cuda-graphs records CUDA graphs, which need a GPU; on {device_type} drop it")
    if config.optim.amp_dtype == "fp16" and device_type == "cpu":  # before a launcher starts ranks that would refuse it
        raise UsageError("--amp-dtype fp16 needs CUDA; on CPU --amp uses bf16 (drop --amp-dtype)")
    if multi_gpu not in SHARDED_OR_DDP:
        if hardware.sync_bn:
            raise UsageError("--sync-bn only applies to --multi-gpu ddp")
        return device_type, None
    if backend == "nccl" and device_type != "cuda":
        raise UsageError("--backend nccl needs CUDA devices; use --backend gloo on CPU")
    if hardware.sync_bn and device_type != "cuda":
        raise UsageError("--sync-bn needs CUDA (SyncBatchNorm has no CPU kernel); on CPU use "
                         "--norm group or --norm none for batch-split-independent results")
    # Checked from torchrun's LOCAL_WORLD_SIZE, so every rank of the node refuses alike and local
    # rank 0 can say it, instead of only the ranks past the last GPU.
    local_processes = int(os.environ.get("LOCAL_WORLD_SIZE", 1)) if launched_by_torchrun() else 1
    gpus = len(hardware.gpu_ids) if hardware.gpu_ids else torch.cuda.device_count()
    # NCCL refuses two ranks on one GPU; gloo lets them share it (slower, but it tests multi-rank
    # logic with CUDA tensors on a one-GPU machine).
    if device_type == "cuda" and local_processes > gpus and backend == "nccl":
        raise UsageError(f"torchrun starts {local_processes} processes on this node but {gpus} GPU(s) are in use; "
                         "lower --nproc_per_node, pass --backend gloo to share GPUs, or pass --device cpu")
    return device_type, backend
