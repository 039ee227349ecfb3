"""Turn a data source into normalised train / validation / test arrays, split by subject."""
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data import synthetic, uci_har
from data.description import description_of, named_triples, read_description
from data.errors import DataError
from data.npz_windows import load_npz_windows
from data.provenance import array_identity, file_sha256
from data.store import LABELS, MANIFEST, StoreSplit, WindowStore

CHANNEL_MODES = ("flatten", "average", "first")
AXES = ("x", "y", "z")
SENSORS = ("body_acc", "body_gyro", "total_acc")
NPZ_TEST_FRACTION = 0.2  # share of subjects held out for test when an .npz has no `split` array
NPZ_TEST_SEED = 0  # fixed, not --seed: runs with different seeds are tested on the same subjects
# Fewer training subjects than this validate on the end of each one's windows instead of on whole
# subjects: holding one of three people out cost 2.9 points on the development people, while with
# eight whole people validated 0.6 points better (docs/training.md, "Validation on few people").
MIN_VALIDATION_SUBJECTS = 5


@dataclass
class Split:
    signals: np.ndarray  # float32 [N, channels, steps]: 128 for UCI HAR, any length from an .npz
    labels: np.ndarray  # int64 [N], 0-based class index
    subjects: np.ndarray  # int64 [N]

    def __len__(self):
        return len(self.labels)


@dataclass
class HarData:
    train: Split
    val: Split
    test: Split
    class_names: tuple
    channel_names: tuple
    source: str  # "uci-har" or "synthetic"
    description: str  # the one-line banner printed at start
    # What turning a recording into these windows takes; checkpoints carry it for predict.py.
    sample_rate_hz: float = uci_har.SAMPLE_RATE_HZ
    preprocessing: str = "uci-har"  # see data/preprocess.py
    # (mean, std) per channel known without a pass over the signals (a window store's), else None:
    # training fits them on its training split.
    normalization: tuple = None
    # What the data is, whatever path it was read from: one SHA-256 of the source's windows, labels
    # and subjects (of an .npz's bytes; of a store's manifest, which holds its shards' checksums,
    # and labels). A checkpoint keeps it, so a resume tells other data at the same path.
    identity: str | None = None
    # What the same data was known as under earlier versions' rules (an .npz's file bytes), which a
    # checkpoint written then recorded.
    former_identities: tuple = ()
    described: object = None  # the data.description.Description the data was read with (a store's, or --description)
    # (shortest, longest) steps of windows of unequal lengths, padded at their end with NaN (an .npz's);
    # None: every window fills its steps.
    own_lengths: tuple = None

    @property
    def padded(self):
        return self.own_lengths is not None

    def known_as(self):
        """The identities a checkpoint of this data may have recorded: today's, then earlier versions'."""
        return (self.identity, *self.former_identities)

    def sensor_triples(self):
        """Channel indices of each sensor's x/y/z: where the description places them, else by the names'
        _x/_y/_z."""
        return self.described.sensor_triples() if self.described else named_triples(self.channel_names)


def resolved_dataset(dataset, data_dir):
    """The kind of data a --dataset value means: auto is UCI HAR with a --data-dir, else synthetic."""
    if dataset != "auto":
        return dataset
    return "uci-har" if data_dir else "synthetic"


def load_har_data(dataset="auto", data_dir=None, mode="flatten", val_fraction=0.2, split_seed=0,
                  synthetic_seed=0, synthetic_windows_per_subject=synthetic.DEFAULT_WINDOWS_PER_SUBJECT,
                  val_subjects=None, val_split="subjects", description=None):
    """Load (or generate) the data, pick channels and hold out whole training subjects for validation:
    `val_subjects` when given, else a random `val_fraction` of them; with val_split "time", the last
    `val_fraction` of every training subject's windows instead.

    The test split is the dataset's own test subjects and is never used for choices made in
    training. Signals are NOT normalised here: see `fit_normalization` and `normalize`. `description`:
    a dataset description (data/description.py), or its file's path, that an .npz's windows are read by.
    """
    if description is not None and dataset != "npz":
        where = "a store keeps the one it was built with" if dataset == "store" else "its layout is known"
        raise DataError(f"--description describes the windows of --dataset npz; --dataset {dataset} takes none "
                        f"({where}): drop it")
    if dataset == "npz":
        return _load_npz(data_dir, mode, val_fraction, split_seed, val_subjects, val_split, description)
    if dataset == "store":
        return _load_store(data_dir, mode, val_fraction, split_seed, val_subjects, val_split)
    source, raw, where = _load_source(dataset, data_dir, synthetic_seed, synthetic_windows_per_subject)
    train_all = Split(select_channels(raw["train"][0], mode), raw["train"][1], raw["train"][2])
    test = Split(select_channels(raw["test"][0], mode), raw["test"][1], raw["test"][2])
    train, val, val_subjects = _hold_out(train_all, val_fraction, split_seed, val_subjects, val_split)
    description = (f"data: {source} ({where}), mode={mode}: {train.signals.shape[1]} channels x "
                   f"{train.signals.shape[2]} steps; train {len(train)} windows / "
                   f"{len(np.unique(train.subjects))} subjects, val {len(val)} / "
                   f"{_validation_words(train_all, val_subjects, val_split)}, test {len(test)} / "
                   f"{len(np.unique(test.subjects))} subjects")
    identity = array_identity(*raw["train"], *raw["test"])
    return HarData(train, val, test, uci_har.CLASS_NAMES, channel_names(mode), source, description, identity=identity)


def _load_source(dataset, data_dir, synthetic_seed, windows_per_subject):
    # A --data-dir that was given must hold the data: training on synthetic windows instead
    # would look like a result on real data.
    if resolved_dataset(dataset, data_dir) == "uci-har":
        root = uci_har.find_root(data_dir)
        if root is None:
            where = (f"--data-dir {data_dir} does not hold" if data_dir else
                     "--dataset uci-har needs --data-dir pointing at")
            raise DataError(f"{where} the UCI HAR Dataset (expected train/Inertial Signals and test/ under "
                            f"it, or under its '{uci_har.DATASET_FOLDER}' folder); use --dataset synthetic "
                            "to run without it")
        raw = {split: uci_har.load_split(root, split) for split in ("train", "test")}
        return "uci-har", raw, str(root)
    if dataset not in ("auto", "synthetic"):
        raise DataError(f"unknown --dataset {dataset!r}; choose auto, uci-har, synthetic or npz")
    if windows_per_subject < 1:
        raise DataError("--synthetic-windows-per-subject must be at least 1")
    why = f"generated, seed {synthetic_seed}"
    if dataset == "auto":
        why += ", no --data-dir given"
    return "synthetic", synthetic.generate(synthetic_seed, windows_per_subject), why


def _load_npz(data_dir, mode, val_fraction, split_seed, val_subjects, val_split, description=None):
    """Windows brought in an .npz: its own `split` (its 'val' windows validate), else whole subjects held
    out for test."""
    _check_window_source("npz", data_dir, mode, "an .npz file of windows")
    described = read_description(description) if isinstance(description, str | Path) else description
    windows = load_npz_windows(data_dir, described)
    whole = Split(windows.signals, windows.labels, windows.subjects)
    if windows.split is not None:
        is_test, how = windows.split == "test", "its split array"
    elif len(np.unique(whole.subjects)) == 1:  # one person: the end of their recording tests
        is_test, how = _last_part(whole.subjects, NPZ_TEST_FRACTION), "one subject: the last fifth of it tests"
    else:
        test_subjects = hold_out_subjects(whole.subjects, NPZ_TEST_FRACTION, NPZ_TEST_SEED)
        is_test = np.isin(whole.subjects, test_subjects)
        how = f"test subjects {sorted(int(s) for s in test_subjects)} held out"
    train_all, test = _take(whole, ~is_test), _take(whole, is_test)
    if windows.split is not None and np.any(windows.split == "val"):
        train, val, words = _marked_validation(data_dir, train_all, windows.split[~is_test], val_subjects, val_split)
    else:
        train, val, val_subjects = _hold_out(train_all, val_fraction, split_seed, val_subjects, val_split)
        words = _validation_words(train_all, val_subjects, val_split)
    described_as = f", described by {described.where}" if described else ""
    unlabelled = f", {windows.unlabelled_windows:,} unlabelled windows left out" if windows.unlabelled_windows else ""
    lengths = f" (unequal: {windows.own_lengths[0]} to {windows.own_lengths[1]}, padded at their end with NaN)" \
        if windows.own_lengths else ""
    description = (f"data: npz ({data_dir}{described_as}, {how}{unlabelled}): {whole.signals.shape[1]} channels x "
                   f"{whole.signals.shape[2]} steps{lengths}; train {len(train)} windows, val {len(val)} / {words}, "
                   f"test {len(test)}")
    return HarData(train, val, test, windows.class_names, windows.channel_names, "npz", description,
                   sample_rate_hz=windows.sample_rate_hz, preprocessing=windows.preprocessing,
                   identity=_windows_identity(windows, described),
                   former_identities=(_file_identity(data_dir, described),),
                   described=described, own_lengths=windows.own_lengths)


def _load_store(data_dir, mode, val_fraction, split_seed, val_subjects, val_split):
    """A window store (data/store.py): splits chosen from its manifest, signals left on disk."""
    _check_window_source("store", data_dir, mode, "a folder made by python -m data.build_store")
    store = WindowStore(data_dir)
    manifest = store.manifest
    is_test = np.isin(store.subjects, manifest["test_subjects"])
    train_all, test = StoreSplit.of(store, ~is_test), StoreSplit.of(store, is_test)
    train, val, val_subjects = _hold_out(train_all, val_fraction, split_seed, val_subjects, val_split)
    description = (f"data: store ({data_dir}, {len(store):,} windows in {len(store.shards)} shards, "
                   f"{manifest['dtype']}): {len(store.channels)} channels x {store.window_steps} steps; train "
                   f"{len(train):,} windows, val {len(val):,} / "
                   f"{_validation_words(train_all, val_subjects, val_split)}, "
                   f"test {len(test):,} / {len(manifest['test_subjects'])} subjects")
    statistics = manifest["normalization"]
    normalization = (np.asarray(statistics["mean"], np.float32), np.asarray(statistics["std"], np.float32))
    return HarData(train, val, test, tuple(manifest["class_names"]), store.channels, "store", description,
                   sample_rate_hz=float(manifest["sample_rate_hz"]), preprocessing=manifest["preprocessing"],
                   normalization=normalization,
                   identity=array_identity(np.array([file_sha256(store.root / name) for name in (MANIFEST, LABELS)])),
                   described=_store_description(manifest, store, data_dir))


def _store_description(manifest, store, data_dir):
    """The description a store was built by (None: built from flags), checked against its channels."""
    if not manifest.get("description"):
        return None
    described = description_of(manifest["description"], f"store {data_dir}'s description")
    described.check("channels", store.channels, f"store {data_dir}")
    return described


def _windows_identity(windows, described):
    """An .npz's identity: the windows it gives (signals, labels, subjects, split) and what it says of them,
    not the file's bytes, so the same windows saved with np.savez_compressed, or in another order of
    arrays, are the same data."""
    said = json.dumps({"classes": list(windows.class_names), "channels": list(windows.channel_names),
                       "rate_hz": windows.sample_rate_hz, "preprocessing": windows.preprocessing,
                       "described": _described_identity(described)}, sort_keys=True)
    split = [] if windows.split is None else [np.asarray(windows.split, dtype=str)]
    return "windows:" + array_identity(windows.signals, windows.labels, windows.subjects, *split, np.array([said]))


def _file_identity(data_dir, described):
    """An .npz's identity before it was its windows': the file's bytes (a checkpoint written then has it)."""
    return array_identity(np.array([file_sha256(data_dir), *_described_identity(described)]))


def _described_identity(described):
    """What a description adds to the identity of the windows it reads (nothing without one)."""
    return [json.dumps(described.as_json(), sort_keys=True)] if described else []


def _check_window_source(dataset, data_dir, mode, what):
    """Sources of ready windows need a path, and take their channels as they are."""
    if not data_dir:
        raise DataError(f"--dataset {dataset} needs --data-dir pointing at {what}")
    if mode != "flatten":
        raise DataError(f"--mode {mode} picks UCI HAR channels; the windows of --dataset {dataset} are used as "
                        "they are (--mode flatten)")


def select_channels(signals, mode):
    """flatten: all 9 channels; average: each axis averaged over the three sensors; first: body_acc."""
    if mode == "flatten":
        return signals
    if mode == "average":
        return signals.reshape(len(signals), len(SENSORS), len(AXES), -1).mean(axis=1)
    if mode == "first":
        return signals[:, :len(AXES)]
    raise DataError(f"unknown --mode {mode!r}; choose one of {', '.join(CHANNEL_MODES)}")


def channel_names(mode):
    if mode == "flatten":
        return uci_har.SIGNAL_NAMES
    if mode == "average":
        return tuple(f"mean_{axis}" for axis in AXES)
    return uci_har.SIGNAL_NAMES[:len(AXES)]


def hold_out_subjects(subjects, val_fraction, seed):
    """Choose round(fraction x subjects) training subjects (at least one) for validation; none for
    a fraction of 0 (every subject trains)."""
    if val_fraction == 0:
        return np.zeros(0, dtype=np.int64)
    unique = np.unique(subjects)
    if not 0 < val_fraction < 1:  # also rejects NaN
        raise DataError(f"--val-fraction must be at least 0 and below 1, got {val_fraction}")
    if len(unique) < 2:
        raise DataError("validation needs at least two training subjects; the training split has "
                        f"{len(unique)}: train without validation with --val-fraction 0 (best.pt is then the last "
                        "epoch's), or bring windows of more subjects")
    count = min(len(unique) - 1, max(1, round(val_fraction * len(unique))))
    return np.sort(np.random.default_rng(seed).choice(unique, size=count, replace=False))


def _hold_out(train_all, val_fraction, seed, val_subjects, val_split="subjects"):
    """(train, val, validation subjects): the given subjects, which must be training subjects and leave
    at least one to train on, else a random `val_fraction` of them; or the end of each one's windows."""
    if _validates_in_time(train_all, val_fraction, val_subjects, val_split):
        is_val = _last_part(train_all.subjects, val_fraction)
        if val_fraction > 0 and not is_val.any():
            why = "--val-split time" if val_split == "time" else f"fewer than {MIN_VALIDATION_SUBJECTS} subjects"
            instead = "--val-split subjects, " if val_split == "time" else ""
            raise DataError(f"validation would take the last part of each training subject's windows ({why}), "
                            "and no subject has more than one: nothing is left to validate on; use "
                            f"{instead}--val-subjects, or --val-fraction 0 to train without validation")
        return _take(train_all, ~is_val), _take(train_all, is_val), np.unique(train_all.subjects[is_val])
    if val_subjects is None:
        val_subjects = hold_out_subjects(train_all.subjects, val_fraction, seed)
    else:
        unique = set(np.unique(train_all.subjects).tolist())
        unknown = sorted(set(val_subjects) - unique)
        if unknown:
            raise DataError(f"validation subject(s) {', '.join(map(str, unknown))} are not in the training split "
                            f"(its subjects: {', '.join(map(str, sorted(unique)))})")
        if unique <= set(val_subjects):
            raise DataError("the validation subjects are all the training subjects; leave at least one to train on")
        val_subjects = np.array(sorted(set(val_subjects)), dtype=np.int64)
    is_val = np.isin(train_all.subjects, val_subjects)
    return _take(train_all, ~is_val), _take(train_all, is_val), val_subjects


def _marked_validation(path, train_all, marks, val_subjects, val_split):
    """(train, val, how validation was chosen) where the file's split array marks 'val' windows: those
    validate, whatever --val-fraction says; a flag that would choose them otherwise is refused."""
    if val_subjects is not None or val_split != "subjects":
        flag = "--val-subjects" if val_subjects is not None else f"--val-split {val_split}"
        raise DataError(f"{path}: its split array marks the validation windows ('val'), and {flag} would choose "
                        "others; drop the flag, or the 'val' marks")
    is_val = marks == "val"
    return _take(train_all, ~is_val), _take(train_all, is_val), "its split array's 'val' windows"


def _validates_in_time(train_all, val_fraction, val_subjects, val_split):
    """--val-split time, or fewer than MIN_VALIDATION_SUBJECTS training subjects and no --val-subjects:
    a whole person held out of so few takes too much of what there is to learn from (and one person
    cannot be held out of their own data), so the end of each one's windows validates instead."""
    if val_split == "time":
        return True
    return val_subjects is None and val_fraction > 0 and _few_subjects(train_all)


def _few_subjects(train_all):
    return len(np.unique(train_all.subjects)) < MIN_VALIDATION_SUBJECTS


def _validation_words(train_all, val_subjects, val_split):
    """How validation was held out, for the data's one-line description."""
    if len(val_subjects) and (val_split == "time" or _few_subjects(train_all)):
        return "the last part of each training subject's windows"
    return f"subjects {sorted(int(s) for s in val_subjects)}"


def _last_part(subjects, fraction):
    """[N] bool: the last round(fraction x n) of each subject's n windows, in the order they are held
    (at least one where the fraction is not 0, and never all). Windows cut with overlap share samples
    across the boundary."""
    if not 0 <= fraction < 1:
        raise DataError(f"--val-fraction must be at least 0 and below 1, got {fraction}")
    last = np.zeros(len(subjects), dtype=bool)
    for subject in np.unique(subjects) if fraction else ():
        where = np.flatnonzero(subjects == subject)
        count = min(len(where) - 1, max(1, round(fraction * len(where))))
        last[where[len(where) - count:]] = True
    return last


def untrained_classes_warning(data):
    """A class without training windows is never learnt, yet the model may still predict it. Warned,
    not refused: a cross-validation fold or a small study may lack a rare class and still be useful."""
    missing = [name for index, name in enumerate(data.class_names) if not np.any(data.train.labels == index)]
    return [f"class(es) {', '.join(missing)} have no training windows: the model cannot learn them, yet may "
            "predict them; add windows of them to the training subjects, or leave them out of the classes"] \
        if missing else []


def fit_normalization(train_signals, padded=False):
    """Per-channel mean and std over the training split only, as float32 arrays of [channels];
    `padded`: over the steps before each window's NaN padding."""
    statistics = (np.nanmean, np.nanstd) if padded else (np.mean, np.std)
    mean, std = (statistic(train_signals, axis=(0, 2), dtype=np.float64) for statistic in statistics)
    return mean.astype(np.float32), np.maximum(std, 1e-6).astype(np.float32)


def normalize(split, mean, std):
    if isinstance(split, StoreSplit):
        return split.normalized(mean, std)  # applied to each batch as the store reads it
    signals = (split.signals - mean[None, :, None]) / std[None, :, None]
    return Split(signals.astype(np.float32), split.labels, split.subjects)


def _take(split, mask):
    if isinstance(split, StoreSplit):
        return split.take(mask)
    return Split(split.signals[mask], split.labels[mask], split.subjects[mask])
