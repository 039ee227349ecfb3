"""The generalisation recipe's parts around the training step: the batch augmenter, the weight average,
and the feature pool of a model whose features do not learn."""
import copy
import time

import numpy as np
import torch

from data.augment import BatchAugmenter, class_mask, sensor_triples
from data.splits import Split
from data.store import StoreSplit
from training.config.settings import DEFAULT_FLIP_CLASSES, DEFAULT_ROTATE_WIDE_CLASSES
from training.errors import UsageError


def build_augmenter(recipe, normalization, channel_names, class_names, device, warn):
    """The batch augmenter the settings ask for, or None."""
    kinds = recipe.augment_config
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
# transformed once too. Under torchrun each rank transforms a share of the pool's windows and the
# ranks then gather it whole: every rank holds the pool, (V x training + validation + test windows)
# x features x the features' bytes, in host memory.
POOL_CHUNK = 2048  # windows per call of the model's features(): bounds the memory of one call
# A rank's share starts and stops at multiples of this inside a chunk, so the model splits it into
# the batches one process would (MiniRocket: 64 windows on a CPU, 1024 elsewhere) and computes
# every feature from the same operations: the shared-out pool is the one-process pool bit for bit.
POOL_SHARE_UNIT = 1024
VIEW_SEED_STRIDE = 1_000_003  # view v of --seed s is drawn from s x stride + v


def wants_feature_pool(model, views, splits):
    """Whether the run trains on a feature pool: a model with fixed features, --feature-views > 0,
    and windows in memory (a window store's data is beyond memory, and so would its features be)."""
    in_memory = not any(isinstance(split, StoreSplit) for split in splits.values())
    return getattr(model, "FIXED_FEATURES", False) and views > 0 and in_memory


def pool_shares(lengths, world_size):
    """Each rank's pieces [(part, first, stop), ...] of parts of these lengths: the parts' windows cut
    into POOL_SHARE_UNIT pieces, dealt out in order in contiguous runs of about equal windows."""
    total = max(sum(lengths), 1)
    shares, done = [[] for _ in range(world_size)], 0
    for part, length in enumerate(lengths):
        for first in range(0, length, POOL_SHARE_UNIT):
            stop = min(first + POOL_SHARE_UNIT, length)
            middle = done + (stop - first) / 2
            shares[min(world_size - 1, int(middle * world_size / total))].append((part, first, stop))
            done += stop - first
    return shares


def build_feature_pool(model, splits, views, augment, seed, strategy, log):
    """(splits of features in place of windows, the number of training views), every rank building
    its share. Without an augmenter every view would be the same, so there is one."""
    views = views if augment is not None else 1
    train, others = splits["train"], [name for name in splits if name != "train"]
    parts = [(train, augment if view else None, seed * VIEW_SEED_STRIDE + view) for view in range(views)]
    parts += [(splits[name], None, seed) for name in others]
    shares = pool_shares([len(split) for split, _, _ in parts], strategy.world_size)
    start = time.perf_counter()
    mine = _transform_share(model, parts, shares[strategy.rank], strategy.device, log)
    seconds = time.perf_counter() - start
    # Every rank's features in rank order are the pool in order; gathered as bytes, whatever their type.
    gathered = strategy.gather_concat(torch.from_numpy(mine).reshape(-1).view(torch.uint8).to(strategy.device))
    features = gathered.cpu().view(torch.from_numpy(mine).dtype).reshape(-1, mine.shape[1]).numpy()
    ends = np.cumsum([len(split) for split, _, _ in parts])
    train_part, *other_parts = np.split(features, ends[views - 1:-1])
    pool = {"train": Split(train_part, np.tile(train.labels, views), np.tile(train.subjects, views))}
    for name, part in zip(others, other_parts, strict=True):
        pool[name] = Split(part, splits[name].labels, splits[name].subjects)
    _report_pool(pool, views, len(train), strategy.gather_objects((len(mine), seconds)),
                 time.perf_counter() - start, log)
    return pool, views


def _transform_share(model, parts, pieces, device, log):
    """This rank's pieces' features [n, F], in order."""
    bar = log.progress(sum(stop - first for _, first, stop in pieces), "transforming windows once")
    window = parts[0][0].signals[:0]
    chunks = [model.pool_features(torch.from_numpy(np.asarray(window)).to(device)).cpu().numpy()]  # [0, F]: the type
    for index, (split, augment, seed) in enumerate(parts):
        ranges = [(first, stop) for part, first, stop in pieces if part == index]
        if ranges:
            chunks.extend(_features(model, split, device, bar, augment, seed, ranges))
    bar.close()
    return np.concatenate(chunks)


@torch.no_grad()
def _features(model, split, device, bar, augment, seed, ranges):
    """The model's features [n, F] of `split`'s windows in `ranges` ((first, stop), in order, none
    across a chunk), through `augment` when given. With an augmenter every chunk up to the last range
    is augmented, so each draws the random numbers it draws in one process."""
    chunks = []
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        for start in range(0, ranges[-1][1], POOL_CHUNK):
            inside = [(first - start, stop - start) for first, stop in ranges if start <= first < start + POOL_CHUNK]
            if not inside and augment is None:
                continue
            windows = torch.from_numpy(np.asarray(split.signals[start:start + POOL_CHUNK])).to(device)
            if augment is not None:
                labels = torch.from_numpy(split.labels[start:start + POOL_CHUNK]).to(device)
                windows = augment(windows, labels)
            for first, stop in inside:
                chunks.append(model.pool_features(windows[first:stop]).cpu().numpy())
                bar.update(stop - first)
    return chunks


def _report_pool(pool, views, train_windows, per_rank, seconds, log):
    """The build's closing line (rank 0's): windows and views transformed, windows/s on each rank and
    in all, and the bytes the pool holds where it lives."""
    windows = sum(count for count, _ in per_rank)
    features = pool["train"].signals
    ranks = " and ".join(f"{count:,} at {count / max(busy, 1e-9):,.0f}/s" for count, busy in per_rank)
    by = f" by {len(per_rank)} ranks ({ranks})" if len(per_rank) > 1 else ""
    holder = "each rank's" if len(per_rank) > 1 else "host"
    size_mib = sum(split.signals.nbytes for split in pool.values()) / 2**20
    log.info(f"features: {views} view(s) of {train_windows:,} training windows + {windows - views * train_windows:,} "
             f"other windows = {windows:,} transformed once{by}, {windows / seconds:,.0f} windows/s in all; "
             f"{size_mib:,.0f} MiB in {holder} memory ({features.shape[1] * features.itemsize:,} B a window, "
             f"{features.dtype}) (--feature-views 0 transforms every batch instead)")
