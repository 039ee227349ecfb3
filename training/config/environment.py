"""What this process runs on and under: visible GPUs, torchrun's variables, and which flags fit them."""
import os

import torch

from training.config.settings import CUDA_GRAPH_MODES, SHARDED_OR_DDP
from training.errors import UsageError


def distributed_env():
    """(rank, local_rank, world_size) from the variables torchrun sets; (0, 0, 1) without them."""
    return (int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0)),
            int(os.environ.get("WORLD_SIZE", 1)))


def launched_by_torchrun():
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


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
