"""The device-resident path: a split copied to the device once, batches cut there by index_select."""
import math

import torch

DEVICE_DATA_SHARE = 0.25  # --data-path auto keeps the splits on a GPU when they take at most this share


class DeviceResidentLoader:
    """Yields the same batches, in the same order, as `make_loader` with the same sampler.

    HAR splits are a few tens of MB, so they fit on any GPU: keeping them there removes the
    per-batch host-to-device copy and the worker processes. Each epoch the sampler's indices
    (one per-rank slice of the seeded permutation) go to the device in one copy, and the rank's
    shard is gathered there in that order once.
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
