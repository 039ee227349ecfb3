"""A labelled recording (CSV or .npz with `label` and `subject` columns) cut into training windows for
the store's converter exactly as predict.py cuts a recording, each window labelled by the majority of
its samples (data/labels.py's rule for what a label value means)."""
from dataclasses import dataclass

import numpy as np

from data.errors import DataError
from data.labels import class_indexes
from data.preprocess import cut_windows, own_channels, stream_channels, window_starts
from data.recordings import read_recording
from data.resample import on_model_clock, values_on_model_clock


@dataclass(frozen=True, kw_only=True)
class RecordingCut:
    """How a labelled recording is cut into windows: the model's rate, window and stride in samples, the
    preprocessing, each class's label value and the values that mean no class, and the channels (a job of
    the store's converter records these as its options)."""
    sample_rate: float
    window_steps: int
    stride: int
    preprocessing: str
    class_labels: tuple
    unlabelled: tuple
    channels: tuple


def recording_windows(path, cut):
    """(float32 windows [n, C, T], int64 labels 0..K-1 [n], subject, windows cut) of one labelled
    recording: the stream brought to the model's clock, its channels derived and cut as predict.py does,
    each window labelled by the majority of its samples (those of no class then left out of n)."""
    sample_rate, window_steps, preprocessing, channels = cut.sample_rate, cut.window_steps, cut.preprocessing, \
        cut.channels
    named = own_channels(channels, preprocessing)  # read by name, as predict.py reads them
    recording = read_recording(path, extra=("label", "subject"), channels=named)
    subjects = np.unique(recording.extra["subject"])
    if len(subjects) != 1 or subjects[0] != np.rint(subjects[0]):
        raise DataError(f"{path}: a recording holds one subject, numbered by a whole number; found {len(subjects)} "
                        f"({subjects[:5].tolist()})")
    if named:
        values = np.stack([recording.extra[name] for name in named], axis=1)
        values, start_s, source_hz = values_on_model_clock(values, recording, sample_rate, _own_rate(recording, cut))
        stream = values.T.astype(np.float32)
    else:
        stream, start_s, source_hz = _derived_stream(recording, path, cut)
    starts = window_starts(stream.shape[1], window_steps, cut.stride)
    labels = class_indexes(np.rint(recording.extra["label"]).astype(np.int64), cut.class_labels, cut.unlabelled,
                           f"{path}", "name each class's value with --class-labels and any value that means no class "
                           "with --unlabelled")
    labels = _labels_on_model_clock(recording, labels, start_s, source_hz, sample_rate, stream.shape[1])
    window_labels = _majority(labels, starts, window_steps)
    keep = window_labels >= 0
    return cut_windows(stream, starts[keep], window_steps), window_labels[keep], int(subjects[0]), len(starts)


def _own_rate(recording, cut):
    """The rate a recording was made at: its time stamps' (None here: read from them), else the rate the
    run gives, at which a recording without time_s is taken to be."""
    return cut.sample_rate if recording.time_s is None else None


def _derived_stream(recording, path, cut):
    """(float32 [C, m], start_s, source_hz): the channels `preprocessing` derives from acc and gyro."""
    sample_rate, preprocessing, channels = cut.sample_rate, cut.preprocessing, cut.channels
    acc, gyro, start_s, source_hz = on_model_clock(recording, sample_rate, _own_rate(recording, cut))
    if preprocessing == "uci-har" and gyro is None:
        raise DataError(f"{path} has no gyroscope, which --preprocessing uci-har needs; use --preprocessing raw")
    made = stream_channels(preprocessing, acc, gyro, sample_rate)
    missing = [name for name in channels if name not in made]
    if missing:
        raise DataError(f"{path} gives no channel {missing[0]} (it gives {', '.join(made)}), which the store holds "
                        f"({', '.join(channels)}); convert recordings of other sensors into a store of their own")
    # The store's channels alone: --channels may name some of those a recording gives (acc without gyro).
    return np.stack([made[name] for name in channels]), start_s, source_hz


def _labels_on_model_clock(recording, labels, start_s, source_hz, model_hz, steps):
    """Each model-clock sample takes the label of the source sample nearest to it in time."""
    source_times = recording.time_s if recording.time_s is not None else np.arange(len(recording)) / source_hz
    times = start_s + np.arange(steps) / model_hz
    nearest = np.clip(np.searchsorted(source_times, times), 0, len(source_times) - 1)
    earlier = np.clip(nearest - 1, 0, None)
    nearest = np.where(np.abs(source_times[earlier] - times) < np.abs(source_times[nearest] - times), earlier, nearest)
    return labels[nearest]


def _majority(labels, starts, window_steps):
    """The class of each window by its samples' most common class (-1, no class, among them)."""
    window_labels = labels[starts[:, None] + np.arange(window_steps)[None, :]]
    values = np.arange(-1, int(labels.max(initial=-1)) + 1)
    counts = np.stack([(window_labels == value).sum(axis=1) for value in values], 1)
    return values[counts.argmax(axis=1)]  # ties go to the smaller: no class before any class
