"""The splits every kind of data (data/sources/) gives a run: windows, labels and subjects of train, validation
and test, held out by subject, and their normalisation."""
from dataclasses import dataclass

import numpy as np

from data import uci_har
from data.errors import DataError
from data.layout import Layout
from data.store import StoreSplit

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
    # What the data is (data/layout.py): channels, rate, window length, classes, preprocessing; a
    # checkpoint keeps it for predict.py, which turns a recording into such windows.
    layout: Layout
    source: str  # the kind of data (data/sources/), e.g. "uci-har" or "synthetic"
    description: str  # the one-line banner printed at start
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
    described: Layout = None  # the description the data was read with (a store's, or --description), or None
    # (shortest, longest) steps of windows of unequal lengths, padded at their end with NaN (an .npz's);
    # None: every window fills its steps.
    own_lengths: tuple = None
    # Lines the reader found worth saying of the data (windows that look padded with zeros), said once a
    # run's log exists.
    warnings: tuple = ()

    @property
    def class_names(self):
        return self.layout.class_names

    @property
    def channel_names(self):
        return self.layout.channels

    @property
    def sample_rate_hz(self):
        return self.layout.sample_rate_hz

    @property
    def preprocessing(self):
        return self.layout.preprocessing

    @property
    def padded(self):
        return self.own_lengths is not None

    def known_as(self):
        """The identities a checkpoint of this data may have recorded: today's, then earlier versions'."""
        return (self.identity, *self.former_identities)

    def sensor_triples(self):
        """Channel indices of each sensor's x/y/z: where the layout places them (a description's sensors and
        axes), else by the names' _x/_y/_z."""
        return self.layout.sensor_triples()


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


def hold_out(train_all, options):
    """(train, val, validation subjects) as `options` (DataOptions) ask: the --val-subjects, which must be
    training subjects and leave at least one to train on, else a random --val-fraction of them; or the end
    of each one's windows (--val-split time, or too few subjects to hold one out)."""
    val_fraction, val_subjects, val_split = options.val_fraction, options.val_subjects, options.val_split
    if _validates_in_time(train_all, val_fraction, val_subjects, val_split):
        is_val = last_part(train_all.subjects, val_fraction)
        if val_fraction > 0 and not is_val.any():
            why = "--val-split time" if val_split == "time" else f"fewer than {MIN_VALIDATION_SUBJECTS} subjects"
            instead = "--val-split subjects, " if val_split == "time" else ""
            raise DataError(f"validation would take the last part of each training subject's windows ({why}), "
                            "and no subject has more than one: nothing is left to validate on; use "
                            f"{instead}--val-subjects, or --val-fraction 0 to train without validation")
        return take(train_all, ~is_val), take(train_all, is_val), np.unique(train_all.subjects[is_val])
    if val_subjects is None:
        val_subjects = hold_out_subjects(train_all.subjects, val_fraction, options.split_seed)
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
    return take(train_all, ~is_val), take(train_all, is_val), val_subjects


def marked_validation(path, train_all, marks, options):
    """(train, val, how validation was chosen) where the file's split array marks 'val' windows: those
    validate, whatever --val-fraction says; a flag that would choose them otherwise is refused."""
    if options.val_subjects is not None or options.val_split != "subjects":
        flag = "--val-subjects" if options.val_subjects is not None else f"--val-split {options.val_split}"
        raise DataError(f"{path}: its split array marks the validation windows ('val'), and {flag} would choose "
                        "others; drop the flag, or the 'val' marks")
    is_val = marks == "val"
    return take(train_all, ~is_val), take(train_all, is_val), "its split array's 'val' windows"


def held_out_for_test(subjects, split=None):
    """([N] bool: the test windows, how they were chosen) of a source that brings no test subjects of its
    own: its split array where it has one, else one person's last fifth, else a fifth of the subjects (a
    fixed draw: runs of other seeds test on the same people)."""
    if split is not None:
        return split == "test", "its split array"
    if len(np.unique(subjects)) == 1:
        return last_part(subjects, NPZ_TEST_FRACTION), "one subject: the last fifth of it tests"
    test_subjects = hold_out_subjects(subjects, NPZ_TEST_FRACTION, NPZ_TEST_SEED)
    return np.isin(subjects, test_subjects), f"test subjects {sorted(int(s) for s in test_subjects)} held out"


def _validates_in_time(train_all, val_fraction, val_subjects, val_split):
    """--val-split time, or fewer than MIN_VALIDATION_SUBJECTS training subjects and no --val-subjects:
    a whole person held out of so few takes too much of what there is to learn from (and one person
    cannot be held out of their own data), so the end of each one's windows validates instead."""
    if val_split == "time":
        return True
    return val_subjects is None and val_fraction > 0 and _few_subjects(train_all)


def _few_subjects(train_all):
    return len(np.unique(train_all.subjects)) < MIN_VALIDATION_SUBJECTS


def validation_words(train_all, val_subjects, val_split):
    """How validation was held out, for the data's one-line description."""
    if len(val_subjects) and (val_split == "time" or _few_subjects(train_all)):
        return "the last part of each training subject's windows"
    return f"subjects {sorted(int(s) for s in val_subjects)}"


def last_part(subjects, fraction):
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


def take(split, mask):
    if isinstance(split, StoreSplit):
        return split.take(mask)
    return Split(split.signals[mask], split.labels[mask], split.subjects[mask])
