"""The UCI HAR signal chain, written once: raw accelerometer (g) and gyroscope (rad/s) streams
to the channels the windows hold, and the cutting of a stream into windows.

UCI HAR (and the HAPT recordings it was cut from) filter each axis with a 3-sample median and a
3rd-order Butterworth low-pass at 20 Hz, then split the accelerometer into gravity (a 0.3 Hz
Butterworth low-pass of it) and body motion (the rest). Filters run forwards and backwards over
the whole stream, so a window depends on the samples around it, as in the dataset.
"""
import numpy as np

from data.errors import DataError
from data.layout import PREPROCESSINGS
from data.uci_har import SIGNAL_NAMES

MEDIAN_STEPS = 3
FILTER_ORDER = 3
NOISE_CUTOFF_HZ = 20.0
GRAVITY_CUTOFF_HZ = 0.3
MIN_FILTER_STEPS = 3 * (FILTER_ORDER + 1) + 1  # filtfilt pads each end with 3 x (order + 1) samples
ACC_AXES = ("acc_x", "acc_y", "acc_z")
GYRO_AXES = ("gyro_x", "gyro_y", "gyro_z")
RAW_CHANNELS = ACC_AXES + GYRO_AXES


def low_pass(signal, cutoff_hz, sample_rate_hz):
    """Zero-phase Butterworth low-pass along the last axis."""
    # Imported here, not at the top: data.splits imports this module, and scipy.signal would add
    # most of a second to every training start, which never filters.
    from scipy.signal import butter, filtfilt
    b, a = butter(FILTER_ORDER, cutoff_hz / (sample_rate_hz / 2.0))
    return filtfilt(b, a, signal, axis=-1)


def denoise(axes, sample_rate_hz):
    """Median then 20 Hz low-pass of each row of `axes` [3, n], in float64."""
    from scipy.signal import medfilt  # see low_pass
    smoothed = np.stack([medfilt(row.astype(np.float64), MEDIAN_STEPS) for row in axes])
    return low_pass(smoothed, NOISE_CUTOFF_HZ, sample_rate_hz)


def uci_har_channels(acc_g, gyro_rad_s, sample_rate_hz):
    """{name: float32 [n]} for the UCI HAR channels a stream can give.

    acc_g and gyro_rad_s are [n, 3]; gyro_rad_s may be None (then no body_gyro_*)."""
    if sample_rate_hz / 2 <= NOISE_CUTOFF_HZ:
        raise DataError(f"the UCI HAR filters need a sample rate above {2 * NOISE_CUTOFF_HZ:g} Hz, "
                        f"got {sample_rate_hz:g} Hz")
    if len(acc_g) < MIN_FILTER_STEPS:
        raise DataError(f"the UCI HAR filters need at least {MIN_FILTER_STEPS} samples, got {len(acc_g)}")
    total = denoise(np.asarray(acc_g).T, sample_rate_hz)
    body = total - low_pass(total, GRAVITY_CUTOFF_HZ, sample_rate_hz)
    rows = {f"body_acc_{axis}": body[i] for i, axis in enumerate("xyz")}
    rows.update({f"total_acc_{axis}": total[i] for i, axis in enumerate("xyz")})
    if gyro_rad_s is not None:
        gyro = denoise(np.asarray(gyro_rad_s).T, sample_rate_hz)
        rows.update({f"body_gyro_{axis}": gyro[i] for i, axis in enumerate("xyz")})
    return {name: rows[name].astype(np.float32) for name in SIGNAL_NAMES if name in rows}


def stream_channels(preprocessing, acc_g, gyro_rad_s, sample_rate_hz):
    """The channels `preprocessing` derives from a stream at `sample_rate_hz`, by name."""
    if preprocessing == "uci-har":
        return uci_har_channels(acc_g, gyro_rad_s, sample_rate_hz)
    if preprocessing == "raw":
        rows = {name: np.asarray(acc_g)[:, i] for i, name in enumerate(ACC_AXES)}
        if gyro_rad_s is not None:
            rows.update({name: np.asarray(gyro_rad_s)[:, i] for i, name in enumerate(GYRO_AXES)})
        return {name: values.astype(np.float32) for name, values in rows.items()}
    raise DataError(f"windows made by preprocessing {preprocessing!r} cannot be rebuilt from a recording; "
                    f"known: {', '.join(PREPROCESSINGS[:2])}")


def available_channels(preprocessing, has_gyro):
    """Names of the channels `preprocessing` can make from a stream with or without a gyroscope."""
    if preprocessing == "uci-har":
        return tuple(name for name in SIGNAL_NAMES if has_gyro or "gyro" not in name)
    if preprocessing == "raw":
        return ACC_AXES + (GYRO_AXES if has_gyro else ())
    return ()


def own_channels(channel_names, preprocessing):
    """The channels a recording holds as columns of those names, taken as recorded: another device's
    (preprocessing 'raw', names other than acc_* / gyro_*), else () (acc and gyro read by axis)."""
    return tuple(channel_names) if preprocessing == "raw" and not set(channel_names) <= set(RAW_CHANNELS) else ()


def preprocessing_of(channel_names):
    """Which chain a set of channel names implies (used for windows brought in an .npz)."""
    if set(channel_names) <= set(RAW_CHANNELS):
        return "raw"
    if set(channel_names) <= set(SIGNAL_NAMES) or set(channel_names) == {"mean_x", "mean_y", "mean_z"}:
        return "uci-har"
    return "unknown"


def window_starts(num_steps, window_steps, stride_steps):
    """Start indices of full windows every `stride_steps`, plus one ending at the last sample
    when the stride leaves a tail uncovered, so the whole stream is classified."""
    if num_steps < window_steps:
        return np.zeros(0, dtype=np.int64)
    starts = np.arange(0, num_steps - window_steps + 1, stride_steps, dtype=np.int64)
    if starts[-1] + window_steps < num_steps:
        starts = np.append(starts, num_steps - window_steps)
    return starts


def cut_windows(stream, starts, window_steps):
    """[C, n] stream -> float32 [len(starts), C, window_steps], copies (not views)."""
    index = starts[:, None] + np.arange(window_steps)[None, :]
    return np.ascontiguousarray(stream[:, index].transpose(1, 0, 2), dtype=np.float32)
