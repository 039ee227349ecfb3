"""Batches from in-memory arrays or a window store: datasets that take whole batches, the
device-resident path (a split copied to the device once, batches cut there by index_select), and
the rank-sharded samplers whose order a resumed run continues."""
import contextlib
import ctypes
import ctypes.util
import math
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

ITER_CHUNK = 65_536  # sampler indices turned into Python ints at a time
STREAM_BLOCK = 256  # neighbouring windows of a store read together (about 0.3 to 0.6 MB)
STORE_PREFETCH = 8  # batches a store's reader thread keeps ready ahead of the step
TRIM_EVERY = 32  # batches a store's reader thread reads between handing freed memory back (release_freed_memory)
DEVICE_DATA_SHARE = 0.25  # --data-path auto keeps the splits on a GPU when they take at most this share


class WindowDataset(Dataset):
    """A split's windows, in memory or a window store's (read in DataLoader workers, with
    --num-workers); a batch is one fancy-index, not N item calls."""

    def __init__(self, split):
        self.split, self.signals = split, split.signals

    def __len__(self):
        return len(self.split)

    def __getitem__(self, index):
        signals, labels = read_batch(self.split, [index])
        return signals[0], labels[0]

    def __getitems__(self, indices):
        return read_batch(self.split, indices)


def read_batch(split, positions):
    """(float32 signals, int64 labels) of a split's windows at these positions."""
    positions = np.asarray(positions, dtype=np.int64)
    labels = split.labels[positions].astype(np.int64, copy=False)  # a store's int8 widened; in-memory ones as they are
    return torch.from_numpy(split.signals[positions]), torch.from_numpy(labels)


def epoch_order(num_samples, seed, epoch, shuffle=True):
    """The global sample order of one epoch: a permutation seeded by (seed + epoch), or 0..N-1."""
    if not shuffle:
        return torch.arange(num_samples)
    generator = torch.Generator().manual_seed(seed + epoch)
    return torch.randperm(num_samples, generator=generator)


class ShardedSampler(Sampler):
    """One rank's share of the epoch order: positions rank, rank + world, rank + 2 world, ...

    With pad=True the order wraps around so every rank gets the same count (training, where
    ranks must step together); with pad=False nothing is repeated (evaluation stays exact).
    Rank r of W sees order[r::W], so a batch of B on each of W ranks covers the same samples
    as one process with batch B x W.

    `start` is a global position in the epoch order: a run resumed mid-epoch shards only
    order[start:], so it sees exactly the samples not yet seen, whatever its world size.

    Not torchdata's StatefulDataLoader: its state counts what each rank's loader has yielded, which
    cannot be resumed with another number of ranks, and it does not cover the device-resident path;
    here the whole state is (seed, epoch, start), kept in the train state.

    `views` > 1: the split holds that many views of the same num_samples windows one after the
    other (a feature pool), and epoch e draws from view e mod views, in the same order.
    """

    def __init__(self, num_samples, world_size=1, rank=0, shuffle=True, seed=0, pad=True, views=1):
        self.num_samples, self.world_size, self.rank = num_samples, world_size, rank
        self.shuffle, self.seed, self.pad, self.views = shuffle, seed, pad, views
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch, start=0):
        if not 0 <= start <= self.num_samples:
            raise ValueError(f"start position {start} is outside an epoch of {self.num_samples} samples")
        self.epoch, self.start = epoch, start

    def order(self):
        """The epoch's global order of samples."""
        return epoch_order(self.num_samples, self.seed, self.epoch, self.shuffle)

    def indices(self):
        """This rank's sample indices for the epoch, in order, as a tensor."""
        order = self.order()
        remaining = order[self.start:]
        if self.pad and len(remaining):
            # Wrap with the start of the order, as an uninterrupted epoch would have.
            padding = len(self) * self.world_size - len(remaining)
            wrap = order.repeat(math.ceil(padding / self.num_samples) if padding else 0)[:padding]
            remaining = torch.cat([remaining, wrap])
        return remaining[self.rank::self.world_size] + (self.epoch % self.views) * self.num_samples

    def __iter__(self):
        # In chunks: a list of every index of a large split would hold gigabytes of Python ints.
        for chunk in self.indices().split(ITER_CHUNK):
            yield from chunk.tolist()

    def __len__(self):
        remaining = self.num_samples - self.start
        if self.pad:
            return math.ceil(remaining / self.world_size)
        return len(range(self.rank, remaining, self.world_size))


def gathered_order(num_samples, world_size):
    """Which window each position of an evaluation gathered from every rank holds: rank 0's share
    (every world_size-th window from 0, as ShardedSampler deals an unshuffled split), then rank 1's..."""
    return np.concatenate([np.arange(rank, num_samples, world_size) for rank in range(world_size)])


class BlockShuffledSampler(ShardedSampler):
    """ShardedSampler over a window store's split: the epoch visits blocks of STREAM_BLOCK neighbouring
    windows in a seeded random order, and the windows of each block in random order, so the reads
    of a batch stay within a block of one shard file instead of jumping across the disk."""

    def order(self):
        return block_order(self.num_samples, self.seed, self.epoch)


def block_order(num_samples, seed, epoch, block=STREAM_BLOCK):
    """A permutation of 0..N-1, deterministic per (seed, epoch), that keeps blocks of `block`
    neighbours together: the blocks in a random order, the positions within each block shuffled.
    Built in int32 where N allows, without a sort over all N keys: a split of tens of millions of
    windows costs a few hundred MB for a moment, not gigabytes."""
    generator = torch.Generator().manual_seed(seed + epoch)
    index_type = torch.int32 if num_samples < 2 ** 31 else torch.int64
    full, tail = divmod(num_samples, block)
    blocks = torch.randperm(full + (tail > 0), generator=generator)
    within = torch.rand(full, block, generator=generator).argsort(dim=1).to(index_type)
    within += (torch.arange(full, dtype=index_type) * block)[:, None]
    if not tail:
        return within[blocks].reshape(-1)
    last = full * block + torch.randperm(tail, generator=generator).to(index_type)
    cut = int((blocks == full).nonzero())  # where the short last block falls in the order
    return torch.cat([within[blocks[:cut]].reshape(-1), last, within[blocks[cut + 1:]].reshape(-1)])


class StoreStreamLoader:
    """A window store's batches in the sampler's order, read ahead by one background thread of this
    process. Reads from disk release the interpreter, so the thread fills the next batches while
    the step runs; unlike DataLoader workers it needs no second process, no copy of each batch
    between processes and no second share of the cores, which on a small machine the step needs.

    The thread hands over each read's batches together (8 batches of 32), not one at a time: every
    hand-over wakes the thread, which then takes the interpreter lock from the step; once a batch,
    that cost a feature pool's steps about a tenth of their time (docs/performance.md).

    `convert`: a function the thread applies to each read's signals before it cuts them into batches
    (a feature pool's counts made the features the model reads), work taken off the step."""

    def __init__(self, split, batch_size, sampler, pin_memory=False, convert=None):
        self.split, self.signals = split, split.signals
        self.batch_size, self.sampler, self.pin_memory, self.convert = batch_size, sampler, pin_memory, convert

    def __len__(self):
        return math.ceil(len(self.sampler) / self.batch_size)

    def __iter__(self):
        order = self.sampler.indices().numpy()
        reads_ahead = math.ceil(STORE_PREFETCH / (self._per_read() // self.batch_size))
        ready, stop = queue.Queue(maxsize=reads_ahead), threading.Event()
        reader = threading.Thread(target=self._read, args=(order, ready, stop), daemon=True)
        reader.start()
        try:
            while (item := ready.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                yield from item
        finally:  # also when the loop leaves the epoch early: the reader stops at its next read
            stop.set()
            while reader.is_alive():
                with contextlib.suppress(queue.Empty):
                    ready.get(timeout=0.1)

    def _per_read(self):
        # One read per block of the order rather than per batch: a block's windows lie in one or two
        # shard files, read once per STREAM_BLOCK windows, and the reads' own Python (which holds the
        # interpreter lock the step needs) runs once where it ran once a batch.
        return max(1, STREAM_BLOCK // self.batch_size) * self.batch_size

    def _read(self, order, ready, stop):
        per_read = self._per_read()
        try:
            made = 0
            for first in range(0, len(order), per_read):
                signals, labels = read_batch(self.split, order[first:first + per_read])
                if self.convert is not None:
                    signals = self.convert(signals)
                batches = list(zip(signals.split(self.batch_size), labels.split(self.batch_size), strict=True))
                if self.pin_memory:
                    batches = [tuple(part.pin_memory() for part in batch) for batch in batches]
                if made // TRIM_EVERY != (made + len(batches)) // TRIM_EVERY:
                    release_freed_memory()
                made += len(batches)
                if not _put(ready, batches, stop):
                    return
            _put(ready, None, stop)
        except BaseException as exc:  # noqa: BLE001 - handed to the training loop, which raises it
            _put(ready, exc, stop)


def _libc():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


LIBC = _libc()


def release_freed_memory():
    """Hand the pages of freed heap blocks back to the system (glibc's malloc_trim; elsewhere nothing).
    Batches made by the reader thread and freed by the step are megabytes each, and glibc keeps freed
    blocks in its arenas: a validation pass over a feature pool on disk grew the process by 0.9 GiB
    (28,812 windows, batches of 256) where the batches in flight are a few MB. Most of that growth was
    the pass's own (its kept pieces pinned the space each batch freed: training/loop/evaluation.py);
    trimming every TRIM_EVERY batches bounds what the arenas keep whatever the consumer does."""
    trim = getattr(LIBC, "malloc_trim", None)
    if trim is not None:
        trim(0)


def _put(ready, item, stop):
    """Queue `item`, waiting for room; False once the consumer has gone."""
    while not stop.is_set():
        try:
            ready.put(item, timeout=0.1)
            return True
        except queue.Full:
            pass
    return False


def _whole_batch(batch):
    return batch  # WindowDataset.__getitems__ already returns stacked tensors


def make_loader(split, batch_size, sampler, num_workers=0, pin_memory=False, convert=None):
    """The DataLoader path: host batches, copied to the device by the loop (non_blocking when pinned).
    A window store's split is read by a background thread (StoreStreamLoader, which applies
    `convert` to what it reads), or by DataLoader workers when --num-workers asks for them (which
    apply nothing: the batches stay what the model reads either way)."""
    streaming = not isinstance(split.signals, np.ndarray)  # a window store's, or a feature pool's shards on disk
    if streaming and num_workers == 0:
        return StoreStreamLoader(split, batch_size, sampler, pin_memory, convert)
    workers = {"persistent_workers": True, "prefetch_factor": 4} if num_workers > 0 else {}
    # Its own generator: each new iterator draws a worker seed from it, and drawing from the
    # global one instead would shift the dropout masks of a run resumed mid-epoch.
    return DataLoader(WindowDataset(split), batch_size=batch_size, sampler=sampler,
                      num_workers=num_workers, pin_memory=pin_memory, collate_fn=_whole_batch,
                      drop_last=False, generator=torch.Generator(), **workers)


@dataclass(frozen=True)
class LoaderRequest:
    """What one rank asks of its splits' loaders: the batch sizes, where the batches go and which share
    of each epoch's order is this rank's, and how the windows are read."""
    train_batch: int  # samples per training batch this process loads
    eval_batch: int  # samples per validation or test batch
    device: torch.device  # where the step reads the batches (and where --data-path device keeps the splits)
    world_size: int = 1  # the ranks each epoch's order is dealt over
    rank: int = 0  # this process's share of it
    seed: int = 0  # the training order's: epoch e shuffles with seed + e
    data_path: str = "auto"  # --data-path: auto, device or dataloader
    num_workers: int = 0  # DataLoader worker processes (0: none, or a store's reader thread)
    train_views: int = 1  # the training split holds this many views of its windows, one per epoch in turn
    whole_training_batches: bool = False  # every rank draws the whole training order, as one process would
    convert: Callable | None = None  # what a store's reader thread applies to the signals it reads


def split_loaders(splits, request):
    """This rank's batches of each split (name -> split), as `request` (a LoaderRequest) asks: cut on
    the device when --data-path keeps the splits there, else from a DataLoader (a window store's,
    streamed from disk, always). Training shuffles and pads so ranks step together; evaluation does
    neither; whole training batches are a replicated model's. Returns (loaders, a line saying which
    path the batches take)."""
    num_workers, device = request.num_workers, request.device
    streaming = any(not isinstance(split.signals, np.ndarray) for split in splits.values())  # read from disk
    on_device = not streaming and keep_on_device(request.data_path, num_workers, device,
                                                 split_bytes(*splits.values()))
    loaders = {}
    for name, split in splits.items():
        training = name == "train"
        kind = BlockShuffledSampler if streaming and training else ShardedSampler
        views = request.train_views if training else 1
        ranks = (1, 0) if training and request.whole_training_batches else (request.world_size, request.rank)
        sampler = kind(len(split) // views, *ranks, shuffle=training, seed=request.seed, pad=training, views=views)
        batch = request.train_batch if training else request.eval_batch
        loaders[name] = (DeviceResidentLoader(split, batch, sampler, device) if on_device else
                         make_loader(split, batch, sampler, num_workers, pin_memory=device.type == "cuda",
                                     convert=request.convert))
    if streaming:
        reader = f"{num_workers} DataLoader worker(s)" if num_workers else "a reader thread"
        converts = ", which turns the counts into features" if request.convert is not None and not num_workers else ""
        return loaders, (f"streamed from the store by {reader}{converts}, blocks of {STREAM_BLOCK} windows in a "
                         "shuffled order")
    if on_device:
        return loaders, "splits kept on the device, batches cut there"
    return loaders, f"DataLoader with {num_workers} worker(s)"


def window_shape(loader):
    """[channels, steps] of the windows a loader of any path yields, known without a batch: each of
    them (a DataLoader through its dataset) holds the split's `signals`."""
    source = loader.dataset if isinstance(loader, DataLoader) else loader
    return tuple(source.signals.shape[1:])


class DeviceResidentLoader:
    """Yields the same batches, in the same order, as `make_loader` with the same sampler.

    HAR splits are a few tens of MB, so they fit on any GPU: keeping them there removes the
    per-batch host-to-device copy and the worker processes. Each epoch the sampler's indices
    (one per-rank slice of the seeded permutation) go to the device in one copy, and the rank's
    shard is gathered there in that order: once per epoch on a GPU, batch by batch on a CPU.
    """

    def __init__(self, split, batch_size, sampler, device):
        self.signals = torch.from_numpy(split.signals).to(device)
        self.labels = torch.from_numpy(split.labels).to(device)
        self.batch_size, self.sampler, self.device = batch_size, sampler, device

    def __len__(self):
        return math.ceil(len(self.sampler) / self.batch_size)

    def __iter__(self):
        order = self.sampler.indices().to(self.device, non_blocking=True)
        if self.device.type == "cpu":
            # A gather per batch: the whole epoch's gather would write a fresh copy of the split,
            # and on a CPU its page faults cost more than the batches' own small copies.
            for first in range(0, len(order), self.batch_size):
                rows = order[first:first + self.batch_size]
                yield self.signals.index_select(0, rows), self.labels.index_select(0, rows)
            return
        # One gather per epoch on a GPU; each batch is then a view, not a gather (a launch) of its own.
        signals, labels = self.signals.index_select(0, order), self.labels.index_select(0, order)
        for first in range(0, len(order), self.batch_size):
            yield signals[first:first + self.batch_size], labels[first:first + self.batch_size]


def split_bytes(*splits):
    """Bytes the splits' signals and labels take once copied to a device."""
    return sum(split.signals.nbytes + split.labels.nbytes for split in splits)


def keep_on_device(data_path, num_workers, device, data_bytes):
    """--data-path's choice: auto keeps the splits on the device unless workers were asked for or
    they would take more than DEVICE_DATA_SHARE of the free GPU memory."""
    if data_path != "auto":
        return data_path == "device"
    if num_workers > 0:
        return False
    if device.type != "cuda":
        return True  # already in this memory: nothing is copied
    free_bytes, _ = torch.cuda.mem_get_info(device)
    return data_bytes <= DEVICE_DATA_SHARE * free_bytes
