"""Batches from in-memory arrays or a window store: datasets that take whole batches, and the
rank-sharded samplers whose order a resumed run continues."""
import math

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from data.resident import DeviceResidentLoader, keep_on_device, split_bytes
from data.store import StoreSplit

ITER_CHUNK = 65_536  # sampler indices turned into Python ints at a time
STREAM_BLOCK = 256  # neighbouring windows of a store read together (about 0.3 to 0.6 MB)
STORE_WORKERS = 1  # at least this many DataLoader workers read a store ahead of the step


class WindowDataset(Dataset):
    """Signal windows and labels held as tensors; a batch is one fancy-index, not N item calls."""

    def __init__(self, split):
        self.signals = torch.from_numpy(split.signals)
        self.labels = torch.from_numpy(split.labels)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        return self.signals[index], self.labels[index]

    def __getitems__(self, indices):
        index = torch.as_tensor(indices, dtype=torch.long)
        return self.signals[index], self.labels[index]


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
    """

    def __init__(self, num_samples, world_size=1, rank=0, shuffle=True, seed=0, pad=True):
        self.num_samples, self.world_size, self.rank = num_samples, world_size, rank
        self.shuffle, self.seed, self.pad = shuffle, seed, pad
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
        return remaining[self.rank::self.world_size]

    def __iter__(self):
        # In chunks: a list of every index of a large split would hold gigabytes of Python ints.
        for chunk in self.indices().split(ITER_CHUNK):
            yield from chunk.tolist()

    def __len__(self):
        remaining = self.num_samples - self.start
        if self.pad:
            return math.ceil(remaining / self.world_size)
        return len(range(self.rank, remaining, self.world_size))


class BlockShuffledSampler(ShardedSampler):
    """ShardedSampler over a window store's split: the epoch visits blocks of STREAM_BLOCK neighbouring
    windows in a seeded random order, and the windows of each block in random order, so the reads
    of a batch stay within a block of one shard file instead of jumping across the disk."""

    def order(self):
        return block_order(self.num_samples, self.seed, self.epoch)


def block_order(num_samples, seed, epoch, block=None):
    """A permutation of 0..N-1, deterministic per (seed, epoch), that keeps blocks of `block`
    neighbours together: blocks shuffled, and positions within each block shuffled."""
    block = block or STREAM_BLOCK
    generator = torch.Generator().manual_seed(seed + epoch)
    num_blocks = math.ceil(num_samples / block)
    rank_of_block = torch.empty(num_blocks, dtype=torch.float64)
    rank_of_block[torch.randperm(num_blocks, generator=generator)] = torch.arange(num_blocks, dtype=torch.float64)
    key = rank_of_block[torch.arange(num_samples) // block] + torch.rand(num_samples, generator=generator,
                                                                          dtype=torch.float64)
    return torch.argsort(key)


class StoreDataset(Dataset):
    """A window store's split, read batch by batch (in DataLoader workers, ahead of the step)."""

    def __init__(self, split):
        self.split, self.signals = split, split.signals

    def __len__(self):
        return len(self.split)

    def __getitems__(self, indices):
        positions = np.asarray(indices, dtype=np.int64)
        return torch.from_numpy(self.split.signals[positions]), torch.from_numpy(self.split.labels[positions])


def _whole_batch(batch):
    return batch  # WindowDataset.__getitems__ already returns stacked tensors


def make_loader(split, batch_size, sampler, num_workers=0, pin_memory=False):
    """The DataLoader path: host batches, copied to the device by the loop (non_blocking when pinned).
    A window store's split always has at least one worker, which reads the next batches from disk
    while the step runs."""
    streaming = isinstance(split, StoreSplit)
    num_workers = max(num_workers, STORE_WORKERS) if streaming else num_workers
    workers = {"persistent_workers": True, "prefetch_factor": 4} if num_workers > 0 else {}
    # Its own generator: each new iterator draws a worker seed from it, and drawing from the
    # global one instead would shift the dropout masks of a run resumed mid-epoch.
    dataset = StoreDataset(split) if streaming else WindowDataset(split)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler,
                      num_workers=num_workers, pin_memory=pin_memory, collate_fn=_whole_batch,
                      drop_last=False, generator=torch.Generator(), **workers)


def split_loaders(splits, train_batch, eval_batch, device, world_size, rank, seed, data_path="auto", num_workers=0):
    """This rank's batches of each split (name -> split): cut on the device when --data-path keeps
    the splits there, else from a DataLoader (a window store's, streamed from disk, always).
    Training shuffles and pads so ranks step together; evaluation does neither. Returns (loaders,
    a line saying which path the batches take)."""
    streaming = any(isinstance(split, StoreSplit) for split in splits.values())
    on_device = not streaming and keep_on_device(data_path, num_workers, device, split_bytes(*splits.values()))
    loaders = {}
    for name, split in splits.items():
        training = name == "train"
        kind = BlockShuffledSampler if streaming and training else ShardedSampler
        sampler = kind(len(split), world_size, rank, shuffle=training, seed=seed, pad=training)
        batch = train_batch if training else eval_batch
        loaders[name] = (DeviceResidentLoader(split, batch, sampler, device) if on_device else
                         make_loader(split, batch, sampler, num_workers, pin_memory=device.type == "cuda"))
    if streaming:
        return loaders, (f"streamed from the store by {max(num_workers, STORE_WORKERS)} DataLoader worker(s), "
                         f"blocks of {STREAM_BLOCK} windows in a shuffled order")
    if on_device:
        return loaders, "splits kept on the device, batches cut there"
    return loaders, f"DataLoader with {num_workers} worker(s)"


def window_shape(loader):
    """[channels, steps] of the windows a loader (either path) yields, known without a batch."""
    signals = loader.signals if isinstance(loader, DeviceResidentLoader) else loader.dataset.signals
    return tuple(signals.shape[1:])
