"""A log point's figures read from the device without waiting for it.

Each log point starts a copy of its figures (the epoch's loss so far, the LR where it is a device
scalar, the NaN watch, the fp16 skip count) to the host and reads the previous log point's copy,
which finished long ago: a log point no longer waits for the GPU, where its three reads each drained
the queue of steps. So a log line, and a NaN loss, are seen one log interval late. Nothing is saved
on them: every save reads the totals and the watch through checked_totals, which waits for the device."""
from dataclasses import dataclass

import torch

from training.loop.tally import NO_NONFINITE_STEP


@dataclass(frozen=True)
class LogPoint:
    step: int  # the optimizer step the figures were taken after
    mean_loss: float  # the epoch's mean training loss on this rank up to that step
    lr: float
    earliest_nonfinite_step: int  # NO_NONFINITE_STEP while no loss was NaN/inf
    longest_skip_run: int  # fp16 steps the GradScaler skipped in a row (0 without one)

    def health(self):
        """As the stop protocol's message carries it: ints whose maximum over ranks is the worst."""
        return [-self.earliest_nonfinite_step, self.longest_skip_run]


NO_NEWS = [-NO_NONFINITE_STEP, 0]  # LogPoint.health() before a first read: nothing to act on


class LogReadout:
    """The log points of one pass over the training split."""

    def __init__(self, tally, step):
        self.tally, self.step = tally, step  # the pass's EpochTally and TrainStep
        self.pending = None  # the last log point's copy: (step, samples, lr, names, host tensor, event)

    def take(self, step):
        """Start the copy of this log point's figures; return the previous log point's, or None."""
        tally, skips = self.tally, self.step.skips
        lr = self.step.scheduler.get_last_lr()[0]  # a device scalar where AdamW is capturable
        on_device = {"loss_sum": tally.loss_sum(), "earliest_index": tally.earliest_index().double()}
        if isinstance(lr, torch.Tensor):
            on_device["lr"] = lr.double()
        if skips is not None and skips.longest is not None:
            on_device["longest_skip_run"] = skips.longest.double()
        values = torch.stack(list(on_device.values()))
        event = None
        if values.is_cuda:
            host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
            host.copy_(values, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            values = host
        # The host's own figures beside the names of the device's, in the order they were stacked.
        previous, self.pending = self.pending, (step, tally.samples, lr, list(on_device), values, event)
        return self._read(previous)

    def flush(self):
        """The last log point's figures, waiting for them if need be (the pass's end), or None."""
        previous, self.pending = self.pending, None
        return self._read(previous)

    def _read(self, pending):
        if pending is None:
            return None
        step, samples, lr, names, values, event = pending
        if event is not None:
            event.synchronize()
        read = dict(zip(names, values.tolist(), strict=True))
        index = int(read["earliest_index"])
        earliest = NO_NONFINITE_STEP if index == NO_NONFINITE_STEP else self.tally.step_of(index)
        return LogPoint(step, read["loss_sum"] / max(1, samples), float(read.get("lr", lr)), earliest,
                        int(read.get("longest_skip_run", 0)))
