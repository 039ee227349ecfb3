"""The epoch's running training loss and the first step whose loss was NaN/inf, kept off the hot path.

A step only appends its loss tensor to a list: no kernel, no host sync. The list is folded
into two device scalars at read points (log, save, epoch end) and whenever it grows long, so on
a GPU the per-step cost of the tally is a Python append, whatever the step's length.
"""
import torch

NO_NONFINITE_STEP = 2**62  # "no bad step yet": larger than any step, so a minimum over ranks finds the earliest
FOLD_EVERY = 256  # micro-batches kept before folding: bounds the list, costs a few kernels per fold


class EpochTally:
    """This rank's sum of per-sample losses and sample count for the epoch, plus the earliest
    optimizer step whose loss was not finite."""

    def __init__(self, device, loss_sum=0.0, samples=0):
        self.device = device
        self.samples = samples
        self._loss_sum = torch.tensor(loss_sum, dtype=torch.float64, device=device)
        # The first bad micro-batch as an index into _step_of: the step numbers stay on the host,
        # so folding needs no copy to the device (which would wait for the GPU).
        self._earliest_index = torch.tensor(NO_NONFINITE_STEP, dtype=torch.int64, device=device)
        self._step_of = []  # the optimizer step of every micro-batch added, None where not watched
        self._losses, self._sizes = [], []

    def add(self, loss, batch_samples, step):
        """Record a micro-batch's mean loss (a detached device scalar). `step` is the optimizer
        step it belongs to, or None where its NaNs are handled elsewhere (a GradScaler skips them)."""
        self._losses.append(loss)
        self._sizes.append(batch_samples)
        self._step_of.append(step)
        self.samples += batch_samples
        if len(self._losses) >= FOLD_EVERY:
            self._fold()

    def loss_sum(self):
        """The device scalar sum of per-sample losses so far (float64)."""
        self._fold()
        return self._loss_sum

    def earliest_nonfinite_step(self):
        """The step of the first NaN/inf loss, NO_NONFINITE_STEP while there is none (reads the device)."""
        index = int(self.earliest_index())
        return NO_NONFINITE_STEP if index == NO_NONFINITE_STEP else self.step_of(index)

    def earliest_index(self):
        """The device scalar index of the first NaN/inf micro-batch added, NO_NONFINITE_STEP while none."""
        self._fold()
        return self._earliest_index

    def step_of(self, index):
        """The optimizer step of the micro-batch added `index`-th this epoch."""
        return self._step_of[index]

    def _fold(self):
        if not self._losses:
            return
        losses = torch.stack(self._losses).double()
        self._loss_sum += _weighted_sum(losses, self._sizes)
        first = len(self._step_of) - len(self._losses)
        if self._step_of[first] is not None:
            indices = torch.arange(first, len(self._step_of), device=self.device)
            flagged = torch.where(torch.isfinite(losses), NO_NONFINITE_STEP, indices)
            torch.minimum(self._earliest_index, flagged.min(), out=self._earliest_index)
        self._losses, self._sizes = [], []


def _weighted_sum(losses, sizes):
    """sum(loss x batch size) with the sizes as Python numbers: all equal but perhaps the epoch's
    last, so no list of them needs copying to the device."""
    if all(size == sizes[0] for size in sizes[:-1]):
        head = losses[:-1].sum() * sizes[0] if len(sizes) > 1 else 0.0
        return head + losses[-1] * sizes[-1]
    return torch.dot(losses, torch.tensor(sizes, dtype=torch.float64, device=losses.device))
