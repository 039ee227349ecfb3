"""One rank's transform of its pieces of the feature pool: each part's windows, through the part's
augmenter where it has one, into the rows the model's pool_features gives, a chunk of windows at a time."""
import contextlib
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from training.pool.shares import windows_in

POOL_CHUNK = 2048  # windows per call of the model's features(): bounds the memory of one call


@dataclass(frozen=True)
class Part:
    """A part of the pool: a split's windows, through `augment` (None: as they are), whose random draws
    start from `seed`."""
    split: object
    augment: object
    seed: int


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


@dataclass
class RankTransform:
    """This rank's transform of pieces (part, first, stop) of the pool's `parts` by `model` (a
    FIXED_FEATURES HARModel) on `device`; `log` shows the progress, `spent` adds up the augmentation's
    seconds and windows."""
    model: torch.nn.Module
    parts: list
    device: torch.device
    log: object
    spent: AugmentTime = field(default_factory=AugmentTime)

    def probe(self):
        """The model's pool rows of no window [0, F]: their width and type."""
        empty = torch.from_numpy(_windows(self.parts[0].split.signals, 0, 0)).to(self.device)
        return self.model.pool_features(empty).cpu().numpy()

    def __call__(self, pieces):
        """(piece, its rows [n, F]) of each of `pieces`, in order."""
        # The windows this rank transforms now, not those reused.
        self.model.prepare_pool(windows_in(pieces), self.log.info)
        bar = self.log.progress(windows_in(pieces), "transforming windows once")
        for index, part in enumerate(self.parts):
            ranges = [(first, stop) for part_index, first, stop in pieces if part_index == index]
            if ranges:
                for (first, stop), counts in self._rows(part, ranges, bar):
                    yield (index, first, stop), counts
        bar.close()

    @torch.no_grad()
    def _rows(self, part, ranges, bar):
        """((first, stop), the model's pool rows [n, F]) of `part`'s windows in each of `ranges` (in
        order, none across a chunk). With an augmenter every chunk up to the last range is augmented, so
        each draws the random numbers it draws in one process."""
        split, augment, device = part.split, part.augment, self.device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(part.seed)
            for start in range(0, ranges[-1][1], POOL_CHUNK):
                inside = [(first, stop) for first, stop in ranges if start <= first < start + POOL_CHUNK]
                if not inside and augment is None:
                    continue
                stop_chunk = min(start + POOL_CHUNK, len(split))
                windows = torch.from_numpy(_windows(split.signals, start, stop_chunk)).to(device)
                if augment is not None:
                    labels = torch.from_numpy(split.labels[start:stop_chunk].astype(np.int64)).to(device)
                    with self.spent.timing(device, stop_chunk - start):
                        windows = augment(windows, labels)
                for first, stop in inside:
                    yield (first, stop), self.model.pool_features(windows[first - start:stop - start]).cpu().numpy()
                    bar.update(stop - first)


def _windows(signals, first, stop):
    """Windows first..stop-1 of a split's signals in memory, or read from a window store's."""
    return np.asarray(signals[first:stop] if isinstance(signals, np.ndarray) else signals[np.arange(first, stop)])
