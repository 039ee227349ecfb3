"""The feature pool of a model whose features do not learn (FIXED_FEATURES): its views of the training
windows, and the other splits, transformed once before the first step, each rank building a share.

The model's training head learns on a pool of views of the training windows instead of transforming
every batch again in every epoch. View 0 holds the windows as they are; each further view holds them
through the recipe's augmenter, drawn from a seed of its own, so a resumed run and every rank rebuild
the same pool. Epoch e trains on view e mod V (data.loaders.ShardedSampler), so with 20 epochs and 4
views each augmented view is seen 5 times where per-batch augmentation would have drawn 20 new ones;
the nested estimate in docs/training.md is what chose that trade. Validation and test windows are
transformed once too. Under torchrun each rank transforms a share of the pool's windows into its rows
of the pool and then receives the other ranks' rows (training.pool.shares): every rank holds the
pool, (V x training + validation + test windows) x features x the features' bytes, in host memory; a
window store's run keeps it on disk instead (training.pool.store), where a re-run with the same
identity finds it. The pool knows the model only by the contract's hooks (models/contract.py):
pool_features, from_counts, prepare_pool and pool_identity_parts."""
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data.splits import Split
from data.store import StoreSplit
from training.pool.shares import pool_shares, share_in_memory, share_on_disk
from training.pool.store import FeatureStore, pool_identity
from training.pool.transform import POOL_CHUNK, Part, RankTransform

VIEW_SEED_STRIDE = 1_000_003  # view v of --seed s is drawn from s x stride + v


def wants_feature_pool(model, views):
    """Whether the run trains on a feature pool: a model (or model class) with fixed features and
    --feature-views > 0."""
    return model.FIXED_FEATURES and views > 0


def feature_store_root(save_dir, splits):
    """Where the pool lives on disk: a window store's run (its data beyond memory, and so its pool)
    keeps it in <save-dir>/features; None (in memory) otherwise."""
    return Path(save_dir) / "features" if any(isinstance(split, StoreSplit) for split in splits.values()) else None


@dataclass(frozen=True, kw_only=True)
class PoolPlan:
    """What a pool holds and where: `views` of the training windows, view 0 as they are and each
    further one through `augment` (None: one view), drawn from `seed`; `store_root`: the folder of a
    pool on disk (feature_store_root), None to hold it in memory. `viewed_too`: other splits (in memory)
    whose windows the pool also holds in the further views, as "<name>_more_views" (views 1 on, laid
    out as the training views are; view 0 is the split's own rows): the validation people's, for the
    head trained again on every person (training.loop.refit)."""
    views: int
    augment: object = None
    seed: int = 0
    store_root: Path | None = None
    viewed_too: tuple = ()


def build_feature_pool(model, splits, plan, strategy, log, figures=None):
    """(splits of pool rows in place of windows, the number of training views), every rank building
    its share, as `plan` (a PoolPlan) says. In memory each rank then receives the others' shares into
    its copy of the pool; on disk each piece is a shard there, and every rank reads them all. Without
    an augmenter every view would be the same, so there is one. A `figures` dict given is filled with
    the build's figures (pool_figures), for a caller that reports them."""
    views = plan.views if plan.augment is not None else 1
    train, others = splits["train"], [name for name in splits if name != "train"]
    parts = [Part(train, plan.augment if view else None, plan.seed * VIEW_SEED_STRIDE + view) for view in range(views)]
    parts += [Part(splits[name], None, plan.seed) for name in others]
    groups = [range(views), *([views + index] for index in range(len(others)))]  # training views, then the others
    # A split viewed too: its view 0 is its plain part above; views 1.. are drawn from seeds after the
    # training views' own, so that no window of it shares a draw with a training window's view.
    extra_seed = plan.seed * VIEW_SEED_STRIDE + views
    for name in plan.viewed_too if views > 1 else ():
        first = len(parts)
        parts += [Part(splits[name], plan.augment, extra_seed + view) for view in range(1, views)]
        extra_seed += views
        groups.append(range(first, len(parts)))
    shares = pool_shares([len(part.split) for part in parts], strategy.world_size)
    transform = RankTransform(model, parts, strategy.device, log)
    probe = transform.probe()
    start = time.perf_counter()
    if plan.store_root is None:
        rows, per_rank = share_in_memory(transform, shares, probe, strategy, groups)
        where = None  # _report_pool names the memory
    else:
        store = FeatureStore(plan.store_root,
                             pool_identity(model, splits, views, plan.augment, plan.seed, probe.dtype, POOL_CHUNK))
        rows, per_rank, where = share_on_disk(transform, shares, probe, strategy, store, groups)
    pool = {"train": Split(rows[0], np.tile(train.labels, views), np.tile(train.subjects, views))}
    for name, held in zip(others, rows[1:1 + len(others)], strict=True):
        pool[name] = Split(held, splits[name].labels, splits[name].subjects)
    for name, held in zip(plan.viewed_too if views > 1 else (), rows[1 + len(others):], strict=True):
        split = splits[name]
        pool[f"{name}_more_views"] = Split(held, np.tile(split.labels, views - 1), np.tile(split.subjects, views - 1))
    built = pool_figures(pool, views, len(train), per_rank, time.perf_counter() - start, transform.spent)
    _report_pool(built, pool["train"].signals, log, where)
    if figures is not None:
        figures.update(built)
    return pool, views


def pool_figures(pool, views, train_windows, per_rank, seconds, spent):
    """What the build cost and holds: windows (in the pool, transformed now), bytes, seconds (the
    whole build, the gather or the shards' opening included), windows/s in all, each rank's
    (windows, busy seconds), and this rank's augmentation of the views: seconds and windows."""
    windows = sum(len(split.signals) for split in pool.values())
    transformed = sum(count for count, _ in per_rank)
    pool_bytes = sum(split.signals.nbytes for split in pool.values())
    return {"views": views, "train_windows": train_windows, "windows": windows, "transformed": transformed,
            "bytes": pool_bytes, "bytes_per_window": pool_bytes // max(windows, 1), "seconds": seconds,
            "windows_per_s": transformed / seconds if seconds > 0 else 0.0,
            "per_rank": [{"windows": count, "seconds": busy} for count, busy in per_rank],
            "augment_s": spent.seconds(), "augmented_windows": spent.windows}


def _report_pool(built, features, log, where=None):
    """The build's closing line (rank 0's), from its pool_figures: windows and views in the pool and
    transformed now, windows/s on each rank and in all, and the bytes the pool holds where it lives;
    `features`: the training split's, whose rows give the bytes a window."""
    windows, transformed, per_rank = built["windows"], built["transformed"], built["per_rank"]
    ranks = " and ".join(f"{rank['windows']:,} at {rank['windows'] / max(rank['seconds'], 1e-9):,.0f}/s"
                         for rank in per_rank)
    by = f" by {len(per_rank)} ranks ({ranks})" if len(per_rank) > 1 else ""
    done = " transformed once" if transformed == windows else f", {transformed:,} of them transformed now"
    done = f"{done}{by}, {built['windows_per_s']:,.0f} windows/s in all" if transformed else ", none transformed now"
    held = where or ("in each rank's memory" if len(per_rank) > 1 else "in host memory", "")
    other = windows - built["views"] * built["train_windows"]
    log.info(f"features: {built['views']} view(s) of {built['train_windows']:,} training windows + {other:,} "
             f"other windows = {windows:,}{done}; "
             f"{built['bytes'] / 2**20:,.0f} MiB {held[0]} ({features.shape[1] * features.dtype.itemsize:,} B a "
             f"window, {features.dtype}){held[1]} "
             "(--feature-views 0 transforms every batch instead)")
