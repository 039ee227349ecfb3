"""Read a continuous recording (CSV or .npz) into accelerometer in g and gyroscope in rad/s, or into
the named channels of another device, as they are."""
import csv
import math
import re
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data.errors import DataError, not_a_file
from data.preprocess import ACC_AXES, GYRO_AXES

# A number as numpy's loadtxt reads one: ASCII digits, a sign, a point, an exponent, or nan / inf.
NUMBER = re.compile(r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|nan|inf(?:inity)?)", re.IGNORECASE)
TIME_COLUMN = "time_s"
COLUMNS = (TIME_COLUMN, *ACC_AXES, *GYRO_AXES)
# A recording may carry its own labels: the store's converter needs them, predict.py scores the
# recording against them where they are. One format for both.
LABEL_COLUMNS = ("label", "subject")
STANDARD_GRAVITY_M_S2 = 9.80665
ACC_UNITS = {"g": 1.0, "m/s2": 1.0 / STANDARD_GRAVITY_M_S2}
GYRO_UNITS = {"rad/s": 1.0, "deg/s": math.pi / 180.0}
# An accelerometer worn or held reads gravity under the motion: in g its median |acc| over a recording
# lies near 1 whatever the person does, and the same signals in m/s2 read as g near 9.81. A median of
# 7 to 13 g is no person's recording in g (most of it spent at seven times gravity or more) and is
# 9.81 m/s2 give or take 30% (a sensor's offset, a recording of vigorous motion): taken for m/s2.
M_S2_READ_AS_G = (7.0, 13.0)


@dataclass
class Recording:
    acc_g: np.ndarray  # float64 [n, 3], or None for a recording read by its named channels (in extra)
    gyro_rad_s: np.ndarray  # float64 [n, 3], or None when the recording has no gyroscope
    time_s: np.ndarray  # float64 [n], or None: then the sample rate must be given
    path: str
    extra: dict = None  # columns asked for beside the signals (e.g. label, subject): name -> float64 [n]

    def __len__(self):
        return len(self.acc_g if self.acc_g is not None else next(iter(self.extra.values())))


def read_recording(path, acc_unit=None, gyro_unit=None, extra=(), channels=()):
    """CSV with a header of COLUMNS (time_s and gyro_* optional), or .npz with acc, gyro, time_s;
    `extra` names more one-value-per-sample columns (arrays) that must be present too; the label columns
    (LABEL_COLUMNS) are read where present whether asked for or not, into `extra`. With `channels`
    (another device's channel names), those columns and time_s replace acc and gyro. The units (None: g
    and rad/s) convert acc and gyro; given with `channels`, they are refused."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"--recording {path} {not_a_file(path)}")
    _check_units_apply(path, acc_unit, gyro_unit, channels)
    reader = _read_npz if path.suffix.lower() == ".npz" else _read_csv
    present = [name for name in LABEL_COLUMNS if name not in extra and name in _names_in(path)]
    extra = (*channels, *extra, *present)
    columns = reader(path, extra, need_acc=not channels)
    acc = columns["acc"] * ACC_UNITS[acc_unit or "g"] if columns["acc"] is not None else None
    gyro = columns["gyro"] * GYRO_UNITS[gyro_unit or "rad/s"] if columns.get("gyro") is not None else None
    time_s = columns.get("time_s")
    named = np.stack([columns["extra"][name] for name in channels], axis=1) if channels else None
    for axes, values in ((ACC_AXES, acc), (GYRO_AXES, gyro), (channels, named)):
        _check_finite_as_model_input(path, axes, values)
    if time_s is not None and not np.all(np.isfinite(time_s)):
        row = int(np.argmax(~np.isfinite(time_s)))
        raise DataError(f"{path}: {TIME_COLUMN} holds NaN or infinity (first at sample {row + 1}); fill or cut "
                        "that stretch before classifying")
    if time_s is not None and len(time_s) > 1 and np.any(np.diff(time_s) <= 0):
        row = int(np.argmax(np.diff(time_s) <= 0))
        raise DataError(f"{path}: {TIME_COLUMN} does not increase at sample {row + 2} ({time_s[row]:g} then "
                        f"{time_s[row + 1]:g} s); time stamps must be strictly increasing")
    return Recording(acc, gyro, time_s, str(path), {name: columns["extra"][name] for name in extra})


def _names_in(path):
    """The column (or array) names a recording holds, read without its values: a CSV's header, an .npz's
    array names; none where it cannot be read (the reader then says why)."""
    try:
        if path.suffix.lower() == ".npz":
            with np.load(path, allow_pickle=False) as archive:
                return set(archive.files)
        with open(path, encoding="utf-8", errors="replace") as handle:
            return {name.strip() for name in handle.readline().split(",")}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, AttributeError, TypeError):
        return set()


def _check_units_apply(path, acc_unit, gyro_unit, channels):
    """A unit converts acc_x..acc_z or gyro_x..gyro_z; a recording read by a model's own channels keeps
    every column as recorded (which of them is an acceleration, and in what unit the model learnt it,
    is the model's), so a unit given for it would be dropped without a word: refused instead."""
    given = [f"--{kind}-unit {unit}" for kind, unit in (("acc", acc_unit), ("gyro", gyro_unit)) if unit is not None]
    if channels and given:
        raise DataError(f"{' and '.join(given)} convert{'s' if len(given) == 1 else ''} the columns acc_x..acc_z "
                        f"and gyro_x..gyro_z of the UCI HAR layout, while {path} is read by the model's own channels "
                        f"({', '.join(channels)}), as recorded, in the units it was trained on: give them in those "
                        f"units and drop {' and '.join(flag.split()[0] for flag in given)}")


def _median_magnitude(values):
    """The median over samples of |values| [n, 3] (None for no samples): gravity's size in the units
    of an accelerometer worn or held (a median passes over the motion's bursts)."""
    return float(np.median(np.linalg.norm(values, axis=1))) if values is not None and len(values) else None


def unit_warning(recording, acc_unit=None):
    """One line where acceleration read in g (`acc_unit` None or g) looks like m/s2, else None."""
    median = _median_magnitude(recording.acc_g) if acc_unit in (None, "g") else None
    if median is None or not M_S2_READ_AS_G[0] <= median <= M_S2_READ_AS_G[1]:
        return None
    return (f"{recording.path}: the acceleration's median magnitude is {median:.2f} g, near 9.81 where a recording "
            "in g reads about 1 (gravity): it looks like m/s2, and the model reads g; pass --acc-unit m/s2")


def _check_finite_as_model_input(path, axes, values):
    """Signals reach the models as float32: a value finite as float64 but beyond float32's range
    (about 3.4e38) would become infinity there, so finite is judged after that cast."""
    if values is None:
        return
    with np.errstate(over="ignore"):  # the overflow is what is looked for
        bad = ~np.isfinite(values.astype(np.float32))
    if not bad.any():
        return
    row, column = (int(i) for i in np.argwhere(bad)[0])
    array = axes[column].split("_")[0] if axes in (ACC_AXES, GYRO_AXES) else axes[column]
    where = f"array {array} row {row}" if path.suffix.lower() == ".npz" else \
        f"line {row + 2}"  # the header is line 1
    raise DataError(f"{path}: {axes[column]} is {values[row, column]:g} at sample {row + 1} ({where}), which is NaN "
                    "or infinity as float32, the models' type (beyond about 3.4e38); fix or cut that stretch "
                    "before classifying")


def _read_csv(path, extra=(), need_acc=True):
    columns = f"({TIME_COLUMN}, {', '.join(ACC_AXES)}, {', '.join(GYRO_AXES)})"
    try:
        with open(path, newline="") as handle:
            header = next(csv.reader(handle), None)
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path} cannot be read ({type(exc).__name__}); expected a CSV file") from None
    except csv.Error as exc:  # a quote left open, say: the "line" runs on through the file
        raise DataError(f"{path}: its first line is not a row of column names ({exc}); expected a CSV whose first "
                        f"line names the columns {columns}") from None
    header = [name.strip() for name in header or []]
    if not header:
        empty = path.stat().st_size == 0
        raise DataError(f"{path} {'is empty' if empty else 'starts with a blank line'}; expected a CSV whose first "
                        f"line names the columns {columns}")
    known = (*COLUMNS, *extra) if need_acc else (TIME_COLUMN, *extra)
    unknown = [name for name in header if name not in known]
    if unknown or len(set(header)) != len(header):
        problem = f"unknown column {_shortened(unknown[0])!r}" if unknown else "a repeated column"
        raise DataError(f"{path}: {problem} in the header; expected {TIME_COLUMN} (optional), "
                        f"{', '.join(known[1:])}")
    try:
        with warnings.catch_warnings():  # a header without rows: said below, as one line
            warnings.simplefilter("ignore", UserWarning)
            values = np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2, dtype=np.float64)
    except (ValueError, UnicodeDecodeError) as exc:
        where = _first_row_not_numbers(path, header) if isinstance(exc, ValueError) else None
        raise DataError(f"{path}: not a table of numbers ({where or str(exc).splitlines()[0]})") from None
    if values.size == 0:
        values = np.zeros((0, len(header)))
    if values.shape[1] != len(header):
        raise DataError(f"{path}: rows have {values.shape[1]} values but the header names {len(header)} columns")
    table = {name: values[:, i] for i, name in enumerate(header)}
    return _group(path, table, lambda axes: f"column(s) {', '.join(axes)}", extra, need_acc)


def _first_row_not_numbers(path, header):
    """Where a table numpy refused goes wrong, by the file's own line numbers and the header's column
    names (numpy counts rows after the header, from 0 in one message and from 1 in another); None
    where every row reads as numbers here (numpy's message then stands). Read as numpy reads it:
    blank lines skipped, '#' starting a comment, fields split at each comma with no quoting, and a
    number in ASCII digits (NUMBER)."""
    with open(path, encoding="utf-8", errors="replace") as handle:  # numpy named an undecodable file
        for number, line in enumerate(handle, start=1):
            text = line.split("#", 1)[0]
            if number == 1 or not text.strip():
                continue
            values = text.split(",")
            if len(values) != len(header):
                return (f"line {number} has {len(values)} value{'' if len(values) == 1 else 's'} where the "
                        f"header names {len(header)} columns")
            for name, value in zip(header, values, strict=True):
                if not NUMBER.fullmatch(value.strip()):
                    return f"line {number}, column {name}: {_shortened(value.strip())!r} is not a number"
    return None


def _shortened(text, limit=40):
    """A name as a message quotes it: a column name that ran on (a quote left open) cut short."""
    return text if len(text) <= limit else text[:limit] + "..."


def _read_npz(path, extra=(), need_acc=True):
    try:
        loaded = np.load(path, allow_pickle=False)
        single = not isinstance(loaded, np.lib.npyio.NpzFile)  # one array (an .npy file), not named arrays
        if not single:
            with loaded as archive:
                arrays = {name: archive[name] for name in archive.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise DataError(f"{path} is not a readable .npz of numeric arrays ({type(exc).__name__})") from None
    if single:
        raise DataError(f"{path} holds a single array (.npy), not an .npz of named arrays; save it with "
                        "numpy.savez(path, acc=..., gyro=..., time_s=...)")
    unknown = sorted(set(arrays) - {TIME_COLUMN, *extra, *(("acc", "gyro") if need_acc else ())})
    first = "acc" if need_acc else extra[0]
    if unknown or first not in arrays:
        problem = f"unknown array {unknown[0]!r}" if unknown else f"no array {first!r}"
        raise DataError(f"{path}: {problem}; expected " + ("acc [n, 3], optional gyro [n, 3], " if need_acc else "")
                        + f"{TIME_COLUMN} [n]" + "".join(f", {name} [n]" for name in extra))
    if arrays[first].ndim == 0:
        raise DataError(f"{path}: {first} holds a single number, not one value per sample")
    table = {}
    for name, array in arrays.items():
        shape = (len(arrays[first]),) if name in (TIME_COLUMN, *extra) else (len(arrays[first]), 3)
        if array.dtype.kind not in "fiu" or array.shape != shape:
            raise DataError(f"{path}: {name} must be numbers of shape {list(shape)}, got {array.dtype} "
                            f"{list(array.shape)}")
        if name in (TIME_COLUMN, *extra):
            table[name] = array.astype(np.float64)
        else:
            table.update({f"{name}_{axis}": array[:, i].astype(np.float64) for i, axis in enumerate("xyz")})
    return _group(path, table, lambda axes: f"array {axes[0].split('_')[0]}", extra, need_acc)


def _group(path, table, name_of, extra=(), need_acc=True):
    """acc [n, 3] (or None when not needed), gyro [n, 3] or None, time_s [n] or None from named 1-D columns."""
    missing_acc = [axis for axis in ACC_AXES if axis not in table]
    if missing_acc and need_acc:
        raise DataError(f"{path}: missing {name_of(missing_acc)}; the accelerometer "
                        f"({', '.join(ACC_AXES)}) is required")
    present_gyro = [axis for axis in GYRO_AXES if axis in table]
    if present_gyro and len(present_gyro) < len(GYRO_AXES):
        missing = [axis for axis in GYRO_AXES if axis not in table]
        raise DataError(f"{path}: missing {name_of(missing)}; give all three gyroscope axes or none")
    missing_extra = [name for name in extra if name not in table]
    if missing_extra:
        needs = "a labelled recording" if need_acc else "the checkpoint's channels"
        raise DataError(f"{path}: missing {', '.join(repr(name) for name in missing_extra)}, needed by {needs}")
    return {"acc": np.stack([table[axis] for axis in ACC_AXES], axis=1) if not missing_acc else None,
            "gyro": np.stack([table[axis] for axis in GYRO_AXES], axis=1) if present_gyro else None,
            "time_s": table.get(TIME_COLUMN), "extra": {name: table[name] for name in extra}}
