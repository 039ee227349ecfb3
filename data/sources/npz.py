"""--dataset npz: an .npz file of windows (data/npz_windows.py reads and checks it), maybe read by a
description; its own split array, else a fifth of its subjects held out for test (one person: the last
fifth of their windows). The store's converter takes its windows as they are."""
import json
from pathlib import Path

import numpy as np

from data.errors import DataError
from data.layout import Layout, read_layout
from data.npz_windows import load_npz_windows
from data.provenance import array_identity, file_sha256
from data.sources.base import Source
from data.splits import HarData, Split, held_out_for_test, hold_out, marked_validation, take, validation_words
from data.store_jobs import manifest_head, source_rate, test_subjects_of, window_jobs


class Npz(Source):
    name = "npz"
    about = "an .npz file of windows"
    takes_description = True

    def claims(self, path):
        return path is not None and Path(path).suffix.lower() == ".npz" and not Path(path).is_dir()

    def identity_files(self, path):
        return [Path(path)]

    def load(self, options):
        data_dir = options.data_dir
        described = options.description
        if isinstance(described, str | Path):
            described = read_layout(described)
        said_of_it = []
        windows = load_npz_windows(data_dir, described, warn=said_of_it.append)
        whole = Split(windows.signals, windows.labels, windows.subjects)
        is_test, how = held_out_for_test(whole.subjects, windows.split)
        train_all, test = take(whole, ~is_test), take(whole, is_test)
        if windows.split is not None and np.any(windows.split == "val"):
            train, val, words = marked_validation(data_dir, train_all, windows.split[~is_test], options)
        else:
            train, val, val_subjects = hold_out(train_all, options)
            words = validation_words(train_all, val_subjects, options.val_split)
        described_as = f", described by {described.where}" if described else ""
        unlabelled = f", {windows.unlabelled_windows:,} unlabelled windows left out" if windows.unlabelled_windows \
            else ""
        lengths = f" (unequal: {windows.own_lengths[0]} to {windows.own_lengths[1]}, padded at their end with NaN)" \
            if windows.own_lengths else ""
        description = (f"data: npz ({data_dir}{described_as}, {how}{unlabelled}): {whole.signals.shape[1]} channels "
                       f"x {whole.signals.shape[2]} steps{lengths}; train {len(train)} windows, val {len(val)} / "
                       f"{words}, test {len(test)}")
        said = {"sample_rate_hz": None if np.isnan(windows.sample_rate_hz) else windows.sample_rate_hz,
                "window_steps": whole.signals.shape[2], "preprocessing": windows.preprocessing}
        layout = described.replace(**said) if described else \
            Layout.named(windows.channel_names, windows.class_names, where=str(data_dir), **said)
        return HarData(train, val, test, layout, self.name, description,
                       identity=_windows_identity(windows, described),
                       former_identities=(_file_identity(data_dir, described),),
                       described=described, own_lengths=windows.own_lengths, warnings=tuple(said_of_it))

    def store_jobs(self, path, options):
        windows = load_npz_windows(path, options.described)
        if windows.own_lengths is not None:
            shortest, longest = windows.own_lengths
            raise DataError(f"{path} holds windows of {shortest} to {longest} steps, padded at their end with NaN, "
                            "and a store holds windows of one length: train on the .npz itself "
                            f"(main.py --dataset npz --data-dir {path}), which reads each over its own steps")
        if windows.split is not None and np.any(windows.split == "val"):
            raise DataError(f"{path} marks validation windows ('val'), and a store holds its test subjects only: "
                            "drop the 'val' marks (main.py --dataset store then holds out validation as "
                            f"--val-fraction says), or train on the .npz itself (--dataset npz --data-dir {path})")
        if windows.split is not None and options.test_subjects:
            raise DataError(f"{path} marks its test windows ('split'), and --test-subjects names others: drop one")
        if windows.split is not None:
            test = np.unique(windows.subjects[windows.split == "test"])
        elif options.test_subjects:
            test = np.array(sorted(options.test_subjects))
        else:
            test = test_subjects_of(windows.subjects, path)
        said = {"sample_rate_hz": source_rate(windows.sample_rate_hz, options.sample_rate, path),
                "window_steps": windows.signals.shape[2], "preprocessing": windows.preprocessing}
        made = options.described.replace(**said) if options.described else \
            Layout.named(windows.channel_names, windows.class_names, where=str(path), **said)
        return (window_jobs(windows.signals, windows.labels, windows.subjects),
                manifest_head(made, sorted(int(s) for s in test), f"windows from {path}", options))


def _windows_identity(windows, described):
    """An .npz's identity: the windows it gives (signals, labels, subjects, split) and what it says of them,
    not the file's bytes, so the same windows saved with np.savez_compressed, or in another order of
    arrays, are the same data."""
    said = json.dumps({"classes": list(windows.class_names), "channels": list(windows.channel_names),
                       "rate_hz": windows.sample_rate_hz, "preprocessing": windows.preprocessing,
                       "described": described_identity(described)}, sort_keys=True)
    split = [] if windows.split is None else [np.asarray(windows.split, dtype=str)]
    return "windows:" + array_identity(windows.signals, windows.labels, windows.subjects, *split, np.array([said]))


def _file_identity(data_dir, described):
    """An .npz's identity before it was its windows': the file's bytes (a checkpoint written then has it)."""
    return array_identity(np.array([file_sha256(data_dir), *described_identity(described)]))


def described_identity(described):
    """What a description adds to the identity of the windows it reads (nothing without one)."""
    return [json.dumps(described.as_json(), sort_keys=True)] if described else []


SOURCE = Npz()
