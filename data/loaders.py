"""Batches from in-memory arrays: a dataset that slices whole batches and a rank-sharded sampler."""
import math

import torch
from torch.utils.data import DataLoader, Dataset, Sampler


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
    """

    def __init__(self, num_samples, world_size=1, rank=0, shuffle=True, seed=0, pad=True):
        self.num_samples, self.world_size, self.rank = num_samples, world_size, rank
        self.shuffle, self.seed, self.pad = shuffle, seed, pad
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        order = epoch_order(self.num_samples, self.seed, self.epoch, self.shuffle)
        if self.pad:
            total = math.ceil(self.num_samples / self.world_size) * self.world_size
            order = order.repeat(math.ceil(total / max(1, self.num_samples)))[:total]
        return iter(order[self.rank::self.world_size].tolist())

    def __len__(self):
        if self.pad:
            return math.ceil(self.num_samples / self.world_size)
        return len(range(self.rank, self.num_samples, self.world_size))


def _whole_batch(batch):
    return batch  # WindowDataset.__getitems__ already returns stacked tensors


def make_loader(split, batch_size, sampler, num_workers=0, pin_memory=False):
    return DataLoader(WindowDataset(split), batch_size=batch_size, sampler=sampler,
                      num_workers=num_workers, pin_memory=pin_memory, collate_fn=_whole_batch,
                      persistent_workers=num_workers > 0, drop_last=False)
