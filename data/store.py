"""The window store: a folder of shards that training reads from disk instead of holding in memory.

manifest.json (written last, in one rename, so a build cut short never looks complete) describes
labels.npy (int8 [N], every window's class in store order) and shards/<name>.signals.npy (float16 or
float32 [n, C, T] in raw units) with shards/<name>.labels.npy; each shard holds one subject, so a
subject-wise split is a choice of shards; build.json, written before anything else, marks the folder
as a store's while its build runs. docs/training.md lists the manifest's fields and what opening a
store checks. Signals are read with positioned reads (os.pread), never memory-mapped, so
what a process keeps resident is the batches it is working on, not the pages of the files it went through.
"""
import functools
import io
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data.errors import DataError
from data.layout import Layout
from outputs.safety import write_atomic

FORMAT = "har-window-store"
VERSION = 1
MANIFEST = "manifest.json"
LABELS = "labels.npy"
BUILD_RECORD = "build.json"  # the converter's first write: what makes a folder a store's before its manifest
SHARD_DIR = "shards"
PARTS = ("signals", "labels")
SHARD_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")  # a file name in shards/: no separator, no '..' escape
SPAN_BYTES = 2 ** 20  # windows of one shard this close together are fetched in one read


def shard_paths(root, name):
    return {part: Path(root) / SHARD_DIR / f"{name}.{part}.npy" for part in PARTS}


def finish_store(root, manifest):
    """Make a built store usable: gather the shards' labels into labels.npy, then write manifest.json
    whole or not at all (a temporary file, then one rename)."""
    labels = [np.load(shard_paths(root, shard["name"])["labels"]) for shard in manifest["shards"]]
    write_atomic(Path(root) / LABELS, lambda partial: np.save(partial, np.concatenate(labels).astype(np.int8)))
    payload = json.dumps({"format": FORMAT, "version": VERSION, **manifest}, indent=1)
    write_atomic(Path(root) / MANIFEST, lambda partial: Path(partial).write_bytes(payload.encode()))


@dataclass
class Shard:
    first: int  # global index of its first window in the store
    signals_path: Path
    data_offset: int  # bytes before the first window in the .npy file
    name: str


class WindowStore:
    """An opened, checked store: every window's label and subject in memory (five bytes each), the
    signals on disk."""

    def __init__(self, root):
        self.root = Path(root)
        self.manifest = manifest = _read_manifest(self.root)
        self.layout = manifest_layout(manifest, self.root)
        self.channels, self.window_steps = self.layout.channels, self.layout.window_steps
        self.dtype = np.dtype(manifest["dtype"])
        self.window_bytes = len(self.channels) * self.window_steps * self.dtype.itemsize
        counts = np.array([entry["windows"] for entry in manifest["shards"]], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        self.shards = [self._check_shard(entry, int(first)) for entry, first in zip(manifest["shards"], self.starts,
                                                                                     strict=True)]
        self.subjects = np.repeat(np.array([entry["subject"] for entry in manifest["shards"]], dtype=np.int32), counts)
        self.labels = self._read_labels(int(counts.sum()))
        self._check_classes()

    def _check_shard(self, entry, first):
        """A shard's signal file against the manifest: present, an .npy of the manifest's dtype and
        shape in C order (its header read), and exactly the size its windows take."""
        path = shard_paths(self.root, entry["name"])["signals"]
        shape = (entry["windows"], len(self.channels), self.window_steps)
        offset = npy_data_offset(shape, self.dtype.str)
        expected = offset + int(np.prod(shape)) * self.dtype.itemsize
        if not path.is_file():
            raise DataError(f"store {self.root}: shard file {path} is missing; rebuild the store (python -m "
                            "data.build_store ... --out DIR continues an interrupted build)")
        held_shape, held_dtype, held_offset, fortran, size = _npy_header(path)
        if (held_shape, held_dtype, fortran) != (shape, self.dtype, False):
            layout = " in Fortran order" if fortran else ""
            raise DataError(f"store {self.root}: {path} holds {held_dtype} {list(held_shape)}{layout} but the manifest "
                            f"says {self.dtype} {list(shape)}; the manifest and its shards disagree: rebuild the store")
        if size != expected or held_offset != offset:
            raise DataError(f"store {self.root}: {path} is truncated ({size:,} of {expected:,} bytes); rebuild the "
                            "store (python -m data.build_store ... --out DIR converts that shard again)")
        return Shard(first, path, offset, entry["name"])

    def _read_labels(self, windows):
        path = self.root / LABELS
        try:
            labels = np.load(path, allow_pickle=False)
        except (OSError, ValueError, EOFError) as exc:
            raise DataError(f"store {self.root}: {path} is not readable ({type(exc).__name__}); rebuild the store "
                            "(python -m data.build_store ... --out DIR finishes it)") from None
        if labels.shape != (windows,) or labels.dtype != np.int8:
            raise DataError(f"store {self.root}: {path} holds {labels.dtype} {list(labels.shape)} but the manifest's "
                            f"shards hold {windows:,} windows; the manifest and its files disagree: rebuild the store")
        classes = len(self.layout.class_names)
        outside = np.flatnonzero((labels < 0) | (labels >= classes))
        if len(outside):
            shard, position = self.locate(int(outside[0]))
            raise DataError(f"store {self.root}: {path} holds {len(outside):,} label(s) outside 0..{classes - 1} (the "
                            f"{classes} class names), the first {int(labels[outside[0]])} for window {position} of "
                            f"shard {shard}; rebuild the store")
        return labels

    def _check_classes(self):
        """A classifier learns nothing from one class: refuse a store whose training subjects hold fewer."""
        training = ~np.isin(self.subjects, self.manifest["test_subjects"])
        found = np.unique(self.labels[training])
        if len(found) < 2:
            names = [self.layout.class_names[int(label)] for label in found]
            raise DataError(f"store {self.root}: its training subjects' windows hold {len(found)} class(es) "
                            f"({', '.join(names) or 'no window'}); a classifier needs at least two: rebuild it from "
                            "data with more classes, or with other --test-subjects")

    def locate(self, index):
        """(shard name, position in it) of the window at a global index: where to look at it."""
        shard = self.shards[int(np.searchsorted(self.starts, index, side="right")) - 1]
        return shard.name, int(index - shard.first)

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
            rows = read_rows(shard.signals_path, shard.data_offset, self.window_bytes, indices[picked] - shard.first,
                             f"store {self.root}: {shard.signals_path} was cut short while training read it; "
                             "rebuild the store")
            out[picked] = rows.view(self.dtype).reshape(len(picked), len(self.channels), self.window_steps)
        if not np.isfinite(out).all():  # a check far cheaper than the step that would turn NaN
            window = int(np.flatnonzero(~np.isfinite(out).all(axis=(1, 2)))[0])
            name, position = self.locate(int(indices[window]))
            raise DataError(f"store {self.root}: window {position} of shard {name} holds values that are not "
                            "finite; its build did not write that (the file changed since): rebuild the store")
        return out


def read_rows(path, data_offset, row_bytes, rows, cut_short):
    """uint8 [len(rows), row_bytes]: the rows at these positions of a file's array of rows starting at
    data_offset, in this order. Rows close together (a shuffled block of a batch) come in one read of
    their span, others in one read each; `cut_short` is the one-line error for a file that ends before
    them. The file is opened per call: safe in DataLoader workers, and nothing stays mapped."""
    rows = np.asarray(rows, dtype=np.int64)
    low, high = int(rows.min()), int(rows.max()) + 1
    with open(path, "rb") as handle:
        def read(first, count):
            raw = os.pread(handle.fileno(), count * row_bytes, data_offset + first * row_bytes)
            if len(raw) != count * row_bytes:
                raise DataError(cut_short)
            return np.frombuffer(raw, dtype=np.uint8).reshape(count, row_bytes)

        if (high - low) * row_bytes <= max(SPAN_BYTES, 4 * len(rows) * row_bytes):
            return read(low, high - low)[rows - low]
        return np.concatenate([read(int(row), 1) for row in rows])


@functools.lru_cache(maxsize=4096)
def npy_data_offset(shape, dtype_str):
    """Bytes before the data in the .npy file np.save writes for an array of this shape and dtype."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": dtype_str, "fortran_order": False, "shape": shape})
    return header.tell()


def _read_manifest(root):
    path = root / MANIFEST
    if not path.is_file():
        building = (root / BUILD_RECORD).is_file()
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
    _check_manifest(root, manifest)
    return manifest


# What a manifest written before its layout section held of the layout, as top-level keys.
FLAT_LAYOUT_KEYS = ("sample_rate_hz", "window_steps", "stride_steps", "preprocessing")


def manifest_layout(manifest, root):
    """The store's Layout (data/layout.py): its manifest's `layout` section, or for a manifest written before
    it, the same built from its top-level channels, class_names, rate, window, stride and preprocessing (and
    the description it was built by); refused in one line naming the field where it is not one."""
    where = f"store {root}: {MANIFEST}'s layout"
    content = manifest.get("layout")
    if content is None:
        described = manifest.get("description") or {}
        channels, names = manifest.get("channels"), manifest.get("class_names")
        content = {**described, **{key: manifest[key] for key in FLAT_LAYOUT_KEYS if manifest.get(key) is not None}}
        if not described:
            content["channels"] = [{"name": name} for name in channels] if isinstance(channels, list) else channels
            content["classes"] = ([{"name": name, "label": index} for index, name in enumerate(names)]
                                  if isinstance(names, list) else names)
    try:
        layout = Layout.from_json(content, where)
    except DataError as exc:
        raise DataError(f"{exc}; the manifest is damaged or was not written by python -m data.build_store: rebuild "
                        "the store") from None
    if layout.window_steps is None:
        raise DataError(f"{where} says no window_steps; the manifest is damaged: rebuild the store")
    return layout


def _check_manifest(root, manifest):
    """Every field the trainer reads, of the type it reads, and consistent with the others: a
    malformed manifest is refused in one line that names the field, never met as a KeyError later."""
    def need(ok, field, what):
        if not ok:
            raise DataError(f"store {root}: {MANIFEST}'s {field} must be {what}; the manifest is damaged or was not "
                            "written by python -m data.build_store: rebuild the store")

    def is_int(value):
        return isinstance(value, int) and not isinstance(value, bool)

    def is_number(value):
        return isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value)

    channels = manifest_layout(manifest, root).channels  # the layout, checked where it is read
    need(manifest.get("dtype") in ("float16", "float32"), "dtype", "float16 or float32")
    shards = manifest.get("shards")
    need(isinstance(shards, list) and shards, "shards", "a list of shards")
    for entry in shards:
        need(isinstance(entry, dict) and is_int(entry.get("windows")) and entry["windows"] >= 0 and
             is_int(entry.get("subject")), "shards", "entries with a window count and a subject")
        need(isinstance(entry.get("name"), str) and SHARD_NAME.fullmatch(entry["name"]) is not None, "shards",
             f"entries named with letters, digits, '.', '_' and '-' only, inside {SHARD_DIR}/ (found "
             f"{str(entry.get('name'))[:40]!r})")
    need(len({entry["name"] for entry in shards}) == len(shards), "shards", "entries with distinct names")
    windows = {}
    for entry in shards:
        windows[str(entry["subject"])] = windows.get(str(entry["subject"]), 0) + entry["windows"]
    if manifest.get("subjects") != windows:
        raise DataError(f"store {root}: {MANIFEST}'s subjects and its shards disagree on the windows of each subject; "
                        "the manifest is damaged: rebuild the store")
    test = manifest.get("test_subjects")
    need(isinstance(test, list) and all(is_int(s) for s in test), "test_subjects", "a list of subjects")
    unknown = sorted(set(map(str, test)) - set(windows))
    if unknown:
        raise DataError(f"store {root}: test subject(s) {', '.join(unknown)} of {MANIFEST} have no shard (its "
                        f"subjects: {', '.join(sorted(windows, key=int)[:10])}...); rebuild the store with "
                        "--test-subjects among its subjects")
    if not sum(windows[str(subject)] for subject in test):
        raise DataError(f"store {root}: its test split is empty (test subjects {test} hold no window); rebuild the "
                        "store with --test-subjects among the subjects with windows")
    statistics = manifest.get("normalization")
    for key in ("mean", "std"):
        values = statistics.get(key) if isinstance(statistics, dict) else None
        need(isinstance(values, list) and len(values) == len(channels) and all(map(is_number, values)) and
             (key == "mean" or min(values) > 0), f"normalization {key}",
             f"{len(channels)} finite numbers" + (", each above 0" if key == "std" else ""))


def _npy_header(path):
    """(shape, dtype, offset of the data, Fortran order, file size) of an .npy file, from its header alone."""
    try:
        with open(path, "rb") as handle:
            version = np.lib.format.read_magic(handle)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read_header(handle)
            return tuple(shape), np.dtype(dtype), handle.tell(), bool(fortran), os.fstat(handle.fileno()).st_size
    except (OSError, ValueError, TypeError) as exc:
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise DataError(f"{path} is not a readable .npy file ({first_line}); rebuild the store") from None


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

    @classmethod
    def of(cls, store, mask):
        """The windows of `store` where `mask` is true (in store order: shard by shard)."""
        indices = np.flatnonzero(mask)
        return cls(StoreSignals(store, indices), store.labels[indices], store.subjects[indices])

    def take(self, mask):
        """The windows of this split where `mask` is true, normalised as this split is."""
        signals = self.signals
        return StoreSplit(StoreSignals(signals.store, signals.indices[mask], signals.mean, signals.std),
                          self.labels[mask], self.subjects[mask])

    def normalized(self, mean, std):
        """The same windows, normalised by the per-channel `mean` and `std` as each batch is read."""
        signals = StoreSignals(self.signals.store, self.signals.indices, np.asarray(mean, np.float32),
                               np.asarray(std, np.float32))
        return StoreSplit(signals, self.labels, self.subjects)
