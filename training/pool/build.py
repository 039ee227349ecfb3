"""The feature pool of a model whose features do not learn: its views of the training windows and the
other splits transformed once, before the first step, each rank building its share."""
import contextlib
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from data.splits import Split
from data.store import StoreSplit
from training.pool.store import MISSING, FeatureStore, pool_identity

# Fixed features computed once. A model whose features do not learn (MiniRocket: FIXED_FEATURES)
# trains its head on a pool of views of the training windows, transformed before the first step,
# instead of transforming every batch again in every epoch.
#
# View 0 holds the windows as they are; each further view holds them through the recipe's
# augmenter, drawn from a seed of its own, so a resumed run and every rank rebuild the same pool.
# Epoch e trains on view e mod V (data.loaders.ShardedSampler), so with 20 epochs and 4 views each
# augmented view is seen 5 times where per-batch augmentation would have drawn 20 new ones; the
# nested estimate in docs/training.md is what chose that trade. Validation and test windows are
# transformed once too. Under torchrun each rank transforms a share of the pool's windows into its
# rows of the pool and then receives the other ranks' rows: every rank holds the pool, (V x training
# + validation + test windows) x features x the features' bytes, in host memory; a window store's
# run keeps it on disk instead (training.pool.store), where a re-run with the same identity
# finds it.
POOL_CHUNK = 2048  # windows per call of the model's features(): bounds the memory of one call
# A rank's share starts and stops at multiples of this inside a chunk, so the model splits it into
# the batches one process would (MiniRocket: 64 windows on a CPU, 1024 elsewhere) and computes
# every feature from the same operations: the shared-out pool is the one-process pool bit for bit.
POOL_SHARE_UNIT = 1024
VIEW_SEED_STRIDE = 1_000_003  # view v of --seed s is drawn from s x stride + v


def wants_feature_pool(model, views):
    """Whether the run trains on a feature pool: a model with fixed features and --feature-views > 0."""
    return model.FIXED_FEATURES and views > 0


def feature_store_root(save_dir, splits):
    """Where the pool lives on disk: a window store's run (its data beyond memory, and so its pool)
    keeps it in <save-dir>/features; None (in memory) otherwise."""
    return Path(save_dir) / "features" if any(isinstance(split, StoreSplit) for split in splits.values()) else None


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


def build_feature_pool(model, splits, views, augment, seed, strategy, log, store_root=None, figures=None):
    """(splits of features in place of windows, the number of training views), every rank building
    its share. In memory each rank then receives the others' shares into its copy of the pool; with
    `store_root` (a window store's run) each piece is a shard on disk there, and every rank reads them
    all memory-mapped. Without an augmenter every view would be the same, so there is one. A
    `figures` dict given is filled with the build's figures (pool_figures), for a caller that reports
    them."""
    views = views if augment is not None else 1
    train, others = splits["train"], [name for name in splits if name != "train"]
    parts = [(train, augment if view else None, seed * VIEW_SEED_STRIDE + view) for view in range(views)]
    parts += [(splits[name], None, seed) for name in others]
    shares = pool_shares([len(split) for split, _, _ in parts], strategy.world_size)
    probe = model.pool_features(torch.from_numpy(_windows(train.signals, 0, 0)).to(strategy.device)).cpu().numpy()
    start, mine, spent = time.perf_counter(), shares[strategy.rank], AugmentTime()
    if store_root is None:
        # The whole pool is one array from the start: each rank writes its share in place and then
        # receives the others' into theirs, with no list of pieces to join and no gathered copy.
        bounds = np.cumsum([0, *map(_windows_in, shares)]).tolist()
        features, row = np.empty((bounds[-1], *probe.shape[1:]), probe.dtype), bounds[strategy.rank]
        for (_, first, stop), counts in _transformed(model, parts, mine, strategy.device, log, spent):
            features[row:row + stop - first] = counts
            row += stop - first
        per_rank = strategy.gather_objects((_windows_in(mine), time.perf_counter() - start))
        strategy.fill_from_owners(features, bounds)
        by_part = np.split(features, np.cumsum([len(split) for split, _, _ in parts])[views - 1:-1])
        where = None
    else:
        store = FeatureStore(store_root, pool_identity(model, splits, views, augment, seed, probe.dtype, POOL_CHUNK))
        # Every rank reads what the folder holds before any rank records this identity there (the
        # gather is the barrier), and all act on rank 0's reading.
        foreign = strategy.gather_objects(store.foreign())[0]
        why = foreign or store.describe_change()
        store.start()
        mine, damaged = _to_build(store, mine, probe, every_piece=foreign is not None)
        for (part, first, _), counts in _transformed(model, parts, mine, strategy.device, log, spent):
            store.write(part, first, counts)
        # Also the barrier: every rank's shards are written before any rank opens them.
        per_rank = strategy.gather_objects((_windows_in(mine), time.perf_counter() - start, damaged))
        for line in (line for _, _, lines in per_rank for line in lines):
            log.warn(line)
        per_rank = [(count, busy) for count, busy, _ in per_rank]
        pieces = [piece for share in shares for piece in share]
        groups = [range(views), *([views + index] for index in range(len(others)))]  # training views, then the others
        by_part = [store.open([piece for piece in pieces if piece[0] in group], *probe.shape[1:], probe.dtype)
                   for group in groups]
        where = _where(store, why, per_rank, _windows_in(pieces))
        if strategy.is_main:
            store.remove_others(log.warn)
    pool = {"train": Split(by_part[0], np.tile(train.labels, views), np.tile(train.subjects, views))}
    for name, rows in zip(others, by_part[1:], strict=True):
        pool[name] = Split(rows, splits[name].labels, splits[name].subjects)
    seconds = time.perf_counter() - start
    built = pool_figures(pool, views, len(train), per_rank, seconds, spent)
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


class AugmentTime:
    """The views' augmentation time over a build, without a host sync per chunk: on a GPU each chunk's
    augmentation is bracketed by CUDA events, read once when the figures are asked for (the build's
    copies back to the host have waited for them by then); on a CPU, the clock."""

    def __init__(self):
        self.cpu_s, self.events, self.windows = 0.0, [], 0

    @contextlib.contextmanager
    def timing(self, device, windows):
        if device.type == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            yield
            end.record()
            self.events.append((begin, end))
        else:
            started = time.perf_counter()
            yield
            self.cpu_s += time.perf_counter() - started
        self.windows += windows

    def seconds(self):
        if self.events:
            self.events[-1][1].synchronize()
        return self.cpu_s + sum(begin.elapsed_time(end) for begin, end in self.events) / 1e3


def _to_build(store, pieces, probe, every_piece=False):
    """(the pieces whose shards must be built, one line for each shard there that is damaged);
    every_piece: all of them, without a word (the shards there are another pool's)."""
    if every_piece:
        return list(pieces), []
    # Checking a shard reads and hashes its whole file, which releases the interpreter: as many at
    # once as this process has threads (a re-run's set-up is mostly this check).
    with ThreadPoolExecutor(max(1, torch.get_num_threads())) as checkers:
        verdicts = list(checkers.map(lambda piece: store.damage(*piece, probe.shape[1], probe.dtype), pieces))
    damage = dict(zip(pieces, verdicts, strict=True))
    lines = [f"feature pool: rebuilding {store.shard_path(part, first)}: it {why}"
             for (part, first, _), why in damage.items() if why not in (None, MISSING)]
    return [piece for piece, why in damage.items() if why is not None], lines


def _windows_in(pieces):
    return sum(stop - first for _, first, stop in pieces)


def _where(store, why, per_rank, total):
    """(where the pool is, what became of it): built, reused whole, or reused in part."""
    built = sum(count for count, _ in per_rank)
    place = f"on disk in {store.folder}"
    if built == 0:
        return place, ", reused whole (the same identity)"
    if built == total:
        return place, f", built: {why}"
    return place, f", {total - built:,} windows' shards reused, the missing or damaged rebuilt"


def _windows(signals, first, stop):
    """Windows first..stop-1 of a split's signals in memory, or read from a window store's."""
    return np.asarray(signals[first:stop] if isinstance(signals, np.ndarray) else signals[np.arange(first, stop)])


def _transformed(model, parts, pieces, device, log, spent):
    """(piece, its features [n, F]) of each of this rank's pieces, in order; `spent` adds up the
    augmentation's seconds and windows."""
    model.prepare_pool(_windows_in(pieces), log.info)  # the windows this rank transforms now, not those reused
    bar = log.progress(_windows_in(pieces), "transforming windows once")
    for index, (split, augment, seed) in enumerate(parts):
        ranges = [(first, stop) for part, first, stop in pieces if part == index]
        if ranges:
            for (first, stop), counts in _features(model, split, device, bar, augment, seed, ranges, spent):
                yield (index, first, stop), counts
    bar.close()


@torch.no_grad()
def _features(model, split, device, bar, augment, seed, ranges, spent):
    """((first, stop), the model's pool features [n, F]) of `split`'s windows in each of `ranges` (in
    order, none across a chunk), through `augment` when given. With an augmenter every chunk up to the
    last range is augmented, so each draws the random numbers it draws in one process."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        for start in range(0, ranges[-1][1], POOL_CHUNK):
            inside = [(first, stop) for first, stop in ranges if start <= first < start + POOL_CHUNK]
            if not inside and augment is None:
                continue
            stop_chunk = min(start + POOL_CHUNK, len(split))
            windows = torch.from_numpy(_windows(split.signals, start, stop_chunk)).to(device)
            if augment is not None:
                labels = torch.from_numpy(split.labels[start:stop_chunk].astype(np.int64)).to(device)
                with spent.timing(device, stop_chunk - start):
                    windows = augment(windows, labels)
            for first, stop in inside:
                yield (first, stop), model.pool_features(windows[first - start:stop - start]).cpu().numpy()
                bar.update(stop - first)


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
