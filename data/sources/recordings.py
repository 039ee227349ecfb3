"""--dataset recordings: a folder of labelled recordings, CSV or .npz files as predict.py reads them plus a
`label` and a `subject` column, cut into windows as predict.py cuts a recording (data/labelled_recordings.py).
The store's converter cuts them into shards on disk, a job per file; a run reads them into memory, cut the
same way: UCI HAR's rate, window, preprocessing and six classes (labels 1..6), or what a --description says."""
from pathlib import Path

import numpy as np

from data import uci_har
from data.errors import DataError, not_a_file
from data.labelled_recordings import RecordingCut, recording_windows
from data.layout import Layout, read_layout
from data.preprocess import available_channels
from data.provenance import array_identity
from data.recordings import read_recording
from data.sources.base import Source
from data.splits import HarData, Split, held_out_for_test, hold_out, take, validation_words
from data.store_jobs import label_rule, manifest_head, recording_job_names, recording_options

SUFFIXES = (".csv", ".npz")


class Recordings(Source):
    name = "recordings"
    about = "a folder of labelled recordings (.csv or .npz files with label and subject columns)"
    takes_description = True

    def claims(self, path):
        return path is not None and Path(path).is_dir() and any(file.suffix.lower() in SUFFIXES
                                                                for file in Path(path).iterdir())

    def identity_files(self, path):
        return recording_files(path)

    def load(self, options):
        folder = options.data_dir
        described_by = options.description
        if isinstance(described_by, str | Path):
            described_by = read_layout(described_by)
        files = recording_files(folder)
        cut, class_names = cut_of(described_by, files[0])
        parts = [recording_windows(file, cut) for file in files]
        kept = [part for part in parts if len(part[1])]
        if not kept:
            raise DataError(f"{folder}: no recording gives a window of a class (each is shorter than one window of "
                            f"{cut.window_steps} steps, or unlabelled)")
        whole = Split(np.concatenate([part[0] for part in kept]), np.concatenate([part[1] for part in kept]),
                      np.concatenate([np.full(len(part[1]), part[2], np.int64) for part in kept]))
        is_test, how = held_out_for_test(whole.subjects)
        train_all, test = take(whole, ~is_test), take(whole, is_test)
        train, val, val_subjects = hold_out(train_all, options)
        about = f", described by {described_by.where}" if described_by else ""
        description = (f"data: recordings ({folder}{about}, {len(files)} files, {how}): {len(cut.channels)} channels "
                       f"x {cut.window_steps} steps at {cut.sample_rate:g} Hz; train {len(train)} windows, val "
                       f"{len(val)} / {validation_words(train_all, val_subjects, options.val_split)}, test {len(test)}")
        said = np.array([repr((cut, class_names, described_by and described_by.as_json()))])
        made = {"sample_rate_hz": cut.sample_rate, "window_steps": cut.window_steps, "stride_steps": cut.stride,
                "preprocessing": cut.preprocessing}
        layout = described_by.replace(**made) if described_by else \
            Layout.named(cut.channels, class_names, class_labels=cut.class_labels, where=str(folder), **made)
        return HarData(train, val, test, layout, self.name, description,
                       identity="windows:" + array_identity(whole.signals, whole.labels, whole.subjects, said),
                       described=described_by)

    def store_jobs(self, path, options):
        files = recording_files(path)
        if options.described and not options.described.labels_are_numbers():
            raise DataError(f"{options.described.where}: 'classes' must give whole-number labels for recordings, "
                            "whose label column holds numbers")
        options.sample_rate = options.sample_rate or uci_har.SAMPLE_RATE_HZ
        channels = options.channels or _channels_of(files[0], options.preprocessing)
        jobs = [{"name": name, "recording": str(file), "options": recording_options(options, channels)}
                for name, file in zip(recording_job_names(files), files, strict=True)]
        cut = {"sample_rate_hz": options.sample_rate, "window_steps": options.window_steps,
               "stride_steps": options.stride or options.window_steps // 2, "preprocessing": options.preprocessing}
        made = options.described.replace(**cut) if options.described else \
            Layout.named(channels, options.class_names, class_labels=options.class_labels,
                         unlabelled=list(options.unlabelled) or None, where=f"recordings in {path}", **cut)
        return jobs, manifest_head(made, None, f"recordings in {path}", options, label_rule(options))


def recording_files(folder):
    """The .csv and .npz files of a recordings folder, in name order; a folder without any, or an entry of
    those names that is no file, is refused."""
    folder = Path(folder)
    files = sorted(path for path in folder.iterdir() if path.suffix.lower() in SUFFIXES)
    if not files:
        raise DataError(f"{folder} holds no .csv or .npz recordings (nor is it a UCI HAR layout)")
    odd = next((path for path in files if not path.is_file()), None)  # a folder, or a link to nothing
    if odd is not None:
        raise DataError(f"{odd} {not_a_file(odd)}; a recordings folder holds .csv or .npz files: move it away")
    return files


def cut_of(described_by, first_file):
    """(RecordingCut, class names) of a run on recordings: what the description says (its channels read as
    recorded), else UCI HAR's rate, window, stride, preprocessing and classes 1..6."""
    if described_by is None:
        channels = _channels_of(first_file, "uci-har")
        return RecordingCut(sample_rate=float(uci_har.SAMPLE_RATE_HZ), window_steps=uci_har.WINDOW_STEPS,
                            stride=uci_har.WINDOW_STEPS // 2, preprocessing="uci-har",
                            class_labels=tuple(range(1, len(uci_har.CLASS_NAMES) + 1)), unlabelled=(),
                            channels=tuple(channels)), uci_har.CLASS_NAMES
    if not described_by.labels_are_numbers():
        raise DataError(f"{described_by.where}: 'classes' must give whole-number labels for recordings, whose label "
                        "column holds numbers")
    window = described_by.window_steps or uci_har.WINDOW_STEPS
    return RecordingCut(sample_rate=described_by.sample_rate_hz, window_steps=window,
                        stride=described_by.stride_steps or window // 2, preprocessing="raw",
                        class_labels=described_by.class_labels, unlabelled=described_by.unlabelled,
                        channels=described_by.channels), described_by.class_names


def _channels_of(first_file, preprocessing):
    """The channels a store or run of these recordings holds: what the first recording's sensors give
    (every other must give the same)."""
    has_gyro = read_recording(first_file, extra=("label", "subject")).gyro_rad_s is not None
    return available_channels(preprocessing, has_gyro)


SOURCE = Recordings()
