"""The window store: a folder of shards that training reads from disk instead of holding in memory.

Layout of a store folder:
  manifest.json                what the store holds (below); written last and atomically, so a
                               build that was cut short never looks complete
  labels.npy                   int8 [N]: every window's 0-based class, in store order (shard by
                               shard), written just before the manifest
  shards/<name>.signals.npy    float16 or float32 [n, C, T] windows in raw units (a plain .npy)
  shards/<name>.labels.npy     int8 [n]: the shard's labels, which labels.npy gathers

The manifest names the channels, sample rate, window length and stride, preprocessing, class
names, the label rule, every shard with its window count and its one subject, the test subjects,
the windows of each subject, and the per-channel mean and std of the training subjects' windows
(gathered while the store was built). Each shard holds windows of one subject only, so a
subject-wise split is a choice of shards, made from the manifest without reading a signal.
Opening a store reads the manifest and labels.npy and checks each signal file's size; signals are
read with positioned reads (os.pread), never memory-mapped, so what a process keeps resident is
the batches it is working on, not the pages of the files it went through.
"""
import functools
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data.errors import DataError

FORMAT = "har-window-store"
VERSION = 1
MANIFEST = "manifest.json"
LABELS = "labels.npy"
SHARD_DIR = "shards"
PARTS = ("signals", "labels")
SPAN_BYTES = 2 ** 20  # windows of one shard this close together are fetched in one read


def shard_paths(root, name):
    return {part: Path(root) / SHARD_DIR / f"{name}.{part}.npy" for part in PARTS}


def finish_store(root, manifest):
    """Make a built store usable: gather the shards' labels into labels.npy, then write manifest.json
    whole or not at all (a temporary file, then one rename)."""
    labels = [np.load(shard_paths(root, shard["name"])["labels"]) for shard in manifest["shards"]]
    write_atomic(Path(root) / LABELS, lambda handle: np.save(handle, np.concatenate(labels).astype(np.int8)))
    payload = json.dumps({"format": FORMAT, "version": VERSION, **manifest}, indent=1)
    write_atomic(Path(root) / MANIFEST, lambda handle: handle.write(payload.encode()))


def write_atomic(path, write):
    """write(handle) fills a temporary file that then replaces `path` in one rename: a reader sees
    the old file or the whole new one, never a part (training's checkpoint/atomic.py does the same
    for training's files; data/ does not import training/)."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(partial, "wb") as handle:
            write(handle)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


@dataclass
class Shard:
    first: int  # global index of its first window in the store
    signals_path: Path
    data_offset: int  # bytes before the first window in the .npy file


class WindowStore:
    """An opened, checked store: every window's label and subject in memory (five bytes each), the
    signals on disk."""

    def __init__(self, root):
        self.root = Path(root)
        self.manifest = _read_manifest(self.root)
        manifest = self.manifest
        self.channels = tuple(manifest["channels"])
        self.window_steps = int(manifest["window_steps"])
        self.dtype = np.dtype(manifest["dtype"])
        self.window_bytes = len(self.channels) * self.window_steps * self.dtype.itemsize
        counts = np.array([entry["windows"] for entry in manifest["shards"]], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        self.shards = [self._check_shard(entry, int(first)) for entry, first in zip(manifest["shards"], self.starts,
                                                                                     strict=True)]
        self.subjects = np.repeat(np.array([entry["subject"] for entry in manifest["shards"]], dtype=np.int32), counts)
        self.labels = self._read_labels(int(counts.sum()))

    def _check_shard(self, entry, first):
        """A shard's signal file against the manifest: present, and exactly the size its windows take."""
        path = shard_paths(self.root, entry["name"])["signals"]
        shape = (entry["windows"], len(self.channels), self.window_steps)
        offset = _npy_data_offset(shape, self.dtype.str)
        try:
            size = path.stat().st_size
        except OSError:
            raise DataError(f"store {self.root}: shard file {path} is missing; rebuild the store (python -m "
                            "data.build_store ... --out DIR continues an interrupted build)") from None
        if size != offset + int(np.prod(shape)) * self.dtype.itemsize:
            held_shape, held_dtype, _ = _npy_header(path)
            if (held_shape, held_dtype) == (shape, self.dtype):
                raise DataError(f"store {self.root}: {path} is truncated ({size:,} of "
                                f"{offset + int(np.prod(shape)) * self.dtype.itemsize:,} bytes); rebuild the store")
            raise DataError(f"store {self.root}: {path} holds {held_dtype} {list(held_shape)} but the manifest says "
                            f"{self.dtype} {list(shape)}; the manifest and its shards disagree: rebuild the store")
        return Shard(first, path, offset)

    def _read_labels(self, windows):
        path = self.root / LABELS
        try:
            labels = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise DataError(f"store {self.root}: {path} is not readable ({type(exc).__name__}); rebuild the store "
                            "(python -m data.build_store ... --out DIR finishes it)") from None
        if labels.shape != (windows,) or labels.dtype != np.int8:
            raise DataError(f"store {self.root}: {path} holds {labels.dtype} {list(labels.shape)} but the manifest's "
                            f"shards hold {windows:,} windows; the manifest and its files disagree: rebuild the store")
        return labels

    def __len__(self):
        return len(self.labels)

    def read(self, indices):
        """Windows at these global indices, in this order: float32 [len(indices), C, T]. Windows of
        one shard that lie close together (a shuffled block of a batch) are fetched in one read."""
        indices = np.asarray(indices, dtype=np.int64)
        out = np.empty((len(indices), len(self.channels), self.window_steps), dtype=np.float32)
        shard_of = np.searchsorted(self.starts, indices, side="right") - 1
        for shard_index in np.unique(shard_of):
            picked = np.flatnonzero(shard_of == shard_index)
            shard = self.shards[shard_index]
            local = indices[picked] - shard.first
            low, high = int(local.min()), int(local.max()) + 1
            with open(shard.signals_path, "rb") as handle:  # opened per read: safe in DataLoader workers
                if (high - low) * self.window_bytes <= max(SPAN_BYTES, 4 * len(local) * self.window_bytes):
                    out[picked] = self._pread(handle, shard, low, high - low)[local - low]
                else:
                    for slot, position in zip(picked, local, strict=True):
                        out[slot] = self._pread(handle, shard, int(position), 1)[0]
        return out

    def _pread(self, handle, shard, first, count):
        raw = os.pread(handle.fileno(), count * self.window_bytes, shard.data_offset + first * self.window_bytes)
        return np.frombuffer(raw, dtype=self.dtype).reshape(count, len(self.channels), self.window_steps)


@functools.lru_cache(maxsize=4096)
def _npy_data_offset(shape, dtype_str):
    """Bytes before the data in the .npy file np.save writes for an array of this shape and dtype."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": dtype_str, "fortran_order": False, "shape": shape})
    return header.tell()


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
    """A split whose windows stay in the store; it reads like data.splits.Split (its labels and
    subjects in the store's compact types, widened batch by batch)."""
    signals: StoreSignals
    labels: np.ndarray  # int8 [N]
    subjects: np.ndarray  # int32 [N]

    def __len__(self):
        return len(self.labels)

    def normalized(self, mean, std):
        signals = StoreSignals(self.signals.store, self.signals.indices, np.asarray(mean, np.float32),
                               np.asarray(std, np.float32))
        return StoreSplit(signals, self.labels, self.subjects)


def store_split(store, mask):
    """The windows of `store` where `mask` is true, as a StoreSplit (in store order: shard by shard)."""
    indices = np.flatnonzero(mask)
    return StoreSplit(StoreSignals(store, indices), store.labels[indices], store.subjects[indices])
