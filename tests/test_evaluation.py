"""The evaluation pass (training.loop.evaluation): what it gathers, against the model run batch by batch."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from data.loaders import DeviceResidentLoader, ShardedSampler
from data.splits import Split
from training.distributed.single import SingleDevice
from training.loop.evaluation import gather_predictions
from training.loop.step import Precision

CPU = torch.device("cpu")


def split_of(count):
    rng = np.random.default_rng(0)
    return Split(rng.normal(size=(count, 3, 16)).astype(np.float32), rng.integers(0, 4, count), np.arange(count) % 3)


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(48, 4))


def test_the_pass_gathers_each_batchs_labels_and_logits_in_the_loaders_order():
    split, net = split_of(70), model()
    loader = DeviceResidentLoader(split, 16, ShardedSampler(70, shuffle=False, pad=False), CPU)  # the last batch 6
    labels, logits, loss = gather_predictions(net, loader, SingleDevice(CPU), Precision(CPU, False, None), 4)
    with torch.no_grad():
        expected = torch.cat([net(signals) for signals, _ in loader])
    assert np.array_equal(labels, split.labels) and torch.equal(torch.from_numpy(logits), expected)
    assert loss == pytest.approx(float(F.cross_entropy(expected, torch.from_numpy(split.labels))), rel=1e-6)


class ShortLoader(DeviceResidentLoader):
    """Yields all but its last batch."""

    def __iter__(self):
        batches = list(super().__iter__())
        return iter(batches[:-1])


def test_a_loader_that_yields_fewer_samples_than_its_sampler_holds_is_an_error_not_a_partly_empty_result():
    loader = ShortLoader(split_of(40), 16, ShardedSampler(40, shuffle=False, pad=False), CPU)
    with pytest.raises(RuntimeError, match="yielded 32 samples where its sampler holds 40"):
        gather_predictions(model(), loader, SingleDevice(CPU), Precision(CPU, False, None), 4)
