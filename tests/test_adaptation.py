"""Per-recording standardisation of MiniRocket's features: equal to the model's own when the group's
statistics are the training ones, different when they are not, and one group at a time."""
import numpy as np
import pytest
import torch

from inference.adaptation import (
    adaptable_members,
    adapted_per_group,
    adapted_probabilities,
    group_statistics,
)
from inference.bundle import ModelBundle, RawUnitModel, probabilities
from models import build_model
from training.config.settings import RunConfig
from training.errors import UsageError

CHANNELS, STEPS, CLASSES = 3, 64, 4


def bundle_of(net, model="minirocket"):
    raw = RawUnitModel(net, torch.zeros(CHANNELS), torch.ones(CHANNELS)).eval()
    return ModelBundle(raw, np.zeros(CHANNELS, np.float32), np.ones(CHANNELS, np.float32),
                       tuple("ABCD"), ("x", "y", "z"), 50.0, STEPS, "raw", RunConfig().replace(model=model), "test.pt")


@pytest.fixture(scope="module")
def windows():
    rng = np.random.default_rng(0)
    time = np.arange(STEPS) / 50.0
    waves = np.sin(2 * np.pi * rng.uniform(0.5, 4, (200, CHANNELS, 1)) * time)
    return (waves + 0.3 * rng.standard_normal((200, CHANNELS, STEPS))).astype(np.float32)


@pytest.fixture(scope="module")
def fitted(windows):
    torch.manual_seed(0)
    net = build_model("minirocket", CHANNELS, CLASSES, dropout=0.0, window_steps=STEPS, width=840)
    net.fit(windows)  # fewer windows than fit draws: its statistics are those of exactly these windows
    with torch.no_grad():
        net.head[-1].weight.normal_(0, 0.3)
    return bundle_of(net)


def test_own_statistics_equal_to_the_training_ones_give_the_model_s_probabilities(fitted, windows):
    ours = adapted_probabilities(fitted, windows, torch.device("cpu"))
    theirs = probabilities(fitted, windows, torch.device("cpu"))
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


def test_other_statistics_change_the_probabilities_and_a_shift_of_the_group_is_undone(fitted, windows):
    some = windows[:60]
    ours = adapted_probabilities(fitted, some, torch.device("cpu"))
    assert np.abs(ours - probabilities(fitted, some, torch.device("cpu"))).max() > 1e-3
    member = adaptable_members(fitted)[0]
    with torch.no_grad():
        features = member.model.transform(torch.from_numpy(some))
    mean, std = group_statistics(features)
    torch.testing.assert_close(mean, features.mean(dim=0))
    assert float(std.min()) >= 1e-3  # constant features are centred, not divided by zero


def test_each_group_is_standardised_on_its_own(fitted, windows):
    groups = np.repeat([7, 3], 100)
    together = adapted_per_group(fitted, windows, groups, torch.device("cpu"))
    np.testing.assert_allclose(together[groups == 7], adapted_probabilities(fitted, windows[:100], torch.device("cpu")))
    np.testing.assert_allclose(together[groups == 3], adapted_probabilities(fitted, windows[100:], torch.device("cpu")))


def test_a_model_without_minirocket_features_is_refused_in_one_line():
    net = build_model("cnn1d", CHANNELS, CLASSES, dropout=0.0)
    with pytest.raises(UsageError, match="needs a minirocket checkpoint"):
        adaptable_members(bundle_of(net, model="cnn1d"))


