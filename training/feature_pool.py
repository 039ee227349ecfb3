"""Fixed features computed once. A model whose features do not learn (MiniRocket: FIXED_FEATURES)
trains its head on a pool of views of the training windows, transformed before the first step,
instead of transforming every batch again in every epoch.

View 0 holds the windows as they are; each further view holds them through the recipe's
augmenter, drawn from a seed of its own, so a resumed run and every rank rebuild the same pool.
Epoch e trains on view e mod V (data.loaders.ShardedSampler), so with 20 epochs and 4 views each
augmented view is seen 5 times where per-batch augmentation would have drawn 20 new ones; the
nested estimate in docs/training.md is what chose that trade. Validation and test windows are
transformed once too. The pool is kept in host memory: (V x training + validation + test windows)
x features x 4 bytes.
"""
import time

import numpy as np
import torch

from data.splits import Split
from data.store import StoreSplit

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
