"""Per-recording standardisation of MiniRocket's features: equal to the model's own when the group's
statistics are the training ones, different when they are not, and one group at a time."""
import numpy as np
import pytest
import torch

from inference.adaptation import (
    MIN_CLASS_MASS,
    adaptable_members,
    adapted_per_group,
    adapted_probabilities,
    class_balanced_weights,
    group_statistics,
    weighted_statistics,
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


def test_class_balanced_statistics_do_not_move_with_the_mix_of_activities():
    rng = np.random.default_rng(1)
    sitting, walking = torch.from_numpy(rng.normal(0, 1, (40, 5))), torch.from_numpy(rng.normal(3, 2, (40, 5)))

    def sure(count, label, classes=3):
        return np.eye(classes)[[label] * count]
    even = torch.cat([sitting, walking])
    even_statistics = weighted_statistics(even, class_balanced_weights(np.concatenate([sure(40, 0), sure(40, 1)])))
    # A day mostly sitting, with a few windows of a third activity under MIN_CLASS_MASS windows' worth.
    rare = int(MIN_CLASS_MASS) - 1
    day = torch.cat([sitting.repeat(5, 1), walking, torch.full((rare, 5), 50.0, dtype=torch.float64)])
    weights = class_balanced_weights(np.concatenate([sure(200, 0), sure(40, 1), sure(rare, 2)]))
    assert float(weights.sum()) == pytest.approx(1.0) and float(weights[-rare:].abs().max()) == 0.0
    for balanced, expected in zip(weighted_statistics(day, weights), even_statistics, strict=True):
        torch.testing.assert_close(balanced, expected)
    assert not torch.allclose(group_statistics(day)[0], group_statistics(even)[0])  # the plain mean moves
