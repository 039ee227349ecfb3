"""The epoch's loss tally: the weighted mean and the first bad step, however the adds are folded."""
import math

import torch

from training.loop import tally as tally_module
from training.loop.tally import NO_NONFINITE_STEP, EpochTally


def test_mean_is_weighted_by_batch_size_including_a_short_last_batch():
    tally = EpochTally(torch.device("cpu"), loss_sum=3.0, samples=2)  # resumed: two samples of loss 1.5
    for loss, size in ((1.0, 8), (2.0, 8), (4.0, 3)):
        tally.add(torch.tensor(loss), size, step=1)
    assert tally.samples == 21
    assert tally.mean_loss() == (3.0 + 8 * 1.0 + 8 * 2.0 + 3 * 4.0) / 21


def test_uneven_sizes_anywhere_are_weighted_too():
    tally = EpochTally(torch.device("cpu"))
    for loss, size in ((1.0, 5), (2.0, 8), (4.0, 8)):
        tally.add(torch.tensor(loss), size, step=1)
    assert tally.mean_loss() == (5 * 1.0 + 8 * 2.0 + 8 * 4.0) / 21


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
