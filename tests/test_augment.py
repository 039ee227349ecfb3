"""Batch augmentation and the weight average: physics, determinism per seed and rank, exact bookkeeping."""
import math

import pytest
import torch
from torch import nn

from data.augment import AugmentConfig, BatchAugmenter, parse_kinds, random_rotations
from data.layout import named_triples
from data.splits import channel_names
from data.uci_har import CLASS_NAMES
from models import build_model
from training.checkpoint.train_state import seed_epoch
from training.loop.recipe import WeightAverage

NINE = channel_names("flatten")
MEAN = torch.tensor([0.0, 0.1, -0.2, 0.0, 0.0, 0.0, 0.8, 0.1, 0.3])  # total_acc carries gravity
STD = torch.tensor([0.2, 0.2, 0.3, 0.5, 0.4, 0.6, 0.3, 0.3, 0.4])


def augmenter(*kinds, **strengths):
    return BatchAugmenter(AugmentConfig(kinds=kinds, **strengths), MEAN, STD, NINE)


def raw_of(normalised):
    return normalised * STD.reshape(1, -1, 1) + MEAN.reshape(1, -1, 1)


def batch(seed=0, size=16):
    return torch.randn(size, 9, 128, generator=torch.Generator().manual_seed(seed))


def test_sensor_triples_follow_the_channel_names():
    assert named_triples(NINE) == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert named_triples(channel_names("average")) == [[0, 1, 2]]
    assert named_triples(("a", "b")) == []


def test_rotations_are_proper_and_within_the_angle():
    torch.manual_seed(0)
    rotations = random_rotations(500, math.radians(10), "cpu")
    eye = torch.eye(3).expand(500, 3, 3)
    assert torch.allclose(rotations @ rotations.transpose(1, 2), eye, atol=1e-5)
    assert torch.allclose(torch.linalg.det(rotations), torch.ones(500), atol=1e-5)
    angles = torch.acos(((rotations.diagonal(dim1=1, dim2=2).sum(1) - 1) / 2).clamp(-1, 1))
    assert angles.max() <= math.radians(10) + 1e-3 and angles.max() > math.radians(8)


def test_rotation_turns_every_sensor_together_and_keeps_lengths():
    signals = batch()
    torch.manual_seed(1)
    turned = augmenter("rotate", rotate_deg=30)(signals)
    before, after = raw_of(signals), raw_of(turned)
    assert turned.shape == signals.shape and turned.dtype == signals.dtype
    for first in (0, 3, 6):  # each sensor's x/y/z vector keeps its length at every step
        assert torch.allclose(before[:, first:first + 3].norm(dim=1), after[:, first:first + 3].norm(dim=1),
                              atol=1e-4)
    assert (after - before).abs().max() > 0.05  # and it did turn
    # One rotation per window for all sensors: recover it from total_acc, apply it to body_acc.
    window = 3
    solution = torch.linalg.lstsq(before[window, 6:9].T, after[window, 6:9].T).solution.T
    assert torch.allclose(solution @ before[window, 0:3], after[window, 0:3], atol=1e-3)


def test_flip_turns_every_sensor_of_a_window_half_a_turn_about_x_or_none():
    signals = batch(size=64)
    torch.manual_seed(5)
    before, after = raw_of(signals), raw_of(augmenter("flip")(signals))
    flipped = (after[:, 7] - before[:, 7]).abs().amax(dim=1) > 1e-3  # total_acc_y changed sign
    assert 16 < flipped.sum() < 48  # about half the windows
    for y, z in ((1, 2), (4, 5), (7, 8)):  # every sensor of a flipped window, none of the others
        for axis in (y, z):
            assert torch.allclose(after[flipped, axis], -before[flipped, axis], atol=1e-4)
            assert torch.allclose(after[~flipped, axis], before[~flipped, axis], atol=1e-4)
    assert torch.allclose(after[:, (0, 3, 6)], before[:, (0, 3, 6)], atol=1e-4)  # x stays


def test_flip_limited_to_some_classes_turns_only_their_windows_with_the_same_draws():
    signals, labels = batch(size=64), torch.arange(64) % 6  # LAYING is class 5
    torch.manual_seed(5)
    everyone = raw_of(augmenter("flip")(signals))
    torch.manual_seed(5)
    limited = BatchAugmenter(AugmentConfig(kinds=("flip",), flip_classes=("laying",)), MEAN, STD, NINE,
                             CLASS_NAMES)
    only_laying = raw_of(limited(signals, labels))
    laying = labels == 5
    assert torch.allclose(only_laying[laying], everyone[laying], atol=1e-5)  # same draws for LAYING
    assert torch.allclose(only_laying[~laying], raw_of(signals)[~laying], atol=1e-5)  # others untouched
    assert (everyone[~laying] - raw_of(signals)[~laying]).abs().amax() > 0.1  # which flip would have turned


def test_the_wide_rotation_turns_its_classes_further_with_the_same_draws():
    signals, labels = batch(size=60), torch.arange(60) % 6  # WALKING.. are classes 0, 1, 2
    results = {}
    for name, config in {"narrow": AugmentConfig(kinds=("rotate",), rotate_deg=10),
                         "wide": AugmentConfig(kinds=("rotate",), rotate_deg=40),
                         "mixed": AugmentConfig(kinds=("rotate",), rotate_deg=10, rotate_wide_deg=40,
                                                rotate_wide_classes=("walking", "WALKING_UPSTAIRS"))}.items():
        torch.manual_seed(3)
        results[name] = raw_of(BatchAugmenter(config, MEAN, STD, NINE, CLASS_NAMES)(signals, labels))
    widened = labels <= 1
    assert torch.allclose(results["mixed"][widened], results["wide"][widened], atol=1e-5)
    assert torch.allclose(results["mixed"][~widened], results["narrow"][~widened], atol=1e-5)
    # and the two angles differ where it counts: the gravity channels move further in the wide windows
    moved = (results["wide"] - raw_of(signals))[:, 6:9].abs().amax(dim=(1, 2))
    narrow_moved = (results["narrow"] - raw_of(signals))[:, 6:9].abs().amax(dim=(1, 2))
    assert moved.median() > 2 * narrow_moved.median()


def test_wide_rotation_classes_the_data_lacks_are_refused_or_left_out_with_a_warning():
    from training.config.cli import parse_config
    from training.errors import UsageError
    from training.loop.recipe import build_augmenter
    normalization = {"mean": MEAN, "std": STD}
    recipe = parse_config(["--aug-rotate-wide-classes", "jogging"]).recipe
    with pytest.raises(UsageError, match="^--aug-rotate-wide-classes: no class 'JOGGING' in this data"):
        build_augmenter(recipe, normalization, NINE, CLASS_NAMES, warn=print)
    default = parse_config([]).recipe
    assert default.aug_rotate_wide_classes == "WALKING,WALKING_UPSTAIRS,WALKING_DOWNSTAIRS"
    assert build_augmenter(default, normalization, NINE, CLASS_NAMES, print).widely_turned.tolist() == \
        [True] * 3 + [False] * 3
    warnings = []
    augment = build_augmenter(default, normalization, NINE, ("RUN", "SIT", "LAYING"), warnings.append)
    assert augment.widely_turned is None and "rotate" in augment.config.kinds
    assert warnings == ["augmentation fitted to this data: 'rotate' turns every window by up to 10 degrees: no "
                        "class 'WALKING' in this data (its classes: RUN, SIT, LAYING)"]
    assert parse_config(["--aug-rotate-wide-classes", "none"]).recipe.aug_rotate_wide_classes == "none"
    assert build_augmenter(parse_config(["--aug-rotate-wide-classes", "none"]).recipe, normalization, NINE,
                           CLASS_NAMES, print).widely_turned is None


def test_flip_classes_must_be_classes_of_the_data():
    config = AugmentConfig(kinds=("flip",), flip_classes=("LYING",))
    with pytest.raises(ValueError, match="no class 'LYING' in this data"):
        BatchAugmenter(config, MEAN, STD, NINE, CLASS_NAMES)


def test_a_flip_class_the_data_lacks_is_refused_in_one_line():
    from dataclasses import replace

    from training.config.settings import Recipe
    from training.errors import UsageError
    from training.loop.recipe import build_augmenter
    recipe = Recipe(augment="flip", aug_flip_classes="LYING", aug_rotate_wide_classes="none", aug_rotate_wide_deg=25.0)
    normalization = {"mean": MEAN, "std": STD}
    with pytest.raises(UsageError, match="^--aug-flip-classes: no class 'LYING' in this data"):
        build_augmenter(recipe, normalization, NINE, CLASS_NAMES, warn=print)
    recipe = replace(recipe, aug_flip_classes="laying")
    assert build_augmenter(recipe, normalization, NINE, CLASS_NAMES, warn=print).flippable.tolist() == \
        [False] * 5 + [True]


def test_the_default_flip_is_left_out_for_data_without_its_classes():
    from training.config.cli import parse_config
    from training.loop.recipe import build_augmenter
    recipe = parse_config([]).recipe
    assert "flip" in recipe.augment and recipe.aug_flip_classes == "LAYING"
    warnings = []
    augment = build_augmenter(recipe, {"mean": MEAN, "std": STD}, NINE, ("RUN", "SIT", "LIE"), warnings.append)
    assert "flip" not in augment.config.kinds and "rotate" in augment.config.kinds
    assert warnings == ["augmentation fitted to this data: without 'flip': no class 'LAYING' in this data (its "
                        "classes: RUN, SIT, LIE); 'rotate' turns every window by up to 10 degrees: no class "
                        "'WALKING' in this data (its classes: RUN, SIT, LIE)"]  # one line, said once


def test_the_default_turns_nothing_on_channels_without_xyz_triples():
    from training.config.cli import parse_config
    from training.loop.recipe import build_augmenter
    warnings = []
    augment = build_augmenter(parse_config([]).recipe, {"mean": torch.zeros(2), "std": torch.ones(2)}, ("a", "b"),
                              CLASS_NAMES, warnings.append)
    assert augment.config.kinds == ("scale", "jitter", "shift")
    assert warnings == ["augmentation fitted to this data: without 'rotate' and 'flip': these channels have no "
                        "x/y/z triples to turn"]


def test_scale_multiplies_the_raw_signal_by_one_factor_per_window():
    signals = batch()
    torch.manual_seed(2)
    raw = raw_of(signals)
    scaled = raw_of(augmenter("scale", scale=0.2)(signals))
    factor = (scaled * raw).sum(dim=(1, 2)) / (raw * raw).sum(dim=(1, 2))  # least squares, per window
    assert torch.allclose(scaled, factor.reshape(-1, 1, 1) * raw, atol=1e-4)
    assert ((factor - 1).abs() <= 0.2 + 1e-4).all() and factor.std() > 0.01


def test_shift_is_a_circular_shift_of_each_window():
    signals = batch()
    torch.manual_seed(3)
    shifted = augmenter("shift", shift_steps=5)(signals)
    for window in range(len(signals)):
        matches = [k for k in range(-5, 6) if torch.equal(torch.roll(signals[window], k, dims=1), shifted[window])]
        assert len(matches) == 1


def test_jitter_adds_noise_of_the_given_size():
    signals = batch(size=64)
    torch.manual_seed(4)
    noise = augmenter("jitter", jitter=0.05)(signals) - signals
    assert noise.std().item() == pytest.approx(0.05, rel=0.05)


def test_draws_repeat_for_the_same_seed_epoch_and_rank_and_differ_otherwise():
    """What DDP relies on: each rank draws its own augmentation, and the same one when rerun."""
    signals, full = batch(), augmenter("rotate", "scale", "jitter", "shift")

    def draw(seed, epoch, rank):
        seed_epoch(seed, epoch, rank)
        return full(signals)

    assert torch.equal(draw(42, 3, 0), draw(42, 3, 0))
    assert torch.equal(draw(42, 3, 1), draw(42, 3, 1))
    assert not torch.allclose(draw(42, 3, 0), draw(42, 3, 1))  # ranks differ
    assert not torch.allclose(draw(42, 3, 0), draw(42, 4, 0))  # epochs differ
    assert not torch.allclose(draw(42, 3, 0), draw(7, 3, 0))  # seeds differ


def test_bad_augmentation_requests_are_refused():
    assert parse_kinds("shift, rotate") == ("rotate", "shift")
    assert parse_kinds("none") == ()
    with pytest.raises(ValueError, match="unknown augmentation 'rotation'"):
        parse_kinds("rotation")
    with pytest.raises(ValueError, match="x/y/z channel triples"):
        BatchAugmenter(AugmentConfig(kinds=("rotate",)), [0.0, 0.0], [1.0, 1.0], ("a", "b"))


def test_weight_average_follows_the_warmed_up_decay_exactly():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    average = WeightAverage(model, decay=0.9)
    expected = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    for update in range(1, 30):
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(torch.randn_like(parameter))
        model.train()(torch.randn(8, 4))  # moves BatchNorm's statistics and its batch counter
        average.update()
        decay = min(0.9, (1 + update) / (10 + update))
        for name, tensor in model.state_dict().items():
            if tensor.is_floating_point():
                expected[name] = decay * expected[name] + (1 - decay) * tensor
            else:
                expected[name] = tensor.clone()
    for name, tensor in average.module.state_dict().items():
        assert torch.allclose(tensor.float(), expected[name].float(), atol=1e-5), name
    assert average.module.state_dict()["1.num_batches_tracked"] == 29
    restored = WeightAverage(model, decay=0.9)
    restored.load_state_dict(average.state_dict())
    assert restored.updates == 29
    assert all(torch.equal(a, b) for a, b in zip(restored.module.state_dict().values(),
                                                 average.module.state_dict().values(), strict=True))


def test_the_average_of_a_model_with_fixed_buffers_averages_its_weights_and_leaves_its_buffers():
    torch.manual_seed(0)
    model = build_model("minirocket", 3, 4, width=840)
    model.fit(torch.randn(20, 3, 128).cumsum(dim=2) * 0.1)
    assert model.FIXED_BUFFERS
    average = WeightAverage(model, decay=0.9, fixed_buffers=model.FIXED_BUFFERS)
    start = model.head[-1].weight.detach().clone()
    fitted_std = model.feature_std.clone()
    with torch.no_grad():
        model.head[-1].weight.add_(1.0)
        model.feature_std.mul_(2.0)  # never in training; here it shows the average leaves buffers alone
    average.update()
    weight = 1.0 - min(0.9, 2 / 11)
    torch.testing.assert_close(average.module.head[-1].weight, start + weight)
    assert torch.equal(average.module.feature_std, fitted_std)
