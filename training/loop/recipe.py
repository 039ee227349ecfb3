"""The generalisation recipe's parts around the training step: the batch augmenter, the weight average,
and the feature pool of a model whose features do not learn."""
import copy
import dataclasses
import time

import numpy as np
import torch

from data.augment import BatchAugmenter, class_mask, sensor_triples
from data.splits import Split
from data.store import StoreSplit
from training.config.settings import DEFAULT_FLIP_CLASSES, DEFAULT_ROTATE_WIDE_CLASSES
from training.errors import UsageError


def build_augmenter(recipe, normalization, channel_names, class_names, device, warn):
    """The batch augmenter the settings ask for, fitted to this data's layout and classes, or None."""
    changes, dropped = fit_augment_to_data(recipe, channel_names, class_names)
    if dropped:
        warn(dropped)
    kinds = dataclasses.replace(recipe, **changes).augment_config
    if kinds is None:
        return None
    return BatchAugmenter(kinds, normalization["mean"], normalization["std"], channel_names, class_names).to(device)


def fit_augment_to_data(recipe, channel_names, class_names):
    """({setting: value} leaving out what this data cannot take, and one line saying which and why, or
    ''). Rotation and flip turn each sensor's x/y/z together: channel names without such triples give
    no layout to turn. The class defaults name UCI HAR's classes; a class flag given that names a
    class the data lacks is refused."""
    kinds = recipe.augment_config
    if kinds is None:
        return {}, ""
    turning = [kind for kind in ("rotate", "flip") if kind in kinds.kinds]
    dropped, reasons, changes = [], [], {}
    if turning and not sensor_triples(channel_names):
        dropped += turning
        reasons.append(f"without {' and '.join(map(repr, turning))}: these channels have no x/y/z triples to turn")
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
    return WeightAverage(model, recipe.ema_decay) if recipe.ema_decay > 0 else None


class WeightAverage:
    """An exponential moving average of the weights, used for validation, best.pt and the test: it
    follows `model` (the bare module the optimizer updates) with a copy of its own.

    torch.optim.swa_utils.AveragedModel keeps its update count on the device, so a decay that
    warms up with the count would need a host sync every step; here the count is a Python int."""

    def __init__(self, model, decay):
        self.source, self.decay = model, decay
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
                torch._foreach_copy_(averaged, current)
        self.updates = 0

    def update(self):
        """Fold the model's current weights (and float buffers, e.g. BatchNorm statistics) in."""
        self.updates += 1
        # Early on the average would mostly remember the random initialisation: start short.
        decay = min(self.decay, (1 + self.updates) / (10 + self.updates))
        parameters, float_buffers, exact_buffers = self._tensors()
        with torch.no_grad():
            for averaged, current in (parameters, float_buffers):
                if averaged:
                    torch._foreach_lerp_(averaged, current, 1.0 - decay)
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
            buffers = list(zip(self.module.buffers(), self.source.buffers(), strict=True))
            self._pairs = [_lists(zip(self.module.parameters(), self.source.parameters(), strict=True)),
                           _lists((a, b) for a, b in buffers if a.is_floating_point()),
                           _lists((a, b) for a, b in buffers if not a.is_floating_point())]
        return self._pairs


def _lists(pairs):
    pairs = list(pairs)
    return [a for a, _ in pairs], [b.detach() for _, b in pairs]


# Fixed features computed once. A model whose features do not learn (MiniRocket: FIXED_FEATURES)
# trains its head on a pool of views of the training windows, transformed before the first step,
# instead of transforming every batch again in every epoch.
#
# View 0 holds the windows as they are; each further view holds them through the recipe's
# augmenter, drawn from a seed of its own, so a resumed run and every rank rebuild the same pool.
# Epoch e trains on view e mod V (data.loaders.ShardedSampler), so with 20 epochs and 4 views each
# augmented view is seen 5 times where per-batch augmentation would have drawn 20 new ones; the
# nested estimate in docs/training.md is what chose that trade. Validation and test windows are
# transformed once too. The pool is kept in host memory: (V x training + validation + test windows)
# x features x 4 bytes.
POOL_CHUNK = 2048  # windows per call of the model's features(): bounds the memory of one call
VIEW_SEED_STRIDE = 1_000_003  # view v of --seed s is drawn from s x stride + v


def wants_feature_pool(model, views, splits):
    """Whether the run trains on a feature pool: a model with fixed features, --feature-views > 0,
    and windows in memory (a window store's data is beyond memory, and so would its features be)."""
    in_memory = not any(isinstance(split, StoreSplit) for split in splits.values())
    return getattr(model, "FIXED_FEATURES", False) and views > 0 and in_memory


def build_feature_pool(model, splits, views, augment, seed, device, log):
    """(splits of features in place of windows, the number of training views). Without an augmenter
    every view would be the same, so there is one."""
    views = views if augment is not None else 1
    train = splits["train"]
    windows = views * len(train) + sum(len(splits[name]) for name in splits if name != "train")
    start = time.perf_counter()
    bar = log.progress(windows, "transforming windows once")
    train_views = [_features(model, train, device, bar, augment if view else None, seed * VIEW_SEED_STRIDE + view)
                   for view in range(views)]
    pool = {"train": Split(np.concatenate(train_views), np.tile(train.labels, views),
                           np.tile(train.subjects, views))}
    for name, split in splits.items():
        if name != "train":
            pool[name] = Split(_features(model, split, device, bar, None, seed), split.labels, split.subjects)
    bar.close()
    size_mib = sum(split.signals.nbytes for split in pool.values()) / 2**20
    log.info(f"features: {views} view(s) of {len(train)} training windows and the other splits' "
             f"{windows - views * len(train)} windows transformed once, {windows / (time.perf_counter() - start):,.0f} "
             f"windows/s, {size_mib:,.0f} MiB in memory (--feature-views 0 transforms every batch instead)")
    return pool, views


@torch.no_grad()
def _features(model, split, device, bar, augment, seed):
    """The model's features of every window of `split` [N, F], through `augment` when given."""
    chunks = []
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        for first in range(0, max(len(split), 1), POOL_CHUNK):  # an empty split still has [0, F] features
            windows = torch.from_numpy(np.asarray(split.signals[first:first + POOL_CHUNK])).to(device)
            if augment is not None:
                labels = torch.from_numpy(split.labels[first:first + POOL_CHUNK]).to(device)
                windows = augment(windows, labels)
            chunks.append(model.features(windows).cpu().numpy())
            bar.update(len(windows))
    return np.concatenate(chunks)
