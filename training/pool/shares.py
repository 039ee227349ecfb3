"""The feature pool shared out among ranks: each rank transforms a share of the pool's windows, then
every rank holds the whole pool, in its memory (the other ranks' rows received into its copy) or on disk
(each piece a shard of the store, which every rank reads)."""
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from training.pool.store import MISSING

# A rank's share starts and stops at multiples of this inside a chunk, so the model splits it into
# the batches one process would (MiniRocket: 64 windows on a CPU, 1024 elsewhere) and computes
# every feature from the same operations: the shared-out pool is the one-process pool bit for bit.
POOL_SHARE_UNIT = 1024


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


def windows_in(pieces):
    return sum(stop - first for _, first, stop in pieces)


def share_in_memory(transform, shares, probe, strategy, groups):
    """(the pool's rows of each group of parts in `groups`, each rank's (windows, busy seconds)): this
    rank's share transformed by `transform` (a RankTransform) into its rows of one array of the whole
    pool (`probe`'s width and type), the other ranks' then received into theirs."""
    start, mine = time.perf_counter(), shares[strategy.rank]
    # The whole pool is one array from the start: each rank writes its share in place and then
    # receives the others' into theirs, with no list of pieces to join and no gathered copy.
    bounds = np.cumsum([0, *map(windows_in, shares)]).tolist()
    features, row = np.empty((bounds[-1], *probe.shape[1:]), probe.dtype), bounds[strategy.rank]
    for (_, first, stop), counts in transform(mine):
        features[row:row + stop - first] = counts
        row += stop - first
    per_rank = strategy.gather_objects((windows_in(mine), time.perf_counter() - start))
    strategy.fill_from_owners(features, bounds)
    ends = np.cumsum([len(part.split) for part in transform.parts])
    return np.split(features, [ends[group[-1]] for group in groups[:-1]]), per_rank


def share_on_disk(transform, shares, probe, strategy, store, groups):
    """(the pool's rows of each group of parts in `groups`, read from the shards of `store` (a
    FeatureStore), each rank's (windows, busy seconds), (where the pool is, what became of it)): this
    rank's pieces whose shards are missing or damaged transformed by `transform` and written there."""
    start, mine, log = time.perf_counter(), shares[strategy.rank], transform.log
    # Every rank reads what the folder holds before any rank records this identity there (the
    # gather is the barrier), and all act on rank 0's reading.
    foreign = strategy.gather_objects(store.foreign())[0]
    why = foreign or store.describe_change()
    store.start()
    mine, damaged = _to_build(store, mine, probe, every_piece=foreign is not None)
    for (part, first, _), counts in transform(mine):
        store.write(part, first, counts)
    # Also the barrier: every rank's shards are written before any rank opens them.
    per_rank = strategy.gather_objects((windows_in(mine), time.perf_counter() - start, damaged))
    for line in (line for _, _, lines in per_rank for line in lines):
        log.warn(line)
    per_rank = [(count, busy) for count, busy, _ in per_rank]
    pieces = [piece for share in shares for piece in share]
    rows = [store.open([piece for piece in pieces if piece[0] in group], *probe.shape[1:], probe.dtype)
            for group in groups]
    where = _where(store, why, per_rank, windows_in(pieces))
    if strategy.is_main:
        store.remove_others(log.warn)
    return rows, per_rank, where


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


def _where(store, why, per_rank, total):
    """(where the pool is, what became of it): built, reused whole, or reused in part."""
    built = sum(count for count, _ in per_rank)
    place = f"on disk in {store.folder}"
    if built == 0:
        return place, ", reused whole (the same identity)"
    if built == total:
        return place, f", built: {why}"
    return place, f", {total - built:,} windows' shards reused, the missing or damaged rebuilt"
