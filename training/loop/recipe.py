"""The generalisation recipe's parts around the training step: the batch augmenter and the weight average."""
from data.augment import BatchAugmenter, flippable_classes, sensor_triples
from training.config.cli import DEFAULT_FLIP_CLASSES, augment_config
from training.errors import UsageError
from training.loop.ema import WeightAverage


def build_augmenter(recipe, normalization, channel_names, class_names, device, warn):
    """The batch augmenter the settings ask for, or None."""
    kinds = augment_config(recipe)
    turning = [kind for kind in ("rotate", "flip") if kinds is not None and kind in kinds.kinds]
    if turning and not sensor_triples(channel_names):
        # Both turn each sensor's x/y/z together; without such triples there is nothing to turn.
        warn(f"these channels have no x/y/z triples to turn; augmenting without {' and '.join(map(repr, turning))}")
        kinds.kinds = tuple(kind for kind in kinds.kinds if kind not in turning)
    if kinds is not None and "flip" in kinds.kinds and kinds.flip_classes:
        try:
            flippable_classes(kinds.flip_classes, class_names)
        except ValueError as exc:
            if recipe.aug_flip_classes != DEFAULT_FLIP_CLASSES:
                raise UsageError(f"--aug-flip-classes: {exc}") from None
            # The default names UCI HAR's classes; data with others trains without the flip.
            warn(f"flip: {exc}; augmenting without 'flip'")
            kinds.kinds = tuple(kind for kind in kinds.kinds if kind != "flip")
    if kinds is None or not kinds.kinds:
        return None
    return BatchAugmenter(kinds, normalization["mean"], normalization["std"], channel_names, class_names).to(device)


def build_weight_average(recipe, model):
    """The moving average of `model`'s weights the settings ask for, or None."""
    return WeightAverage(model, recipe.ema_decay) if recipe.ema_decay > 0 else None
