"""The generalisation recipe's parts around the training step: the batch augmenter and the weight
average (the feature pool of a model whose features do not learn has its own room: training/pool/)."""
import copy
import dataclasses

import torch

from data.augment import BatchAugmenter, class_mask
from data.layout import named_triples
from training.config.settings import DEFAULT_FLIP_CLASSES, DEFAULT_ROTATE_WIDE_CLASSES
from training.errors import UsageError


def build_augmenter(recipe, normalization, channel_names, class_names, warn, triples=None, padded=False):
    """The batch augmenter the settings ask for, fitted to this data's layout and classes, or None;
    built on the host, as a model is: `.to(device)` moves it. `triples`: each sensor's x/y/z channels
    as the data's description places them (None: by the names); `padded`: windows of unequal lengths,
    padded at their end with NaN."""
    changes, dropped = fit_augment_to_data(recipe, channel_names, class_names, triples, padded)
    if dropped:
        warn(dropped)
    kinds = dataclasses.replace(recipe, **changes).augment_config
    if kinds is None:
        return None
    return BatchAugmenter(kinds, normalization["mean"], normalization["std"], channel_names, class_names, triples)


def fit_augment_to_data(recipe, channel_names, class_names, triples=None, padded=False):
    """({setting: value} leaving out what this data cannot take, and one line saying which and why, or
    ''). Rotation and flip turn each sensor's x/y/z together: channel names without such triples give
    no layout to turn. The time shift is circular: windows padded at their end would take padding
    into the series. The class defaults name UCI HAR's classes; a class flag given that names a
    class the data lacks is refused."""
    kinds = recipe.augment_config
    if kinds is None:
        return {}, ""
    turning = [kind for kind in ("rotate", "flip") if kind in kinds.kinds]
    dropped, reasons, changes = [], [], {}
    if turning and not (named_triples(channel_names) if triples is None else triples):
        dropped += turning
        reasons.append(f"without {' and '.join(map(repr, turning))}: these channels have no x/y/z triples to turn")
    if padded and "shift" in kinds.kinds:
        dropped.append("shift")
        reasons.append("without 'shift': it shifts windows circularly, which would wrap their NaN padding into them")
    if "flip" in kinds.kinds and "flip" not in dropped and kinds.flip_classes:
        missing = _missing_class(kinds.flip_classes, class_names, "--aug-flip-classes",
                                 recipe.aug_flip_classes == DEFAULT_FLIP_CLASSES)
        if missing:
            dropped.append("flip")
            reasons.append(f"without 'flip': {missing}")
    if "rotate" in kinds.kinds and "rotate" not in dropped and kinds.rotate_wide_classes:
        missing = _missing_class(kinds.rotate_wide_classes, class_names, "--aug-rotate-wide-classes",
                                 recipe.aug_rotate_wide_classes == DEFAULT_ROTATE_WIDE_CLASSES)
        if missing:
            changes["aug_rotate_wide_classes"] = "none"
            reasons.append(f"'rotate' turns every window by up to {kinds.rotate_deg:g} degrees: {missing}")
    if dropped:
        changes["augment"] = ",".join(kind for kind in kinds.kinds if kind not in dropped) or "none"
    return changes, ("augmentation fitted to this data: " + "; ".join(reasons)) if reasons else ""


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
    return WeightAverage(model, recipe.ema_decay, model.FIXED_BUFFERS) if recipe.ema_decay > 0 else None


class WeightAverage:
    """An exponential moving average of the weights, used for validation, best.pt and the test: it
    follows `model` (the bare module the optimizer updates) with a copy of its own.

    torch.optim.swa_utils.AveragedModel keeps its update count on the device, so a decay that
    warms up with the count would need a host sync every step; here the count is a Python int.
    `fixed_buffers`: the model's buffers never change in training, so the copy's stay as they are."""

    def __init__(self, model, decay, fixed_buffers=False):
        self.source, self.decay, self.fixed_buffers = model, decay, fixed_buffers
        self.updates = 0
        self.module = copy.deepcopy(model).eval()
        for parameter in self.module.parameters():
            parameter.requires_grad_(False)
        # What checkpoints read and write: the module, or the strategy's full-tensor view of it when
        # the module is sharded (FSDP).
        self.weights = self.module
        self._pairs = None

    def restart(self):
        """Start the average over from the model's current weights (a resumed run that kept none)."""
        with torch.no_grad():
            for averaged, current in self._tensors():
                if averaged:  # a model may have no buffers of a kind
                    torch._foreach_copy_(averaged, current)
        self.updates = 0

    def update(self):
        """Fold the model's current weights (and float buffers, e.g. BatchNorm statistics) in."""
        self.fold(self.next_weight())

    def next_weight(self):
        """Count one more update and return the share of the current weights it folds in."""
        self.updates += 1
        # Early on the average would mostly remember the random initialisation: start short.
        return 1.0 - min(self.decay, (1 + self.updates) / (10 + self.updates))

    def fold(self, weight):
        """Move the average `weight` of the way to the model: a number, or a device scalar that a
        recorded CUDA graph reads at each replay (training/loop/step_graph.py)."""
        parameters, float_buffers, exact_buffers = self._tensors()
        with torch.no_grad():
            for averaged, current in (parameters, float_buffers):
                if not averaged:
                    continue
                if isinstance(weight, torch.Tensor):  # _foreach_lerp_ would read a tensor weight on the host
                    step = torch._foreach_sub(current, averaged)
                    torch._foreach_mul_(step, weight)
                    torch._foreach_add_(averaged, step)
                else:
                    torch._foreach_lerp_(averaged, current, weight)
            if exact_buffers[0]:
                torch._foreach_copy_(*exact_buffers)  # counters such as num_batches_tracked are copied, not averaged

    def state_dict(self):
        return {"weights": self.weights.state_dict(), "updates": self.updates}

    def load_state_dict(self, state):
        self.weights.load_state_dict(state["weights"])
        self.updates = int(state["updates"])

    def _tensors(self):
        """(average's, model's) tensor lists: parameters, float buffers, other buffers. Parameters and
        buffers stay apart, since under FSDP the parameters are sharded DTensors and buffers are not."""
        if self._pairs is None:  # the same tensors every step: look them up once
            buffers = [] if self.fixed_buffers else list(zip(self.module.buffers(), self.source.buffers(), strict=True))
            self._pairs = [_lists(zip(self.module.parameters(), self.source.parameters(), strict=True)),
                           _lists((a, b) for a, b in buffers if a.is_floating_point()),
                           _lists((a, b) for a, b in buffers if not a.is_floating_point())]
        return self._pairs


def _lists(pairs):
    pairs = list(pairs)
    return [a for a, _ in pairs], [b.detach() for _, b in pairs]

