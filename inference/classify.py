"""A recording through a checkpoint: the checkpoint's channels, sliding windows, probabilities."""
import math
from dataclasses import dataclass

import numpy as np

from data import preprocess
from data.errors import DataError
from data.preprocess import available_channels, cut_windows, stream_channels, window_starts
from data.resample import on_model_clock, values_on_model_clock
from data.splits import channel_names, select_channels
from data.uci_har import SIGNAL_NAMES
from inference.adaptation import MIN_RECORDING_WINDOWS, adapted_recording
from inference.bundle import probabilities
from training.errors import UsageError


@dataclass
class WindowPredictions:
    start_s: np.ndarray  # [N] window starts on the recording's clock
    end_s: np.ndarray  # [N]
    probabilities: np.ndarray  # [N, classes]
    class_names: tuple
    acc_magnitude_g: np.ndarray  # [m] |acc| at the model's rate, for the plot
    sample_rate_hz: float  # the model's rate
    start_s_of_stream: float
    source_rate_hz: float
    magnitude_label: str = "|acc| (g)"  # another device's: the norm of its channels, as recorded

    @property
    def duration_s(self):
        return len(self.acc_magnitude_g) / self.sample_rate_hz


def _averaged(bundle):
    return bundle.config.data.mode == "average" and bundle.channel_names == channel_names("average")


def own_channels(bundle):
    """A raw checkpoint's channel names when they are another device's (data.preprocess.own_channels)."""
    return preprocess.own_channels(bundle.channel_names, bundle.preprocessing)


def check_checkpoint(bundle):
    """What the checkpoint alone decides, refused before the recording is read: its rate, its preprocessing."""
    if not math.isfinite(bundle.sample_rate_hz) or bundle.sample_rate_hz <= 0:
        raise UsageError(f"checkpoint {bundle.path} does not know the sample rate of its windows (an .npz "
                         "without sample_rate_hz); add it to the .npz and retrain to classify recordings")
    if bundle.preprocessing not in ("uci-har", "raw"):
        raise UsageError(f"checkpoint {bundle.path} was trained on windows whose preprocessing is unknown "
                         f"(channels {', '.join(bundle.channel_names)}), so recordings cannot be cut like them; if "
                         "the windows are the recorded signals, resampled only, add preprocessing='raw' to the .npz "
                         "and retrain")


def check_usable(bundle, recording):
    """What can be refused before any filtering: the rate, the preprocessing, the channels."""
    check_checkpoint(bundle)
    if own_channels(bundle):  # read_recording required every one of them
        return
    has_gyro = recording.gyro_rad_s is not None
    available = available_channels(bundle.preprocessing, has_gyro)
    if set(bundle.channel_names) <= set(available) or (_averaged(bundle) and set(SIGNAL_NAMES) <= set(available)):
        return
    lacking = "no gyroscope (gyro_x, gyro_y, gyro_z)" if not has_gyro else "other channels"
    instead = "a checkpoint trained with --mode first" if bundle.preprocessing == "uci-har" else "another checkpoint"
    raise UsageError(f"the checkpoint's channels ({', '.join(bundle.channel_names)}; --mode "
                     f"{bundle.config.data.mode}) cannot be made from {recording.path}, which has {lacking}; use "
                     f"{instead}, or a recording with them")


@dataclass
class RecordingWindows:
    windows: np.ndarray  # float32 [N, C, T], raw units, the checkpoint's channels
    start_steps: np.ndarray  # [N] window starts, in samples at the model's rate
    acc_g: np.ndarray  # [m, 3] at the model's rate (another device's: its channels, [m, C])
    start_s: float  # time of the first sample
    source_rate_hz: float


def recording_windows(bundle, recording, stride_steps=None, sample_rate_hz=None):
    """The windows the checkpoint's training data would hold for this stream."""
    check_usable(bundle, recording)
    if own_channels(bundle):
        values = np.stack([recording.extra[name] for name in bundle.channel_names], axis=1)
        acc, start_s, source_hz = values_on_model_clock(values, recording, bundle.sample_rate_hz, sample_rate_hz)
        gyro = None
    else:
        acc, gyro, start_s, source_hz = on_model_clock(recording, bundle.sample_rate_hz, sample_rate_hz)
    window = bundle.window_steps
    if len(acc) < window:
        raise DataError(f"{recording.path} lasts {len(acc) / bundle.sample_rate_hz:.2f} s, shorter than one "
                        f"window of the model ({window} samples = {window / bundle.sample_rate_hz:g} s)")
    with np.errstate(over="ignore", invalid="ignore"):  # overflow to float32's infinity: refused below
        if own_channels(bundle):  # as recorded, resampled only
            stream = acc.T
        else:
            available = stream_channels(bundle.preprocessing, acc, gyro, bundle.sample_rate_hz)
            names = SIGNAL_NAMES if _averaged(bundle) else bundle.channel_names
            stream = np.stack([available[name] for name in names])
            if _averaged(bundle):  # the same averaging as the training windows had
                stream = select_channels(stream[None], "average")[0]
    starts = window_starts(stream.shape[1], window, stride_steps or window // 2)
    windows = cut_windows(stream, starts, window)
    # The windows as the model sees them (float32): values the recording's check let through can
    # still leave float32's range in the filters, and a model fed infinity answers with NaN.
    if not np.isfinite(windows).all():
        index, channel, _ = (int(i) for i in np.argwhere(~np.isfinite(windows))[0])
        at_s = start_s + starts[index] / bundle.sample_rate_hz
        raise DataError(f"{recording.path}: window {index + 1} (from {at_s:.2f} s) holds NaN or infinity in channel "
                        f"{bundle.channel_names[channel]} once filtered and cast to float32, the models' type: the "
                        "recording's values there are too large for it; fix or cut that stretch before classifying")
    return RecordingWindows(windows, starts, acc, start_s, source_hz)


def classify_recording(bundle, recording, device, stride_steps=None, sample_rate_hz=None, adapt=False):
    """Window probabilities of a recording; with `adapt`, MiniRocket's features standardised with the
    recording's own statistics (inference/adaptation.py), refused where it is too short or of one activity."""
    cut = recording_windows(bundle, recording, stride_steps, sample_rate_hz)
    rate_hz = bundle.sample_rate_hz
    begin_s = cut.start_s + cut.start_steps / rate_hz
    if adapt:
        stride = stride_steps or bundle.window_steps // 2
        shortest_s = (bundle.window_steps + (MIN_RECORDING_WINDOWS - 1) * stride) / rate_hz
        probs = adapted_recording(bundle, cut.windows, device, recording.path, shortest_s)
    else:
        probs = probabilities(bundle, cut.windows, device)
    return WindowPredictions(begin_s, begin_s + bundle.window_steps / rate_hz, probs, bundle.class_names,
                             np.linalg.norm(cut.acc_g, axis=1), rate_hz, cut.start_s, cut.source_rate_hz,
                             "|channels|" if own_channels(bundle) else "|acc| (g)")
