"""Read the raw inertial signals of the UCI HAR Dataset, validate them, and cache them as .npz."""
import hashlib
import os
import zipfile
from pathlib import Path

import numpy as np

from data.errors import DataError
from outputs.safety import write_atomic

# Channel order used everywhere in the project: three sensors, each with x, y, z.
SIGNAL_NAMES = (
    "body_acc_x", "body_acc_y", "body_acc_z",
    "body_gyro_x", "body_gyro_y", "body_gyro_z",
    "total_acc_x", "total_acc_y", "total_acc_z",
)
CLASS_NAMES = ("WALKING", "WALKING_UPSTAIRS", "WALKING_DOWNSTAIRS", "SITTING", "STANDING", "LAYING")
WINDOW_STEPS = 128
SAMPLE_RATE_HZ = 50
DATASET_FOLDER = "UCI HAR Dataset"
CACHE_VERSION = "1"


def find_root(data_dir):
    """The folder holding train/ and test/: `data_dir` itself or its `UCI HAR Dataset` child."""
    if data_dir is None:
        return None
    for candidate in (Path(data_dir), Path(data_dir) / DATASET_FOLDER):
        if (candidate / "train" / "Inertial Signals").is_dir() and (candidate / "test").is_dir():
            return candidate
    return None


def source_files(root, split):
    """The only files a split needs: nine signal files, the labels and the subjects."""
    split_dir = root / split
    signals = [split_dir / "Inertial Signals" / f"{name}_{split}.txt" for name in SIGNAL_NAMES]
    return signals, split_dir / f"y_{split}.txt", split_dir / f"subject_{split}.txt"


def load_split(root, split):
    """Return (signals float32 [N, 9, 128], labels int64 0..5, subjects int64) for train or test."""
    signal_paths, label_path, subject_path = source_files(root, split)
    all_paths = [*signal_paths, label_path, subject_path]
    missing = [p for p in all_paths if not p.is_file()]
    if missing:
        raise DataError(f"UCI HAR file missing: {missing[0]} (the dataset under {root} is incomplete; "
                        "re-extract it or use --dataset synthetic)")
    fingerprint = _fingerprint(all_paths)
    cache_path = _cache_path(root, split)
    try:
        with np.load(cache_path, allow_pickle=False) as cache:
            if str(cache["fingerprint"]) == fingerprint:
                return cache["signals"], cache["labels"], cache["subjects"]
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        pass  # no cache yet, or a damaged one: rebuilt from the text files
    signals, labels, subjects = arrays = _parse_split(signal_paths, label_path, subject_path)
    try:
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(cache_path, lambda partial: np.savez(partial, fingerprint=np.array(fingerprint), signals=signals,
                                                           labels=labels, subjects=subjects))
    except OSError:
        pass  # caching is an optimisation; a read-only home must not stop training
    return arrays


def _parse_split(signal_paths, label_path, subject_path):
    matrices = [_read_matrix(path, WINDOW_STEPS) for path in signal_paths]
    labels = _read_matrix(label_path, 1).reshape(-1)
    subjects = _read_matrix(subject_path, 1).reshape(-1)
    counts = {path.name: len(m) for path, m in
              [*zip(signal_paths, matrices, strict=True), (label_path, labels), (subject_path, subjects)]}
    if len(set(counts.values())) != 1:
        usual = max(set(counts.values()), key=list(counts.values()).count)
        odd = ", ".join(f"{name} has {n}" for name, n in counts.items() if n != usual)
        raise DataError(f"UCI HAR row counts disagree: {odd}, the other files {usual} "
                        "(a truncated file, or files from different versions of the dataset)")
    signals = np.stack(matrices, axis=1)
    if not np.all(np.isfinite(signals)):
        window, channel, step = (int(i) for i in np.argwhere(~np.isfinite(signals))[0])
        raise DataError(f"{signal_paths[channel]} holds NaN or infinity (first at row {window + 1}, value "
                        f"{step + 1}); fix or re-extract the dataset")
    _check_integers(label_path, "label", labels, low=1, high=len(CLASS_NAMES))
    _check_integers(subject_path, "subject id", subjects, low=1, high=None)
    return signals, labels.astype(np.int64) - 1, subjects.astype(np.int64)


def _check_integers(path, what, values, low, high):
    bad = ~np.isfinite(values) | (values != np.round(values)) | (values < low)
    if high is not None:
        bad |= values > high
    if np.any(bad):
        row = int(np.argmax(bad))
        allowed = f"{low}..{high}" if high is not None else f"whole numbers from {low}"
        raise DataError(f"{path}: line {row + 1}: {what} {values[row]:g} is outside {allowed}")


def _read_matrix(path, columns):
    """Parse whitespace-separated numbers, insisting on `columns` values per non-empty line."""
    try:
        lines = [line for line in path.read_text().splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path} cannot be read ({exc.__class__.__name__}: {exc}); check the file") from None
    if not lines:
        raise DataError(f"{path} is empty; re-extract the dataset")
    try:
        values = np.array(" ".join(lines).split(), dtype=np.float32)
    except ValueError as exc:
        raise DataError(f"{path}: not a number ({exc}); re-extract the dataset") from None
    # Each row is counted: a matching total can hide one long and one short row.
    for number, line in enumerate(lines, start=1):
        found = len(line.split())
        if found != columns:
            raise DataError(f"{path}: line {number} has {found} values, expected {columns}")
    return values.reshape(len(lines), columns)


def _fingerprint(paths):
    """Sizes and modification times: changes when any source file is replaced or edited."""
    digest = hashlib.sha256(CACHE_VERSION.encode())
    for path in paths:
        stat = path.stat()
        digest.update(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns};".encode())
    return digest.hexdigest()


def _cache_path(root, split):
    """Next to the data when writable, else in the user's cache folder keyed by the data path."""
    if os.access(root, os.W_OK):
        return root / ".cache" / f"{split}.npz"
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "har-trainer"
    key = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:16]
    return base / key / f"{split}.npz"

