"""Bring your own windows: read and validate an .npz of pre-cut windows (--dataset npz).

Arrays: signals float [N, C, T] (windows shorter than T padded at their end with NaN, on every
channel: the default model reads each over its own steps), labels [N] (integers or unicode names;
data/labels.py), subjects int [N]; optional class_names [K] and channel_names [C] (unicode
strings), sample_rate_hz (a number), split [N] ('train' / 'val' / 'test') and preprocessing ('raw': the
signals as recorded, resampled only, any channel names; 'uci-har'; 'unknown'; default: what the
channel names imply). Loaded with allow_pickle=False: nothing in the file can run code.
"""
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data.declared import MIN_WINDOW_STEPS, checked_names, rate_problem
from data.errors import DataError, not_a_file
from data.labels import class_indexes
from data.layout import PREPROCESSINGS
from data.preprocess import preprocessing_of

REQUIRED = ("signals", "labels", "subjects")
OPTIONAL = ("class_names", "channel_names", "sample_rate_hz", "split", "preprocessing")
SPLIT_NAMES = ("train", "val", "test")  # 'val': validation windows chosen by the file


@dataclass
class NpzWindows:
    signals: np.ndarray  # float32 [N, C, T]
    labels: np.ndarray  # int64 [N]
    subjects: np.ndarray  # int64 [N]
    class_names: tuple
    channel_names: tuple
    sample_rate_hz: float  # NaN when the file does not say
    split: np.ndarray  # str [N] of 'train' / 'test', or None: the caller holds out subjects
    preprocessing: str  # data/preprocess.py's PREPROCESSINGS: as the file says, else as its channel names imply
    unlabelled_windows: int = 0  # windows left out: their label is a value the description says means no class
    own_lengths: tuple = None  # (shortest, longest) steps of windows padded at their end with NaN; None: no padding


def load_npz_windows(path, description=None, warn=None):
    """Read `path` and check every array; each problem is one DataError line naming the file. With a
    data.layout.Layout, labels are its classes' values, and what the file says of its
    channels, rate and window length must agree with it (what it leaves unsaid, the description says).
    `warn` gets one line where the windows look padded with zeros (zero_padding_warning); None: a
    `warning:` line on stderr, as a command that reads the file without a run's log says it."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"--data-dir {path} {not_a_file(path)}; --dataset npz needs an .npz file of windows")
    if not zipfile.is_zipfile(path):  # np.load would take any other file for a pickle and say so
        raise DataError(f"{path} is not an .npz archive; write the windows with np.savez (see docs/using_a_model.md)")
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except ValueError as exc:
        if "allow_pickle" in str(exc):
            raise DataError(_objects_refusal(path)) from None
        raise DataError(f"{path} is not a readable .npz file ({exc})") from None
    except (OSError, EOFError, zipfile.BadZipFile) as exc:
        raise DataError(f"{path} is not a readable .npz file ({type(exc).__name__})") from None
    windows = _validate(path, arrays, description)
    # Windows padded with NaN are read over their own steps: zeros before their NaN are not judged.
    doubt = None if windows.own_lengths else zero_padding_warning(path, windows.signals)
    if doubt:
        (warn or _warn_on_stderr)(doubt)
    return windows


# Zeros read as padding: a run at a window's end of at least this many steps, on every channel at once...
MIN_ZERO_RUN = 2
# ...at the end of at least this share of the windows (and of 2 or more), the runs of 2 or more lengths.
MIN_ZERO_PADDED_SHARE = 0.1


def zero_padding_warning(path, signals):
    """One line where windows [N, C, T] look padded at their end with zeros rather than NaN (which the
    models would read as signal), else None. A signal at rest is almost never exactly 0.0 on every
    channel at once; a few windows that are (a sensor's dropout) stay below the share. Runs of one length
    on every such window (a fixed quiet tail, as of a recorder whose frames end zeroed) are not padding
    of unequal lengths, nor is a window of zeros only: neither is warned of."""
    count, _, steps = signals.shape
    if np.count_nonzero(~signals[:, :, -1].any(axis=1)) < max(2, MIN_ZERO_PADDED_SHARE * count):
        return None  # most files end here, having looked at their last step only
    runs = _zero_runs_at_end(signals)
    runs = runs[(runs >= MIN_ZERO_RUN) & (runs < steps)]
    if len(runs) < max(2, MIN_ZERO_PADDED_SHARE * count) or len(np.unique(runs)) < 2:
        return None
    return (f"{path}: {len(runs):,} of {count:,} windows end in a run of exact zeros on every channel, of "
            f"{runs.min()} to {runs.max()} steps: that looks like windows of unequal lengths padded with zeros, "
            "which the models read as signal; pad each at its end with NaN instead (np.pad(window, ((0, 0), "
            "(0, T - steps)), constant_values=np.nan)), which the default model reads as padding, or leave the "
            "zeros if they were recorded")


def _zero_runs_at_end(signals):
    """[N] steps of exact zeros on every channel at each window's end (T for a window of zeros only). One
    channel at a time: a [N, T] mask beside the signals, never a copy of them."""
    count, channels, steps = signals.shape
    valued = np.zeros((count, steps), dtype=bool)
    for channel in range(channels):
        valued |= signals[:, channel, :] != 0
    return np.where(valued.any(axis=1), np.argmax(valued[:, ::-1], axis=1), steps)


def _objects_refusal(path):
    """Why the file holds Python objects, from the arrays' headers alone (nothing unpickled): windows
    of unequal lengths (np.savez of a list of them) or strings not stored as unicode."""
    held = []
    with zipfile.ZipFile(path) as archive:
        for member in archive.namelist():
            with archive.open(member) as handle:
                read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                               (2, 0): np.lib.format.read_array_header_2_0}.get(np.lib.format.read_magic(handle))
                if read_header is not None and read_header(handle)[2].hasobject:
                    held.append(member.removesuffix(".npy"))
    if "signals" in held:
        return (f"{path}: signals holds Python objects, which np.savez makes of windows of unequal lengths; pad "
                f"each at its end with NaN to the longest T, at least {MIN_WINDOW_STEPS} steps (np.pad(window, "
                "((0, 0), (0, T - steps)), constant_values=np.nan)), and save them as one float array [N, C, T]: "
                "the default model reads each over its own steps")
    return (f"{path} holds Python objects (pickled arrays{': ' + ', '.join(held) if held else ''}), which are not "
            "loaded; store strings as unicode arrays, e.g. np.array(names, dtype=str)")


def _validate(path, arrays, description=None):
    missing = [name for name in REQUIRED if name not in arrays]
    unknown = sorted(set(arrays) - set(REQUIRED) - set(OPTIONAL))
    if missing or unknown:
        problem = f"lacks {', '.join(missing)}" if missing else f"has unknown arrays {', '.join(unknown)}"
        raise DataError(f"{path} {problem}; expected {', '.join(REQUIRED)} and optionally {', '.join(OPTIONAL)}")
    signals = arrays["signals"]
    if signals.dtype.kind not in "fiu" or signals.ndim != 3 or min(signals.shape) == 0:
        raise DataError(f"{path}: signals must be a non-empty float array [N, C, T], got {signals.dtype} "
                        f"{list(signals.shape)}")
    count, channels, steps = signals.shape
    if steps < MIN_WINDOW_STEPS:
        raise DataError(f"{path}: windows of {steps} steps are too short for the models; at least "
                        f"{MIN_WINDOW_STEPS}")
    # The models see float32: finite is judged after that cast, where a float64 value beyond float32's
    # range (about 3.4e38) has become infinity.
    with np.errstate(over="ignore"):
        as_float32 = signals.astype(np.float32)
    lengths = None if np.all(np.isfinite(as_float32)) else _padded_lengths(path, signals, as_float32)
    subjects = _integers(path, arrays, "subjects", count)
    channel_names = _names(path, arrays, "channel_names", channels, "channel")
    if description is not None:
        return _described(path, arrays, as_float32, subjects, channel_names, description, lengths)
    labels, class_names = _labels(path, arrays, count)
    if len(class_names) < 2:
        raise DataError(f"{path}: labels hold a single class; classification needs at least two")
    return NpzWindows(as_float32, labels, subjects, class_names,
                      channel_names or tuple(f"channel_{i}" for i in range(channels)),
                      _sample_rate(path, arrays), _split(path, arrays, count),
                      _preprocessing(path, arrays, channel_names or ()), own_lengths=lengths)


def _padded_lengths(path, signals, as_float32):
    """(shortest, longest) own steps of windows padded at their end with NaN; anything else that is
    not a finite float32 (infinity, NaN inside a window or on some channels only) is refused."""
    def at(where, problem):
        window, channel, step = (int(i) for i in np.argwhere(where)[0])
        return DataError(f"{path}: signals at window {window}, channel {channel}, step {step} hold "
                         f"{signals[window, channel, step]:g}, {problem}")
    if np.isinf(as_float32).any():
        raise at(np.isinf(as_float32), "infinity as float32, the models' type (beyond about 3.4e38)")
    missing = np.isnan(as_float32)
    step_missing = missing.any(axis=1)  # [N, T]
    if not np.array_equal(missing, np.broadcast_to(step_missing[:, None, :], missing.shape)):
        raise at(missing & ~missing.all(axis=1)[:, None, :], "NaN on some channels of a step but not all: NaN "
                 "marks padding after a window's end, on every channel; fill gaps (e.g. interpolate) or cut the window")
    inside = step_missing[:, :-1] & ~step_missing[:, 1:]  # NaN followed by a value
    if inside.any():
        raise at(np.pad(inside, ((0, 0), (0, 1)))[:, None, :] & missing, "NaN before a value: it marks padding "
                 "after a window's end only; fill gaps inside a window (e.g. interpolate) or cut it there")
    # The model that reads padding (MiniRocket) has outputs over a window of any length: its first
    # dilation pads each window by its reach.
    lengths = signals.shape[2] - step_missing.sum(axis=1)
    if lengths.min() == 0:
        raise DataError(f"{path}: window {int(np.argmin(lengths))} holds NaN only; every window needs at least one "
                        "step of values: leave it out")
    return int(lengths.min()), int(lengths.max())


def _described(path, arrays, signals, subjects, channel_names, description, lengths=None):
    """The windows as the description says them: its classes' label values, its channels and rate;
    windows whose label means no class left out (and counted)."""
    count, channels, steps = signals.shape
    description.check("channels", channel_names, path)
    if channels != len(description.channels):
        raise DataError(f"{path}: signals hold {channels} channels but {description.where} names "
                        f"{len(description.channels)} ({', '.join(description.channels)}): correct the field "
                        "'channels' or use the data it describes")
    rate = _sample_rate(path, arrays)
    description.check("sample_rate_hz", rate, path)
    description.check("window_steps", steps, path)
    description.check("classes", _names(path, arrays, "class_names", None, "class"), path)
    values = arrays["labels"]
    if not (values.dtype.kind in "iuU" and values.shape == (count,)):
        raise DataError(f"{path}: labels must be integers or unicode names of shape [{count}], got {values.dtype} "
                        f"{list(values.shape)}")
    labels = class_indexes(values, description.class_labels, description.unlabelled, where=str(path),
                           fix=f"add it to the classes or to 'unlabelled' in {description.where}")
    kept = labels >= 0
    split = _split(path, arrays, count)
    left = set(split[kept].tolist()) if split is not None else {"train", "test"}
    if not kept.any() or not {"train", "test"} <= left:
        side = f"every {({'train', 'test'} - left).pop()} window's" if kept.any() else "every window's"
        raise DataError(f"{path}: {side} label means no class ({description.where}'s 'unlabelled'); label some of "
                        "them with a class")
    preprocessing = _preprocessing(path, arrays, description.channels)
    return NpzWindows(signals[kept], labels[kept], subjects[kept], description.class_names, description.channels,
                      description.sample_rate_hz, split[kept] if split is not None else None,
                      "raw" if preprocessing == "unknown" else preprocessing, int(count - kept.sum()), lengths)


def _labels(path, arrays, count):
    """(0-based class per window, class names) by data/labels.py's rule. Names (unicode labels) are
    classes by name; integers are indexes into class_names when the file names its classes, else
    each distinct value is a class of its own (labels 1 and 2 make two classes, not three)."""
    names = _names(path, arrays, "class_names", None, "class")
    values = arrays["labels"]
    if values.dtype.kind == "U" and values.shape == (count,):
        # Names without class_names are the classes: held to the rule of class names.
        class_labels = names or checked_names(sorted(set(values.tolist())), "class", f"{path}: labels (class names)")
        names = class_labels
    else:
        values = _integers(path, arrays, "labels", count)
        class_labels = range(len(names)) if names else np.unique(values).tolist()
        names = names or tuple(f"class_{value}" for value in class_labels)
    return class_indexes(values, class_labels, where=str(path), fix="with class_names, labels are 0-based "
                         "indexes into them or the names themselves"), tuple(names)


def _integers(path, arrays, name, count):
    values = arrays[name]
    if values.dtype.kind not in "iu" or values.shape != (count,):
        raise DataError(f"{path}: {name} must be integers of shape [{count}] (one per window), got "
                        f"{values.dtype} {list(values.shape)}")
    return values.astype(np.int64)


def _names(path, arrays, name, count, kind):
    """The file's channel or class names (`kind`) by data/declared.py's rule, or None when it gives none."""
    if name not in arrays:
        return None
    values = arrays[name]
    if values.dtype.kind != "U" or values.ndim != 1 or (count is not None and len(values) != count):
        size = f"[{count}]" if count is not None else "[K]"
        raise DataError(f"{path}: {name} must be unicode strings of shape {size}, got {values.dtype} "
                        f"{list(values.shape)}")
    return checked_names(values.tolist(), kind, f"{path}: {name}")


def _sample_rate(path, arrays):
    if "sample_rate_hz" not in arrays:
        return float("nan")
    value = arrays["sample_rate_hz"]
    if value.shape != () or value.dtype.kind not in "fiu":
        raise DataError(f"{path}: sample_rate_hz must be one positive number, got {value!r}")
    problem = rate_problem(float(value))
    if problem:
        raise DataError(f"{path}: sample_rate_hz must be {problem}, got {float(value):g}")
    return float(value)


def _preprocessing(path, arrays, channel_names):
    """'raw' may be said of any channels (windows of the signals as recorded, resampled only);
    'uci-har' only of the channels that chain makes."""
    implied = preprocessing_of(channel_names) if channel_names else "unknown"
    if "preprocessing" not in arrays:
        return implied
    said = arrays["preprocessing"]
    if said.shape != () or said.dtype.kind != "U" or str(said) not in PREPROCESSINGS:
        raise DataError(f"{path}: preprocessing must be one of {', '.join(PREPROCESSINGS)} (a unicode string), "
                        f"got {said!r}")
    if str(said) == "uci-har" and implied != "uci-har":
        raise DataError(f"{path}: preprocessing 'uci-har' needs channel_names among UCI HAR's "
                        "(body_acc_x, ..., total_acc_z); say 'raw' for signals as recorded")
    return str(said)


def _split(path, arrays, count):
    if "split" not in arrays:
        return None
    split = arrays["split"]
    if split.dtype.kind != "U" or split.shape != (count,):
        raise DataError(f"{path}: split must be unicode strings of shape [{count}], got {split.dtype} "
                        f"{list(split.shape)}")
    odd = sorted(set(split.tolist()) - set(SPLIT_NAMES))
    if odd:
        raise DataError(f"{path}: split holds {odd[0]!r}; use 'train', 'val' or 'test'")
    if not np.any(split == "test") or not np.any(split == "train"):
        raise DataError(f"{path}: split needs both 'train' and 'test' windows")
    return split


def _warn_on_stderr(line):
    print(f"warning: {line}", file=sys.stderr)
