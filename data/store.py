"""The window store: a folder of shards that training reads from disk instead of holding in memory.

Layout of a store folder:
  manifest.json                what the store holds (below); written last and atomically, so a
                               build that was cut short never looks complete
  shards/<name>.signals.npy    float16 or float32 [n, C, T] windows in raw units (a plain .npy)
  shards/<name>.labels.npy     int8 [n], 0-based class index
  shards/<name>.subjects.npy   int32 [n]

The manifest names the channels, sample rate, window length and stride, preprocessing, class
names, the label rule, every shard with its window count and subjects, the test subjects, the
windows of each subject, and the per-channel mean and std of the training subjects' windows
(gathered while the store was built). Each shard holds windows of one subject only, so a
subject-wise split is a choice of shards, made from the manifest without reading a signal.
Signals are read with positioned reads (os.pread), never memory-mapped, so what a process keeps
resident is the batches it is working on, not the pages of the files it went through.
"""
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data.errors import DataError

FORMAT = "har-window-store"
VERSION = 1
MANIFEST = "manifest.json"
SHARD_DIR = "shards"
PARTS = {"signals": None, "labels": np.int8, "subjects": np.int32}  # signals: the manifest's dtype


def shard_paths(root, name):
    return {part: Path(root) / SHARD_DIR / f"{name}.{part}.npy" for part in PARTS}


def write_manifest(root, manifest):
    """Write manifest.json whole or not at all (a temporary file, then one rename)."""
    path = Path(root) / MANIFEST
    partial = path.with_name(f".{MANIFEST}.{os.getpid()}.tmp")
    partial.write_text(json.dumps({"format": FORMAT, "version": VERSION, **manifest}, indent=1))
    os.replace(partial, path)


@dataclass
class Shard:
    name: str
    windows: int
    subject: int
    first: int  # global index of its first window in the store
    signals_path: Path
    data_offset: int  # bytes before the first window in the .npy file


class WindowStore:
    """An opened, checked store: every window's label and subject in memory (a few bytes each), the
    signals on disk."""

    def __init__(self, root):
        self.root = Path(root)
        self.manifest = _read_manifest(self.root)
        manifest = self.manifest
        self.channels = tuple(manifest["channels"])
        self.window_steps = int(manifest["window_steps"])
        self.dtype = np.dtype(manifest["dtype"])
        self.window_bytes = len(self.channels) * self.window_steps * self.dtype.itemsize
        self.shards, labels, subjects, first = [], [], [], 0
        for entry in manifest["shards"]:
            shard, shard_labels, shard_subjects = self._open_shard(entry, first)
            self.shards.append(shard)
            labels.append(shard_labels)
            subjects.append(shard_subjects)
            first += shard.windows
        self.labels = np.concatenate(labels) if labels else np.zeros(0, np.int8)
        self.subjects = np.concatenate(subjects) if subjects else np.zeros(0, np.int32)
        self.shard_of = np.repeat(np.arange(len(self.shards)), [s.windows for s in self.shards])
        self.starts = np.array([s.first for s in self.shards], dtype=np.int64)

    def _open_shard(self, entry, first):
        """Check one shard's three files against the manifest: present, whole, the right shape."""
        paths = shard_paths(self.root, entry["name"])
        expected = {"signals": ((entry["windows"], len(self.channels), self.window_steps), self.dtype),
                    "labels": ((entry["windows"],), np.dtype(np.int8)),
                    "subjects": ((entry["windows"],), np.dtype(np.int32))}
        offsets, arrays = {}, {}
        for part, path in paths.items():
            if not path.is_file():
                raise DataError(f"store {self.root}: shard file {path} is missing; rebuild the store (python -m "
                                "data.build_store ... --out DIR continues an interrupted build)")
            shape, dtype, offsets[part] = _npy_header(path)
            if (shape, dtype) != (expected[part][0], expected[part][1]):
                raise DataError(f"store {self.root}: {path} holds {dtype} {list(shape)} but the manifest says "
                                f"{expected[part][1]} {list(expected[part][0])}; the manifest and its shards "
                                "disagree: rebuild the store")
            size = offsets[part] + int(np.prod(shape)) * dtype.itemsize
            if path.stat().st_size < size:
                raise DataError(f"store {self.root}: {path} is truncated ({path.stat().st_size:,} of {size:,} "
                                "bytes); rebuild the store")
            if part != "signals":
                arrays[part] = np.fromfile(path, dtype=dtype, count=shape[0], offset=offsets[part])
        if np.any(arrays["subjects"] != entry["subject"]):
            raise DataError(f"store {self.root}: {paths['subjects']} holds other subjects than the manifest's "
                            f"{entry['subject']}; rebuild the store")
        return (Shard(entry["name"], entry["windows"], entry["subject"], first, paths["signals"], offsets["signals"]),
                arrays["labels"], arrays["subjects"])

    def __len__(self):
        return len(self.labels)

    def read(self, indices):
        """Windows at these global indices, in this order: float32 [len(indices), C, T]. Windows of
        one shard that lie close together are fetched in one read (a shuffled block of a batch)."""
        indices = np.asarray(indices, dtype=np.int64)
        out = np.empty((len(indices), len(self.channels), self.window_steps), dtype=np.float32)
        shards = self.shard_of[indices]
        for shard_index in np.unique(shards):
            picked = np.flatnonzero(shards == shard_index)
            shard = self.shards[shard_index]
            local = indices[picked] - shard.first
            low, high = int(local.min()), int(local.max()) + 1
            span = self._pread(shard, low, high - low) if high - low <= 4 * len(local) else None
            for slot, position in zip(picked, local, strict=True):
                out[slot] = span[position - low] if span is not None else self._pread(shard, position, 1)[0]
        return out

    def _pread(self, shard, first, count):
        with open(shard.signals_path, "rb") as handle:  # opened per read: safe in DataLoader workers
            raw = os.pread(handle.fileno(), count * self.window_bytes, shard.data_offset + first * self.window_bytes)
        return np.frombuffer(raw, dtype=self.dtype).reshape(count, len(self.channels), self.window_steps)


def _read_manifest(root):
    path = root / MANIFEST
    if not path.is_file():
        building = (root / SHARD_DIR).is_dir()
        raise DataError(f"store {root} has no {MANIFEST}" + ("; its build did not finish: run python -m "
                        "data.build_store again to complete it" if building else
                        "; point --data-dir at a folder made by python -m data.build_store"))
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DataError(f"store {root}: {path} is not readable JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise DataError(f"store {root}: {path} is not a window store's manifest; make one with python -m "
                        "data.build_store")
    if manifest.get("version") != VERSION:
        raise DataError(f"store {root} is version {manifest.get('version')}, this trainer reads {VERSION}; "
                        "rebuild it with this version's python -m data.build_store")
    return manifest


def _npy_header(path):
    """(shape, dtype, offset of the data) of an .npy file, read from its header alone."""
    try:
        with open(path, "rb") as handle:
            version = np.lib.format.read_magic(handle)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                np.lib.format.read_array_header_2_0
            shape, _, dtype = read_header(handle)
            return tuple(shape), np.dtype(dtype), handle.tell()
    except (OSError, ValueError) as exc:
        raise DataError(f"{path} is not a readable .npy file ({exc}); rebuild the store") from None


class StoreSignals:
    """The signals of some of a store's windows, read on demand and normalised on the way:
    `shape` and `nbytes` describe them, indexing with an array of positions reads them."""

    def __init__(self, store, indices, mean=None, std=None):
        self.store, self.indices, self.mean, self.std = store, indices, mean, std
        self.shape = (len(indices), len(store.channels), store.window_steps)
        self.nbytes = len(indices) * len(store.channels) * store.window_steps * 4  # as float32 in memory

    def __len__(self):
        return len(self.indices)

    def __getitem__(self, positions):
        windows = self.store.read(self.indices[np.asarray(positions, dtype=np.int64)])
        if self.mean is not None:
            windows -= self.mean[None, :, None]
            windows /= self.std[None, :, None]
        return windows


@dataclass
class StoreSplit:
    """A split whose windows stay in the store; it reads like data.splits.Split."""
    signals: StoreSignals
    labels: np.ndarray  # int64 [N]
    subjects: np.ndarray  # int64 [N]

    def __len__(self):
        return len(self.labels)

    def normalized(self, mean, std):
        signals = StoreSignals(self.signals.store, self.signals.indices, np.asarray(mean, np.float32),
                               np.asarray(std, np.float32))
        return StoreSplit(signals, self.labels, self.subjects)


def store_split(store, mask):
    """The windows of `store` where `mask` is true, as a StoreSplit (in store order: shard by shard)."""
    indices = np.flatnonzero(mask)
    return StoreSplit(StoreSignals(store, indices), store.labels[indices].astype(np.int64),
                      store.subjects[indices].astype(np.int64))
