"""The epoch's loss tally: the weighted mean and the first bad step, however the adds are folded."""
import math

import torch

from conftest import requires_cuda
from training.loop import tally as tally_module
from training.loop.tally import NO_NONFINITE_STEP, EpochTally


def test_mean_is_weighted_by_batch_size_including_a_short_last_batch():
    tally = EpochTally(torch.device("cpu"), loss_sum=3.0, samples=2)  # resumed: two samples of loss 1.5
    for loss, size in ((1.0, 8), (2.0, 8), (4.0, 3)):
        tally.add(torch.tensor(loss), size, step=1)
    assert tally.samples == 21
    assert tally.loss_sum().item() / tally.samples == (3.0 + 8 * 1.0 + 8 * 2.0 + 3 * 4.0) / 21


def test_uneven_sizes_anywhere_are_weighted_too():
    tally = EpochTally(torch.device("cpu"))
    for loss, size in ((1.0, 5), (2.0, 8), (4.0, 8)):
        tally.add(torch.tensor(loss), size, step=1)
    assert tally.loss_sum().item() / tally.samples == (5 * 1.0 + 8 * 2.0 + 8 * 4.0) / 21


def test_the_first_nonfinite_step_survives_folds_and_later_bad_steps(monkeypatch):
    monkeypatch.setattr(tally_module, "FOLD_EVERY", 4)  # several folds within the epoch
    tally = EpochTally(torch.device("cpu"))
    losses = [1.0] * 9 + [math.nan, 1.0, math.inf, 1.0]
    for index, loss in enumerate(losses):
        tally.add(torch.tensor(loss), 2, step=100 + index // 2)  # accumulation of 2: two micro-batches a step
        if index == 8:
            assert tally.earliest_nonfinite_step() == NO_NONFINITE_STEP
    assert tally.earliest_nonfinite_step() == 104  # micro-batch 9 belongs to step 100 + 4


def test_losses_left_to_a_grad_scaler_are_not_flagged():
    tally = EpochTally(torch.device("cpu"))
    tally.add(torch.tensor(math.nan), 4, step=None)
    assert tally.earliest_nonfinite_step() == NO_NONFINITE_STEP


class _Step:
    """What LogReadout reads of a TrainStep: the schedule's last LR and the fp16 skip watch."""

    def __init__(self, lr, longest=None):
        self.scheduler = type("Schedule", (), {"get_last_lr": lambda _: [lr]})()
        self.skips = None if longest is None else type("Skips", (), {"longest": longest})()


def check_the_log_points(device):
    from training.loop.readout import LogPoint, LogReadout
    lr = torch.tensor(1e-3, device=device)  # a capturable AdamW's LR: a device scalar the schedule fills in place
    tally = EpochTally(device)
    readout = LogReadout(tally, _Step(lr, longest=torch.tensor(2, device=device)))
    for index in range(10):
        tally.add(torch.tensor(float(index), device=device), 4, step=index + 1)
    assert readout.take(10) is None  # nothing read before the first point
    lr.fill_(5e-4)
    tally.add(torch.tensor(math.nan, device=device), 4, step=11)
    tally.add(torch.tensor(1.0, device=device), 4, step=12)
    assert readout.take(12) == LogPoint(10, sum(range(10)) / 10, float(torch.tensor(1e-3)), NO_NONFINITE_STEP, 2)
    tally.add(torch.tensor(1.0, device=device), 4, step=13)
    last = readout.flush()  # the pass's end: the last point, taken at step 12
    assert (last.step, last.lr, last.earliest_nonfinite_step) == (12, float(torch.tensor(5e-4)), 11)
    assert math.isnan(last.mean_loss) and last.health() == [-11, 2]
    assert readout.flush() is None


def test_a_log_point_reads_the_previous_points_figures_as_they_were_then():
    check_the_log_points(torch.device("cpu"))


@requires_cuda
def test_on_a_gpu_a_log_point_is_copied_to_pinned_memory_and_read_a_point_later():
    check_the_log_points(torch.device("cuda"))


def test_a_log_point_keeps_an_lr_held_on_the_host():
    from training.loop.readout import LogReadout
    tally = EpochTally(torch.device("cpu"))
    readout = LogReadout(tally, _Step(2e-3))
    tally.add(torch.tensor(3.0), 8, step=1)
    readout.take(1)
    point = readout.flush()
    assert (point.mean_loss, point.lr, point.health()) == (3.0, 2e-3, [-NO_NONFINITE_STEP, 0])
