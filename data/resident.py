"""The device-resident path: a split copied to the device once, batches cut there by index_select."""
import math

import torch


class DeviceResidentLoader:
    """Yields the same batches, in the same order, as `make_loader` with the same sampler.

    HAR splits are a few tens of MB, so they fit on any GPU: keeping them there removes the
    per-batch host-to-device copy and the worker processes. Each epoch the sampler's indices
    (one per-rank slice of the seeded permutation) go to the device in one copy.
    """

    def __init__(self, split, batch_size, sampler, device):
        self.signals = torch.from_numpy(split.signals).to(device)
        self.labels = torch.from_numpy(split.labels).to(device)
        self.batch_size, self.sampler, self.device = batch_size, sampler, device

    def __len__(self):
        return math.ceil(len(self.sampler) / self.batch_size)

    def __iter__(self):
        order = self.sampler.indices().to(self.device, non_blocking=True)
        for first in range(0, len(order), self.batch_size):
            batch = order[first:first + self.batch_size]
            yield self.signals.index_select(0, batch), self.labels.index_select(0, batch)


def split_bytes(*splits):
    """Bytes the splits' signals and labels take once copied to a device."""
    return sum(split.signals.nbytes + split.labels.nbytes for split in splits)
