"""--multi-gpu ddp: DistributedDataParallel, one process per device, and the DDP pieces the benchmarks and
the profiler reuse (the wrapped module, gradient compression hooks). FSDP (fsdp.py) builds on this strategy."""
import contextlib
import datetime
import gc
import inspect
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from training.distributed.single import SingleDevice, model_state_mb
from training.errors import UsageError
from training.reporting.logger import describe, memory_fields, read_memory

# A feature pool is shared out in pieces of this size: the staging copy on a GPU stays small, and no
# one message nears the 2 GiB that some backends count in a signed 32-bit integer.
SHARE_PIECE_BYTES = 256 * 2**20


def join_process_group(backend, rank, world_size, timeout, prefix, device_id=None):
    """init_process_group over the store torchrun's rendezvous gives, under keys of `prefix` and this
    restart attempt: torchrun keeps one store for every --max-restarts attempt, and without a key
    space of its own a restarted group can read the dead group's addresses and fail to connect."""
    store, _, _ = next(dist.rendezvous("env://", rank=rank, world_size=world_size, timeout=timeout))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group(backend, store=dist.PrefixStore(f"{prefix}-attempt-{attempt}", store), rank=rank,
                            world_size=world_size, timeout=timeout, device_id=device_id)


@dataclass(frozen=True)
class RankPlacement:
    """Where one process of a process group runs and how it joins the group."""
    device_type: str  # "cuda" or "cpu"
    backend: str  # the process group's: "nccl" or "gloo"
    gpu_ids: list | None  # --gpu-ids: the GPUs the node's local ranks take in turn (None: every visible one)
    timeout_s: float  # --dist-timeout: how long a collective waits for the other ranks
    ranks: tuple  # (rank, local_rank, world_size), as strategy.distributed_env reads them from torchrun's environment


class DistributedStrategy(SingleDevice):
    """DistributedDataParallel, one process per device, placed as `placement` (a RankPlacement) says."""

    def __init__(self, *, placement, sync_bn, grad_compression="none", label="ddp"):
        backend = placement.backend
        rank, local_rank, world_size = placement.ranks
        if placement.device_type == "cuda":
            visible = placement.gpu_ids or list(range(torch.cuda.device_count()))
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
        join_process_group(backend, rank, world_size, datetime.timedelta(seconds=placement.timeout_s), "har",
                           device_id=device if backend == "nccl" else None)
        # Control messages (stop requests, RNG states) are tiny CPU values: a gloo group carries
        # them without making the host wait for the GPU stream, as an NCCL collective would.
        self._control = dist.new_group(backend="gloo") if backend == "nccl" else None

    @property
    def data_parallel_size(self):
        return self.world_size

    def describe(self):
        if self.replicated:
            exchange = ", the model replicated: each rank steps the whole global batch"
        else:
            exchange = f", gradients sent as {self.grad_compression}" if self.grad_compression != "none" else ""
        return (f"{self.name} with {self.world_size} processes ({dist.get_backend()}), rank {self.rank} on "
                f"{self.device}{exchange}")

    def replicate_model(self):
        """Before wrap(): train the model as identical replicas, each stepping the whole global batch,
        so that no gradient crosses between ranks (a head over a feature pool, whose all-reduce takes
        longer than its step). Evaluation stays shared out."""
        self.replicated = True

    def wrap(self, model, precision):
        if self.replicated:
            # As DDP's constructor does: every rank starts from rank 0's weights and buffers (the
            # fitted kernels the feature pool's shares are computed with), whatever its hardware rounds.
            self.broadcast_module(model)
            return model
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
        return contextlib.nullcontext() if self.replicated else self._ddp.no_sync()

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

    def fill_from_owners(self, rows, bounds):
        """Rows bounds[r]..bounds[r + 1] - 1 of the host array `rows`, written by rank r alone, copied
        in place into every other rank's `rows`: no gathered copy beside the array. Sent on this rank's
        device in pieces of at most SHARE_PIECE_BYTES (a GPU's through a staging copy)."""
        flat = torch.from_numpy(rows).reshape(-1).view(torch.uint8)
        row_bytes = rows.strides[0] if rows.ndim > 1 else rows.itemsize
        for owner in range(self.world_size):
            for first in range(bounds[owner] * row_bytes, bounds[owner + 1] * row_bytes, SHARE_PIECE_BYTES):
                piece = flat[first:min(first + SHARE_PIECE_BYTES, bounds[owner + 1] * row_bytes)]
                if self.device.type == "cpu":
                    dist.broadcast(piece, src=owner)
                    continue
                mine = owner == self.rank
                on_device = piece.to(self.device) if mine else torch.empty_like(piece, device=self.device)
                dist.broadcast(on_device, src=owner)
                if not mine:
                    piece.copy_(on_device)

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

    def align_with_rank0(self, tensors):
        """Give every rank rank 0's values of these tensors (those on this rank's device)."""
        for tensor in tensors:
            if tensor.device == self.device:
                dist.broadcast(tensor.detach(), src=0)

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
        mine = model_state_mb(model, optimizer)
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
        if self._drop_wrapped_model():
            # The reducer is freed here, while the group still exists. Only then: a full collection
            # over torch._dynamo's objects took 0.15 s at the end of a 2-rank CPU run of the
            # default, whose replicated head has no DDP module.
            gc.collect()
        if dist.is_initialized():
            dist.destroy_process_group()

    def _drop_wrapped_model(self):
        """Let go of the DDP module; whether there was one."""
        wrapped, self._ddp = self._ddp is not None, None
        return wrapped


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


class _Pending:
    """An all-reduce in flight over the control group, and the tensor it reduces into."""

    def __init__(self, work, tensor):
        self.work, self.tensor = work, tensor

    def wait(self):
        self.work.wait()
        return self.tensor.tolist()
