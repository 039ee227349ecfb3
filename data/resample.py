"""Bring a recording onto the model's sample clock: one uniform grid at the model's rate."""
from fractions import Fraction

import numpy as np
from scipy.signal import resample_poly

from data.errors import DataError

# Beyond these the rate is almost surely a unit mistake (time in ms, a period given as a rate);
# below half the model's rate, upsampling would have to invent the motion the model looks at.
MIN_RATE_RATIO = 0.5
MAX_RATE_RATIO = 20.0
JITTER_TOLERANCE = 0.01  # time steps within 1% of the median count as uniform
RATE_AGREEMENT = 0.02  # --sample-rate and the time column may differ by 2%
MAX_RATIO_DENOMINATOR = 1000  # resampling ratios are rounded to a fraction with at most this below
# Longer than this without a sample, the interpolation would invent the motion of a good part of a
# window (2.56 s): a phone that stopped recording, not jitter.
MAX_GAP_S = 1.0


def source_rate_hz(time_s, sample_rate_hz, path):
    """The recording's rate: from the span of its time stamps (a median step would read stamps rounded
    to the millisecond, 15 and 16 ms at 64 Hz, as 62.5 Hz), else from --sample-rate. A given rate wins
    when the stamps agree with it within their rounding."""
    if time_s is None:
        if sample_rate_hz is None:
            raise DataError(f"{path} has no time_s column; give its rate with --sample-rate HZ")
        return float(sample_rate_hz)
    if len(time_s) < 2:
        raise DataError(f"{path} holds fewer than two samples")
    from_time = (len(time_s) - 1) / float(time_s[-1] - time_s[0])
    if sample_rate_hz is None:
        return from_time
    if abs(sample_rate_hz / from_time - 1) > RATE_AGREEMENT:
        raise DataError(f"--sample-rate {sample_rate_hz:g} disagrees with the time_s column of {path} "
                        f"({from_time:.4g} Hz); drop --sample-rate or fix the time stamps")
    return float(sample_rate_hz) if _uniform_within_rounding(time_s, sample_rate_hz) else from_time


def _stamp_rounding_s(time_s):
    """The resolution the stamps were written at: the smallest difference between two distinct steps
    (1 ms for steps of 15 and 16 ms); 0 for steps that are all equal."""
    steps = np.unique(np.round(np.diff(time_s), 9))
    return float(np.min(np.diff(steps))) if len(steps) > 1 else 0.0


def _uniform_within_rounding(time_s, rate_hz):
    """Whether every stamp lies within the stamps' rounding of one uniform clock at rate_hz."""
    clock = time_s[0] + np.arange(len(time_s)) / rate_hz
    return float(np.max(np.abs(time_s - clock))) <= _stamp_rounding_s(time_s) + 1e-9


def check_no_gap(time_s, path):
    """Refuse a recording with more than MAX_GAP_S between two samples: windows across the gap would
    be classified from interpolated, not measured, motion. Checked before the rate, which a gap would
    distort; steps all that long are a rate (or a time unit) to refuse, not a gap."""
    if time_s is None or len(time_s) < 2:
        return
    steps = np.diff(time_s)
    where = int(np.argmax(steps))
    if steps[where] > max(MAX_GAP_S, 2 * np.median(steps)):
        raise DataError(f"{path}: no samples for {steps[where]:.3g} s after {time_s[where]:.3f} s (sample "
                        f"{where + 1}); split the recording at the gap into files of their own")


def to_uniform(values, time_s, rate_hz):
    """Linear interpolation of [n, k] values onto start + i / rate_hz when the stamps jitter."""
    if time_s is None:
        return values
    steps = np.diff(time_s)
    if np.max(np.abs(steps * rate_hz - 1.0)) <= JITTER_TOLERANCE or _uniform_within_rounding(time_s, rate_hz):
        return values  # interpolating would only turn the stamps' rounding into noise
    grid = time_s[0] + np.arange(int(np.floor((time_s[-1] - time_s[0]) * rate_hz)) + 1) / rate_hz
    return np.stack([np.interp(grid, time_s, column) for column in values.T], axis=1)


def resample(values, from_hz, to_hz):
    """[n, k] at from_hz -> [m, k] at to_hz, polyphase with its anti-aliasing filter."""
    ratio = Fraction(to_hz / from_hz).limit_denominator(MAX_RATIO_DENOMINATOR)
    if ratio == 1:
        return values
    # padtype="line" continues each edge's trend: zero padding would bend gravity (1 g) at both ends.
    return resample_poly(values, ratio.numerator, ratio.denominator, axis=0, padtype="line")


def on_model_clock(recording, model_rate_hz, sample_rate_hz=None):
    """(acc_g [m, 3], gyro_rad_s [m, 3] or None, start_s, source_hz) at the model's rate."""
    signals = recording.acc_g if recording.gyro_rad_s is None else np.hstack([recording.acc_g, recording.gyro_rad_s])
    signals, start_s, rate_hz = values_on_model_clock(signals, recording, model_rate_hz, sample_rate_hz)
    gyro = signals[:, 3:] if recording.gyro_rad_s is not None else None
    return signals[:, :3], gyro, start_s, rate_hz


def values_on_model_clock(values, recording, model_rate_hz, sample_rate_hz=None):
    """(values [m, k] at the model's rate, start_s, source_hz) of a recording's [n, k] values."""
    check_no_gap(recording.time_s, recording.path)
    rate_hz = source_rate_hz(recording.time_s, sample_rate_hz, recording.path)
    # Within float rounding of a bound is on it: stamps of exactly 1,000 Hz compute as 1000.0000000000001.
    low, high = MIN_RATE_RATIO * model_rate_hz * (1 - 1e-9), MAX_RATE_RATIO * model_rate_hz * (1 + 1e-9)
    if not low <= rate_hz <= high:
        where = "its time_s column (in seconds?)" if recording.time_s is not None else "--sample-rate"
        raise DataError(f"{recording.path} runs at {rate_hz:.4g} Hz by {where}, far from the model's "
                        f"{model_rate_hz:g} Hz (accepted: {MIN_RATE_RATIO * model_rate_hz:g} to "
                        f"{MAX_RATE_RATIO * model_rate_hz:g} Hz); check the rate or the time unit")
    start_s = float(recording.time_s[0]) if recording.time_s is not None else 0.0
    return resample(to_uniform(values, recording.time_s, rate_hz), rate_hz, model_rate_hz), start_s, rate_hz
