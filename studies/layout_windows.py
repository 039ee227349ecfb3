"""Windows of other layouts a user could bring, cut from the labelled development recordings: other
sensors, rates, window lengths, label schemes, channel names, and one person split in time. Each
layout is an .npz that `main.py --dataset npz` reads (data/npz_windows.py), raw signals resampled
only, and a whole recording in the same channels and rate for predict.py --recording.

The recordings archive holds `uSS_sK_acc` [n, 3] g, `uSS_sK_gyro` [n, 3] rad/s and `uSS_sK_label`
[n] (1..6 the six activities, anything else a transition or unlabelled) at 50 Hz, SS the person.
Windows lie wholly inside one stretch of one activity, as the development folder's build_ucihar.py
cuts them, without its filters.
"""
from dataclasses import dataclass

import numpy as np

from data.resample import resample
from data.uci_har import CLASS_NAMES

RECORDING_RATE_HZ = 50.0
ACTIVITIES = range(1, 7)  # the recordings' labels of the six activities; the others are never windowed
TEST_SUBJECTS = (3, 7, 15, 21, 26, 29)  # build_ucihar.py's default test people
ONE_PERSON = 1  # the person of the layout split in time
ONE_PERSON_TRAIN_SHARE = 0.7  # of each of that person's recordings' windows, the first ones
SENSOR_AXES = {"acc": ("acc_x", "acc_y", "acc_z"), "gyro": ("gyro_x", "gyro_y", "gyro_z")}
DEVICE_NAMES = ("waist_up", "waist_side", "waist_fwd", "waist_up_turn", "waist_side_turn", "waist_fwd_turn")
# Labels 1..6 to another scheme, 0-based: walking of any kind, sitting or standing, lying.
THREE_CLASSES = {1: 0, 2: 0, 3: 0, 4: 1, 5: 1, 6: 2}


@dataclass(frozen=True)
class Layout:
    about: str  # one line for the table's notes
    rate_hz: float = RECORDING_RATE_HZ
    window_s: float = 2.56
    stride_s: float = 1.28
    sensors: tuple = ("acc", "gyro")
    device_names: bool = False  # channels named as another device would (no x/y/z triples)
    described: bool = False  # a description file (--description) gives each channel's sensor and axis
    three_classes: bool = False  # integer labels 0..2 of THREE_CLASSES, without class names
    # ONE_PERSON alone, split in time within each "recording", or within each "activity" of a recording
    # (its stretches of one activity taken together); None: every person, TEST_SUBJECTS test
    time_split_by: str | None = None

    @property
    def window_steps(self):
        return round(self.window_s * self.rate_hz)

    @property
    def stride_steps(self):
        return round(self.stride_s * self.rate_hz)

    @property
    def channel_names(self):
        names = tuple(name for sensor in self.sensors for name in SENSOR_AXES[sensor])
        return DEVICE_NAMES[:len(names)] if self.device_names else names


LAYOUTS = {
    "acc-only": Layout("accelerometer alone, 50 Hz, 2.56 s windows, 50% overlap", sensors=("acc",)),
    "20hz": Layout("acc + gyro resampled to 20 Hz, 3 s windows, 50% overlap", rate_hz=20.0, window_s=3.0,
                   stride_s=1.5),
    "100hz": Layout("acc + gyro upsampled to 100 Hz, 2.56 s windows, 50% overlap", rate_hz=100.0),
    "10s": Layout("acc + gyro, 50 Hz, 10 s windows, stride 5 s", window_s=10.0, stride_s=5.0),
    "labels-0": Layout("acc + gyro, 50 Hz, integer labels 0 walking, 1 sitting/standing, 2 lying, no class names",
                       three_classes=True),
    "device-names": Layout(f"acc + gyro, 50 Hz, channels {', '.join(DEVICE_NAMES)}", device_names=True),
    "device-names-described": Layout("device-names with a description file naming each channel's sensor and axis",
                                     device_names=True, described=True),
    "one-person": Layout(f"person {ONE_PERSON} alone: the first {ONE_PERSON_TRAIN_SHARE:.0%} of each recording's "
                         "windows train, the rest test", time_split_by="recording"),
    # The recordings follow one protocol, the stairs last: the first 70% of a recording holds none of
    # them, and the last 30% little else. Split within each activity, every class trains and is tested.
    "one-person-each-activity": Layout(f"person {ONE_PERSON} alone: the first {ONE_PERSON_TRAIN_SHARE:.0%} of each "
                                       "recording's windows of each activity train, the rest test",
                                       time_split_by="activity"),
}


@dataclass
class LayoutWindows:
    signals: np.ndarray  # float32 [N, C, T]
    labels: np.ndarray  # int64 [N]
    subjects: np.ndarray  # int64 [N]
    split: np.ndarray  # str [N]: 'train' / 'test'
    recording: np.ndarray  # str [N]: the recording a window was cut from (not written to the .npz)
    start_step: np.ndarray  # int64 [N]: its first sample at the layout's rate (not written either)
    layout: Layout

    @property
    def class_names(self):
        return None if self.layout.three_classes else CLASS_NAMES

    def description(self):
        """The --description file's contents (docs/using_a_model.md): each channel's name, sensor and axis
        (its SENSOR_AXES position), the rate, the windows and the classes with their labels."""
        layout = self.layout
        sensors = [(sensor, axis[-1]) for sensor in layout.sensors for axis in SENSOR_AXES[sensor]]
        return {"sample_rate_hz": layout.rate_hz, "window_steps": layout.window_steps,
                "stride_steps": layout.stride_steps,
                "channels": [{"name": name, "sensor": sensor, "axis": axis}
                             for name, (sensor, axis) in zip(layout.channel_names, sensors, strict=True)],
                "classes": [{"name": name, "label": label} for label, name in enumerate(self.class_names)]}

    def save(self, path):
        """The .npz of --dataset npz: only the arrays data/npz_windows.py knows."""
        extra = {} if self.class_names is None else {"class_names": np.array(self.class_names)}
        with open(path, "wb") as handle:
            np.savez(handle, signals=self.signals, labels=self.labels, subjects=self.subjects, split=self.split,
                     channel_names=np.array(self.layout.channel_names), sample_rate_hz=self.layout.rate_hz,
                     preprocessing=np.array("raw"), **extra)


def read_recordings(path):
    """{recording name 'uSS_sK': {'acc', 'gyro', 'label'}} of the archive at `path`."""
    with np.load(path, allow_pickle=False) as archive:
        arrays = {key: archive[key] for key in archive.files}
    names = sorted({key.rsplit("_", 1)[0] for key in arrays})
    return {name: {part: arrays[f"{name}_{part}"] for part in ("acc", "gyro", "label")} for name in names}


def subject_of(name):
    return int(name[1:3])


def stream(recording, layout):
    """(signals [C, m] float32, labels [m]) of one recording at the layout's rate and in its channels.
    Each resampled sample takes the label of the recorded sample it falls in."""
    values = np.hstack([recording[sensor].astype(np.float64) for sensor in layout.sensors])
    values = resample(values, RECORDING_RATE_HZ, layout.rate_hz)
    source = np.floor(np.arange(len(values)) * RECORDING_RATE_HZ / layout.rate_hz).astype(np.int64)
    labels = recording["label"][np.minimum(source, len(recording["label"]) - 1)]
    return values.T.astype(np.float32), labels.astype(np.int64)


def window_starts(labels, window_steps, stride_steps):
    """[(start, activity label)] of the windows wholly inside one stretch of one activity, in time order."""
    edges = np.flatnonzero(np.diff(labels)) + 1
    starts = []
    for begin, end in zip(np.r_[0, edges], np.r_[edges, len(labels)], strict=True):
        if labels[begin] in ACTIVITIES:
            starts += [(start, int(labels[begin])) for start in range(begin, end - window_steps + 1, stride_steps)]
    return starts


def time_split(count):
    """[count] str: the first ONE_PERSON_TRAIN_SHARE of `count` windows in time order 'train', the rest
    'test' (at least one of each where there are two)."""
    train = min(count - 1, max(1, round(ONE_PERSON_TRAIN_SHARE * count))) if count > 1 else count
    return np.array(["train"] * train + ["test"] * (count - train))


def _time_split(first, groups, window_steps):
    """([N] split, [N] bool kept) of one recording's windows (starts `first`, in time order), split in
    time within each group; a test window that shares samples with its group's last training window
    is left out, so that no test sample was trained on."""
    split, keep = np.empty(len(first), dtype="<U5"), np.ones(len(first), dtype=bool)
    for group in np.unique(groups):
        where = np.flatnonzero(groups == group)
        split[where] = time_split(len(where))
        trained = first[where][split[where] == "train"]
        keep[where] = (split[where] == "train") | (first[where] >= trained.max() + window_steps)
    return split, keep


def cut_layout(recordings, layout, test_subjects=TEST_SUBJECTS):
    """The layout's windows of every recording (of ONE_PERSON alone for a time split)."""
    parts = []
    for name, recording in recordings.items():
        subject = subject_of(name)
        if layout.time_split_by and subject != ONE_PERSON:
            continue
        signals, labels = stream(recording, layout)
        starts = window_starts(labels, layout.window_steps, layout.stride_steps)
        if not starts:
            continue
        first = np.array([start for start, _ in starts], dtype=np.int64)
        activity = np.array([label for _, label in starts], dtype=np.int64)
        if layout.time_split_by:
            groups = activity if layout.time_split_by == "activity" else np.zeros(len(first), dtype=np.int64)
            split, keep = _time_split(first, groups, layout.window_steps)
        else:
            split = np.full(len(first), "test" if subject in test_subjects else "train")
            keep = np.ones(len(first), dtype=bool)
        index = first[keep, None] + np.arange(layout.window_steps)[None, :]
        parts.append((signals[:, index].transpose(1, 0, 2), activity[keep], np.full(keep.sum(), subject),
                      split[keep], np.full(keep.sum(), name), first[keep]))
    if not parts:
        raise ValueError(f"no window of {layout.window_steps} samples lies inside one activity of these recordings")
    signals, activity, subjects, split, names, first = (np.concatenate(arrays) for arrays in zip(*parts, strict=True))
    labels = np.array([THREE_CLASSES[a] for a in activity]) if layout.three_classes else activity - 1
    return LayoutWindows(np.ascontiguousarray(signals, dtype=np.float32), labels.astype(np.int64),
                         subjects.astype(np.int64), split, names, first, layout)


def recording_arrays(recording, layout):
    """The arrays of a recording file predict.py --recording reads for this layout: acc [n, 3] (and
    gyro [n, 3]) for acc_* / gyro_* channels, else one 1-D array per channel name; time_s [n]."""
    signals, _ = stream(recording, layout)
    arrays = {"time_s": np.arange(signals.shape[1]) / layout.rate_hz}
    if layout.device_names:
        return {**arrays, **dict(zip(layout.channel_names, signals.astype(np.float64), strict=True))}
    for index, sensor in enumerate(layout.sensors):
        arrays[sensor] = signals[3 * index:3 * index + 3].T.astype(np.float64)
    return arrays


def write_recording(recording, layout, path):
    with open(path, "wb") as handle:
        np.savez(handle, **recording_arrays(recording, layout))
