"""The generalisation recipe's parts around the training step: the batch augmenter and the weight average."""
from data.augment import BatchAugmenter, class_mask, sensor_triples
from training.config.cli import DEFAULT_FLIP_CLASSES, DEFAULT_ROTATE_WIDE_CLASSES, augment_config
from training.errors import UsageError
from training.loop.ema import WeightAverage


def build_augmenter(recipe, normalization, channel_names, class_names, device, warn):
    """The batch augmenter the settings ask for, or None."""
    kinds = augment_config(recipe)
    if kinds is None:
        return None
    turning = [kind for kind in ("rotate", "flip") if kind in kinds.kinds]
    if turning and not sensor_triples(channel_names):
        # Both turn each sensor's x/y/z together; without such triples there is nothing to turn.
        warn(f"these channels have no x/y/z triples to turn; augmenting without {' and '.join(map(repr, turning))}")
        kinds.kinds = tuple(kind for kind in kinds.kinds if kind not in turning)
    if "flip" in kinds.kinds and kinds.flip_classes:
        missing = _missing_class(kinds.flip_classes, class_names, "--aug-flip-classes",
                                 recipe.aug_flip_classes == DEFAULT_FLIP_CLASSES)
        if missing:
            warn(f"flip: {missing}; augmenting without 'flip'")
            kinds.kinds = tuple(kind for kind in kinds.kinds if kind != "flip")
    if "rotate" in kinds.kinds and kinds.rotate_wide_classes:
        missing = _missing_class(kinds.rotate_wide_classes, class_names, "--aug-rotate-wide-classes",
                                 recipe.aug_rotate_wide_classes == DEFAULT_ROTATE_WIDE_CLASSES)
        if missing:
            warn(f"rotate: {missing}; every window turns by up to {kinds.rotate_deg:g} degrees")
            kinds.rotate_wide_classes = ()
    if not kinds.kinds:
        return None
    return BatchAugmenter(kinds, normalization["mean"], normalization["std"], channel_names, class_names).to(device)


def _missing_class(names, class_names, flag, is_default):
    """None when the data has every class in `names`, else why not. A flag given that names a class
    the data lacks is refused in one line; a default names UCI HAR's classes, so with other data the
    caller warns and trains without it."""
    try:
        class_mask(names, class_names)
        return None
    except ValueError as exc:
        if not is_default:
            raise UsageError(f"{flag}: {exc}") from None
        return str(exc)


def build_weight_average(recipe, model):
    """The moving average of `model`'s weights the settings ask for, or None."""
    return WeightAverage(model, recipe.ema_decay) if recipe.ema_decay > 0 else None
