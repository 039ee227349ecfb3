"""Everything that differs between one device, DataParallel and DDP, behind one small interface.

The trainer and loop only call: wrap, shard_like, eval_model, no_sync, clip_grad_norm_,
module_state, optimizer_state, load_from_rank0, evaluation_batches, sum_over_ranks, max_over_ranks,
max_ints, start_max_ints, gather_concat, gather_objects, check_same_on_all_ranks, sync_buffers,
memory_report, model_state_report, reset_memory_peaks, synchronize and close. FSDP's strategy
lives in fsdp.py.
"""
import contextlib
import datetime
import gc
import inspect
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from training.config.environment import check_parallel_args, distributed_env
from training.errors import UsageError
from training.reporting.memory import describe, memory_fields, read_memory, reset_peaks


class SingleDevice:
    """One process, one device. Also what DataParallel falls back to without a GPU."""

    def __init__(self, device, label="single"):
        self.device = device
        if device.type == "cuda":
            torch.cuda.set_device(device)  # keeps stray allocations and contexts off GPU 0
        self.name = label
        self.rank, self.local_rank, self.world_size = 0, 0, 1
        self.is_main = True

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
        return [_model_state_mb(model, optimizer)]

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

    def gather_objects(self, value):
        return [value]

    def check_same_on_all_ranks(self, value, what):
        """One process always agrees with itself."""

    def broadcast_module(self, module):
        """Make every rank hold rank 0's parameters and buffers (nothing to do in one process)."""

    def sync_buffers(self, module):
        """Make every rank hold rank 0's buffers, e.g. BatchNorm statistics (nothing to do in one process)."""

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


class DistributedStrategy(SingleDevice):
    """DistributedDataParallel, one process per device, ranks taken from torchrun's environment."""

    def __init__(self, device_type, backend, gpu_ids, sync_bn, timeout_s, grad_compression="none", label="ddp"):
        rank, local_rank, world_size = distributed_env()
        if device_type == "cuda":
            visible = gpu_ids or list(range(torch.cuda.device_count()))
            if local_rank >= len(visible) and backend != "gloo":
                raise UsageError(f"local rank {local_rank} has no GPU: {len(visible)} in use on this node; "
                                 "lower --nproc-per-node / torchrun's --nproc_per_node")
            device = torch.device("cuda", visible[local_rank % len(visible)])  # gloo ranks may share a GPU
            torch.cuda.set_device(device)
        else:
            device = torch.device("cpu")
        super().__init__(device, label=label)
        self.rank, self.local_rank, self.world_size = rank, local_rank, world_size
        self.is_main = rank == 0
        self.sync_bn, self.grad_compression = sync_bn, grad_compression
        self._ddp = None
        timeout = datetime.timedelta(seconds=timeout_s)
        store, _, _ = next(dist.rendezvous("env://", rank=rank, world_size=world_size, timeout=timeout))
        # torchrun keeps one store for every --max-restarts attempt: without a key space of its
        # own, a restarted group can read the dead group's addresses and fail to connect.
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        dist.init_process_group(backend, store=dist.PrefixStore(f"har-attempt-{attempt}", store), rank=rank,
                                world_size=world_size, timeout=timeout,
                                device_id=device if backend == "nccl" else None)
        # Control messages (stop requests, RNG states) are tiny CPU values: a gloo group carries
        # them without making the host wait for the GPU stream, as an NCCL collective would.
        self._control = dist.new_group(backend="gloo") if backend == "nccl" else None

    @property
    def data_parallel_size(self):
        return self.world_size

    def describe(self):
        compression = f", gradients sent as {self.grad_compression}" if self.grad_compression != "none" else ""
        return (f"{self.name} with {self.world_size} processes ({dist.get_backend()}), rank {self.rank} on "
                f"{self.device}{compression}")

    def wrap(self, model, precision):
        if self.sync_bn:
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        self._ddp = ddp_module(model, self.device)
        if self.grad_compression == "bf16":
            require_bfloat16_all_reduce(self.device)
        if self.grad_compression != "none":
            self.register_comm_hook(*compression_hook(self.grad_compression))
        return self._ddp

    def eval_model(self, model):
        # The bare module: DDP's forward would broadcast buffers, a collective that deadlocks
        # when ranks hold different numbers of evaluation batches.
        return model

    def no_sync(self):
        return self._ddp.no_sync()

    def register_comm_hook(self, state, hook):
        """Have DDP exchange each gradient bucket through `hook` (torch's DDP communication hooks);
        before the first backward."""
        self._ddp.register_comm_hook(state, hook)

    def sum_over_ranks(self, tensor):
        tensor = tensor.clone()
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def max_over_ranks(self, tensor):
        tensor = tensor.clone()
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return tensor

    def start_max_ints(self, values):
        tensor = torch.tensor(values, dtype=torch.int64)
        return _Pending(dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self._control, async_op=True), tensor)

    def gather_objects(self, value):
        """Every rank's picklable `value`, in rank order (in memory only, never from disk)."""
        values = [None] * self.world_size
        dist.all_gather_object(values, value, group=self._control)
        return values

    def gather_concat(self, tensor):
        """Concatenate every rank's 1-D tensor (lengths may differ) on every rank."""
        length = torch.tensor([tensor.numel()], device=self.device)
        lengths = [torch.zeros_like(length) for _ in range(self.world_size)]
        dist.all_gather(lengths, length)
        longest = int(max(lengths).item())
        padded = torch.zeros(longest, dtype=tensor.dtype, device=self.device)
        padded[:tensor.numel()] = tensor
        pieces = [torch.zeros_like(padded) for _ in range(self.world_size)]
        dist.all_gather(pieces, padded)
        return torch.cat([piece[:int(n.item())] for piece, n in zip(pieces, lengths, strict=True)])

    def check_same_on_all_ranks(self, value, what):
        """Fail, rather than hang in a later collective, when ranks disagree on an integer."""
        pair = torch.tensor([value, -value], dtype=torch.int64, device=self.device)
        highest, negative_lowest = self.max_over_ranks(pair).tolist()
        if highest != -negative_lowest:
            raise UsageError(f"ranks disagree on {what} ({-negative_lowest} vs {highest}); every node must "
                             "see the same --save-dir (a shared filesystem) and the same data")

    def broadcast_module(self, module):
        for tensor in module.state_dict().values():
            dist.broadcast(tensor, src=0)

    def sync_buffers(self, module):
        for buffer in module.buffers():
            dist.broadcast(buffer, src=0)

    def memory_report(self):
        """Every rank's figures, gathered so rank 0 can log them all."""
        fields = memory_fields(self.device)
        device_index = -1 if self.device.index is None else self.device.index
        report = []
        for rank, rank_values in enumerate(self._gather_floats([*read_memory(self.device), device_index])):
            *memory, index = rank_values
            label = f"rank{rank}:cuda:{int(index)}" if index >= 0 else f"rank{rank}:cpu"
            report.append(describe(label, fields, memory))
        return report

    def model_state_report(self, model, optimizer):
        mine = _model_state_mb(model, optimizer)
        return [dict(zip(mine, values, strict=True)) for values in self._gather_floats(list(mine.values()))]

    def _gather_floats(self, values):
        """Every rank's list of numbers, in rank order."""
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        gathered = [torch.zeros_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(gathered, tensor)
        return [piece.tolist() for piece in gathered]

    def close(self):
        """End the process group. Whoever holds the wrapped model drops it first: a DDP reducer that
        outlives its process group takes the group down with it when it is freed, holding the GIL,
        while gloo's worker threads may still need the GIL to finish: a hang at exit."""
        self._ddp = None
        gc.collect()  # the reducer is freed here, while the group still exists
        if dist.is_initialized():
            dist.destroy_process_group()


DDP_ARGUMENTS = inspect.signature(DistributedDataParallel.__init__).parameters


def ddp_module(model, device):
    """`model` in DistributedDataParallel as training builds it (the benchmarks and the profiler reuse it).

    Without its per-forward buffer broadcast: DDP would otherwise broadcast every buffer from rank 0
    before each forward, a second collective per step. Training in train mode never reads running statistics,
    so the trainer copies rank 0's buffers only where they are read: before evaluation and at
    checkpoints (sync_buffers)."""
    # torch 2.13 renames the switch (broadcast_buffers warns that it is deprecated); older releases,
    # such as a cluster's torch module, only know the old name.
    no_forward_broadcast = ({"forward_sync_buffers": False} if "forward_sync_buffers" in DDP_ARGUMENTS
                            else {"broadcast_buffers": False})
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                   find_unused_parameters=False, gradient_as_bucket_view=True,
                                   **no_forward_broadcast)


def compression_hook(kind):
    """(state, hook) of DDP communication hooks for --grad-compression: fp16 (torch's) and bf16 (ours,
    below) halve the bytes each all-reduce sends (the average is taken in that precision, then cast
    back); PowerSGD (torch's) sends a rank-1 approximation with error feedback after 1,000
    full-precision steps."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    if kind == "fp16":
        return None, default_hooks.fp16_compress_hook
    if kind == "bf16":
        return None, bfloat16_compress_hook
    state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                        start_powerSGD_iter=1_000, min_compression_rate=2)
    return state, powerSGD_hook.powerSGD_hook


def bfloat16_compress_hook(process_group, bucket):
    """DDP's bucket cast to bf16 and divided by the ranks, summed, and written back in the gradients'
    dtype. torch's own bf16 hook does the same but DDP accepts it on NCCL alone; gloo sums bf16 too in
    recent torch builds, which require_bfloat16_all_reduce checks before this hook is registered."""
    group = process_group if process_group is not None else dist.group.WORLD
    gradients = bucket.buffer()
    compressed = gradients.to(torch.bfloat16).div_(group.size())

    def write_back(future):
        gradients.copy_(future.value()[0])
        return gradients
    return dist.all_reduce(compressed, group=group, async_op=True).get_future().then(write_back)


def require_bfloat16_all_reduce(device):
    """Refuse --grad-compression bf16 where the backend cannot sum bf16 tensors (NCCL before 2.10, gloo
    in older torch builds): asked of the backend with one tiny all-reduce, which every rank makes
    alike, rather than read from version numbers."""
    try:
        dist.all_reduce(torch.zeros(1, dtype=torch.bfloat16, device=device))
    except (RuntimeError, TypeError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise UsageError(f"--grad-compression bf16: this {dist.get_backend()} cannot all-reduce bf16 tensors "
                         f"({reason}); use --grad-compression fp16") from None


def _model_state_mb(model, optimizer):
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


class _Pending:
    """An all-reduce in flight over the control group, and the tensor it reduces into."""

    def __init__(self, work, tensor):
        self.work, self.tensor = work, tensor

    def wait(self):
        self.work.wait()
        return self.tensor.tolist()


class _AutocastForward(nn.Module):
    """Runs the wrapped model's forward under the run's autocast; shares its parameters."""

    def __init__(self, model, precision):
        super().__init__()
        self.model, self.precision = model, precision

    def forward(self, *inputs):
        with self.precision.autocast():
            return self.model(*inputs)


def make_strategy(config):
    """The strategy for --multi-gpu none, dp, ddp or fsdp, with its device chosen."""
    device_type, backend = check_parallel_args(config)
    hardware, multi_gpu = config.hardware, config.parallel.multi_gpu
    if device_type == "cuda":
        torch.backends.cudnn.benchmark = True  # fixed window shapes: the tuned kernels are reused every step
    if multi_gpu == "ddp":
        return DistributedStrategy(device_type, backend, hardware.gpu_ids, hardware.sync_bn, hardware.dist_timeout,
                                   config.parallel.grad_compression)
    if multi_gpu == "fsdp":
        from training.distributed.fsdp import FullyShardedStrategy
        return FullyShardedStrategy(device_type, backend, hardware.gpu_ids, hardware.dist_timeout,
                                    config.parallel.reshard_after_forward)
    if multi_gpu == "dp" and device_type == "cuda":
        return DataParallelStrategy(hardware.gpu_ids or list(range(torch.cuda.device_count())))
    label = "dp" if multi_gpu == "dp" else "single"
    if device_type == "cuda":
        return SingleDevice(torch.device("cuda", (hardware.gpu_ids or [0])[0]), label=label)
    return SingleDevice(torch.device("cpu"), label=label)
