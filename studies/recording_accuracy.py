"""Per-sample accuracy and calibration of predict.py's recording path on labelled continuous recordings,
per person, for each option predict.py offers new people.

Each recording (keys uSS_sK_acc / _gyro / _label, 50 Hz, acc in g) goes through the same
functions as predict.py; every sample labelled 1..6 is scored against the window that speaks
for it. Transitions (7..12) and unlabelled samples (0) are left out. --as-rate first resamples
each recording to another rate, as if the phone had recorded at it, so that predict.py has to
bring it back to the model's rate.

The options: MiniRocket's features standardised with the training statistics or the recording's
own (--adapt recording); temperature 1 or the one fitted on the run's validation split (read from
the checkpoint's --data-dir when it is there); no smoothing, the running median, the HMM with its
fixed switch probability, or the HMM through a matrix learnt from the recordings of the people the
run trained on (every person of the archive not held out); and the median path with the windows
below a threshold chosen on the validation windows marked uncertain (counted as not right). The
expected calibration error (15 bins) is over scored samples, each with its window's probabilities.

With --nested, every finished outer fold of a studies.nested_cv configuration: its best.pt, its
held-out people (nested_identity.json) and its windows' .npz; a folder not named as nested_cv names
an outer fold (outer-<k>: a copy such as outer-2.bak beside them) is skipped, said in one line.
Development data only: nothing in the tests needs it.
"""
import json
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np

from data.recordings import Recording
from data.resample import resample
from evaluation.calibration import fit_temperature, scaled
from evaluation.recording_scores import RecordingTally, uncertain_threshold
from inference.adaptation import (
    adaptable_members,
    check_recording_windows,
    member_probabilities,
    raw_features,
)
from inference.bundle import load_bundle, pick_device, probabilities
from inference.classify import recording_windows
from inference.evaluate import splits_as_trained
from inference.outputs import check_out_file
from inference.timeline import labels_at, smooth_labels
from inference.transitions import learn_transitions, open_recordings, recording_classes, recording_subjects, subject_of
from profiling.entry_points import entry_parser, positive, write_json
from studies import outer_fold_dirs
from training.entry_point import run_entry_point
from training.errors import UsageError

RECORDING_RATE_HZ = 50.0
SMOOTHINGS = ("none", "median", "hmm", "hmm-learnt", "hmm-learnt-stay")
IDENTITY = "nested_identity.json"


class FoldFits(NamedTuple):
    """What a fold learnt or fitted on its own people, per feature mode where it differs."""
    temperatures: dict
    transitions: np.ndarray  # learnt from the recordings of the people the fold trained on
    thresholds: dict  # uncertain below, chosen on the validation windows


class Scorer:
    """Probabilities of windows under each choice of feature statistics, from one feature pass."""

    def __init__(self, bundle, device):
        self.bundle, self.device = bundle, device
        try:
            self.members = adaptable_members(bundle)
        except UsageError:  # not MiniRocket: only the training statistics
            self.members = None
        self.feature_modes = ("train", "recording", "balanced") if self.members else ("train",)

    def features(self, windows):
        """Each member's PPV features [N, F] of MiniRocket windows: the transform the modes share."""
        return [raw_features(member, windows, self.device) for member in self.members]

    def per_mode(self, windows, groups=None, features=None, name_of=lambda group: f"group {group}"):
        """{feature mode: probabilities [N, classes]}; "recording" standardises each group on its own.
        `features`: the windows' features (self.features) when they were computed already; `name_of`
        a group's name, for the line that refuses one of too few windows."""
        if self.members is None:
            return {"train": probabilities(self.bundle, windows, self.device)}
        features = self.features(windows) if features is None else features
        groups = np.zeros(len(features[0])) if groups is None else np.asarray(groups)
        result = {"train": member_probabilities(self.members, features, adapt=False)}
        for mode, adapt in (("recording", True), ("balanced", "balanced")):
            adapted = np.zeros_like(result["train"])
            for group in np.unique(groups):
                where = np.flatnonzero(groups == group)
                adapted[where] = member_probabilities(self.members, [f[where] for f in features], adapt=adapt,
                                                      group=name_of(group))
            result[mode] = adapted
        return result


def score_fold(bundle, archive, held_out, device, as_rate, tally, windows_tally):
    """Tally every option on the held-out people's recordings; returns what was learnt or fitted on
    the run's own people (temperatures, threshold, transition counts)."""
    scorer = Scorer(bundle, device)
    trained_on = sorted(set(recording_subjects(archive)) - held_out)
    counts, learnt = learn_transitions(recording_classes(archive, set(trained_on)).values(), bundle.window_steps,
                                       bundle.window_steps // 2, len(bundle.class_names))
    fitted = {"transitions_from": trained_on, "transition_counts": counts.tolist(), "transitions": learnt.tolist()}
    temperatures, thresholds = dict.fromkeys(scorer.feature_modes, 1.0), {}
    # The splits the run trained and validated on, when its data is on this machine.
    data_dir, dataset = bundle.config.data.data_dir, bundle.config.data.dataset
    if data_dir is not None and Path(data_dir).exists():
        if dataset == "auto":
            dataset = "npz" if str(data_dir).endswith(".npz") else "uci-har"
        data = splits_as_trained(bundle.config, dataset, data_dir)
        if len(data.val):
            val = scorer.per_mode(data.val.signals, data.val.subjects,
                                  name_of=lambda s: f"person {s}'s validation windows")
            labels = np.asarray(data.val.labels)
            temperatures = {mode: fit_temperature(val[mode], labels) for mode in val}
            thresholds = {mode: uncertain_threshold(scaled(val[mode], temperatures[mode]), labels) for mode in val}
            fitted.update(val_subjects=sorted(int(s) for s in np.unique(data.val.subjects)), val_windows=len(data.val))
            _tally_windows(scorer, data.test, temperatures, windows_tally)
    fitted.update(temperatures=temperatures, uncertain_below=thresholds)
    for name, classes in recording_classes(archive, held_out).items():
        _tally_recording(scorer, archive, name, classes, as_rate, FoldFits(temperatures, learnt, thresholds), tally)
    return fitted


def _tally_windows(scorer, test, temperatures, tally):
    """The fold's test windows (its held-out people) as predict.py --data-dir scores them."""
    subjects, labels = np.asarray(test.subjects), np.asarray(test.labels)
    features = scorer.features(test.signals) if scorer.members else None  # one transform for every grouping
    modes = scorer.per_mode(test.signals, subjects, features, name_of=lambda s: f"person {s}'s test windows")
    if "recording" in modes:  # on windows, a person's windows are the group
        modes["subject"] = modes.pop("recording")
    for mode, probs in modes.items():
        temperature = temperatures["recording" if mode == "subject" else mode]
        for option, tempered in ((f"{mode} statistics, T=1", scaled(probs, 1.0)),
                                 (f"{mode} statistics, T=fit", scaled(probs, temperature))):
            for subject in np.unique(subjects):
                mine = subjects == subject
                tally.add(option, int(subject), tempered[mine].argmax(axis=1), labels[mine])
                tally.add_calibration(option, int(subject), tempered[mine], labels[mine])
    if scorer.members:
        # What standardising on a group of a single activity does (a recording of one activity).
        names = scorer.bundle.class_names
        alone = scorer.per_mode(test.signals, subjects * 100 + labels, features,
                                name_of=lambda g: f"person {g // 100}'s test windows of {names[g % 100]}")["recording"]
        for subject in np.unique(subjects):
            mine = subjects == subject
            tally.add("subject statistics of one activity's windows at a time", int(subject),
                      alone[mine].argmax(axis=1), labels[mine])
        _tally_dominated(scorer, test, features, tally)


def _tally_dominated(scorer, test, features, tally):
    """A day is mostly one activity: each person's windows of one class with a tenth of the others'
    (drawn with a fixed seed), under both statistics, for every class in turn."""
    subjects, labels = np.asarray(test.subjects), np.asarray(test.labels)
    draw = np.random.default_rng(0)
    for subject in np.unique(subjects):
        mine = np.flatnonzero(subjects == subject)
        for activity in np.unique(labels[mine]):
            others = mine[labels[mine] != activity]
            group = np.concatenate([mine[labels[mine] == activity],
                                    draw.choice(others, size=len(others) // 10, replace=False)])
            name = f"person {subject}'s test windows, {scorer.bundle.class_names[activity]} dominant"
            for mode, probs in scorer.per_mode(None, features=[f[group] for f in features],
                                               name_of=lambda _, name=name: name).items():
                tally.add(f"{'subject' if mode == 'recording' else mode} statistics, one activity dominant",
                          int(subject), probs.argmax(axis=1), labels[group])


def stay_only(learnt):
    """The learnt chance of staying in each class, with the changes spread evenly over the others:
    how sticky each activity is, without the order of activities the recordings followed."""
    classes = len(learnt)
    matrix = np.repeat(((1 - np.diag(learnt)) / (classes - 1))[:, None], classes, axis=1)
    np.fill_diagonal(matrix, np.diag(learnt))
    return matrix


def _tally_recording(scorer, archive, name, classes, as_rate, fits, tally):
    """One recording's samples of classes 0..5 (`classes`, -1 elsewhere), each scored by its window."""
    acc, gyro = (resample(archive[f"{name}_{sensor}"].astype(np.float64), RECORDING_RATE_HZ, as_rate)
                 for sensor in ("acc", "gyro"))
    bundle = scorer.bundle
    cut = recording_windows(bundle, Recording(acc, gyro, None, name), sample_rate_hz=as_rate)
    start_s = cut.start_s + cut.start_steps / bundle.sample_rate_hz
    window_of = labels_at(np.arange(len(classes)) / RECORDING_RATE_HZ, np.arange(len(start_s)), start_s,
                          start_s + bundle.window_steps / bundle.sample_rate_hz)
    scored = (classes >= 0) & (window_of >= 0)
    at, truth, person = window_of[scored], classes[scored], subject_of(f"{name}_label")
    matrices = {"hmm-learnt": fits.transitions, "hmm-learnt-stay": stay_only(fits.transitions)}
    if scorer.members:  # as predict.py --adapt recording judges a recording's length
        check_recording_windows(len(cut.windows), f"recording {name} of --recordings",
                                "predict.py --adapt refuses one that short too: leave it out of the archive")
    for mode, probs in scorer.per_mode(cut.windows, name_of=lambda _: f"recording {name}").items():
        prefix, paths = f"{mode} statistics", {}
        # As predict.py: the smoothers read the model's own probabilities; the temperature scales
        # what is reported (the confidence, and the threshold for uncertain windows).
        for smoothing in SMOOTHINGS:
            method = None if smoothing == "none" else "hmm" if smoothing.startswith("hmm") else smoothing
            paths[smoothing] = smooth_labels(probs, method, transitions=matrices.get(smoothing))
            tally.add(f"{prefix}, {smoothing}", person, paths[smoothing][at], truth)
        tempered = scaled(probs, fits.temperatures[mode])
        tally.add_calibration(f"{prefix}, T=1", person, scaled(probs, 1.0)[at], truth)
        tally.add_calibration(f"{prefix}, T=fit", person, tempered[at], truth)
        unsure = tempered.max(axis=1)[at] < (fits.thresholds.get(mode) or 0.0)  # no threshold chosen: nothing marked
        tally.add(f"{prefix}, median, uncertain below the validation threshold", person, paths["median"][at],
                  truth, unsure)
        # For the record: the HMM on tempered probabilities, which a temperature below 1 makes less sticky.
        tally.add(f"{prefix}, hmm on T=fit probabilities", person, smooth_labels(tempered, "hmm")[at], truth)


def folds_of(nested_dir):
    """[(best.pt, held-out people)] of every finished outer fold: the outer-k folders that hold
    nested_identity.json and best.pt, by k (studies.outer_fold_dirs skips a folder named otherwise)."""
    folds = [(run_dir / "best.pt", _held_out(run_dir / IDENTITY))
             for run_dir in outer_fold_dirs(nested_dir, IDENTITY, "best.pt")]
    if not folds:
        raise UsageError(f"{nested_dir} holds no finished outer fold (outer-<k>/nested_identity.json); point --nested "
                         "at a studies.nested_cv configuration")
    return folds


def _held_out(identity):
    try:
        subjects = json.loads(identity.read_text())["inputs"]["subjects"]
        return [int(subject) for subject in subjects]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"{identity} is damaged ({type(exc).__name__}: {exc}); run studies.nested_cv again for "
                         "that outer fold, or remove its folder") from None


def check_signals(archive, path):
    """Every labelled recording has its acc and gyro: [samples, 3] numbers, as many samples as labels."""
    for key in (key for key in archive.files if key.endswith("_label")):
        samples = len(archive[key])
        for sensor in ("acc", "gyro"):
            name = key[:-len("label")] + sensor
            values = archive[name] if name in archive.files else None
            if not isinstance(values, np.ndarray) or values.shape != (samples, 3) \
                    or not np.issubdtype(values.dtype, np.number):
                found = f"{values.dtype} of shape {values.shape}" if isinstance(values, np.ndarray) else "nothing"
                raise UsageError(f"--recordings {path}: {name} should be {samples} x 3 numbers (one row per label), "
                                 f"found {found}")


def print_table(title, tally):
    print(title)
    print(f"{'option':<64} {'mean':>6} {'worst':>10} {'spread':>6} {'ECE':>6} {'marked':>7}")
    for option in sorted(tally.samples):
        row = tally.summary(option)
        ece = f"{row['ece']:6.4f}" if "ece" in row else ""
        marked = f"{row['uncertain_share']:7.2%} (kept {row['kept_accuracy']:.4f}, uncertain wrong " \
                 f"{row['wrong_among_uncertain']:.0%})" if "uncertain_share" in row else ""
        print(f"{option:<64} {row['mean']:6.4f} {row['worst']:.4f} ({row['worst_person']:>2}) {row['spread']:6.4f} "
              f"{ece:>6} {marked}")
    for option in sorted(set(tally.calibration) - set(tally.samples)):
        row = tally.calibration_summary(option)
        print(f"{option + ' (calibration)':<64} {'':>6} {'':>10} {'':>6} {row['ece']:6.4f}  worst person "
              f"{row['ece_worst_person']} {row['ece_worst']:.4f}")


def main(argv=None):
    parser = entry_parser("studies.recording_accuracy", __doc__)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint")
    source.add_argument("--nested", help="a configuration folder of studies.nested_cv: every finished outer fold")
    parser.add_argument("--recordings", default="../shared/data/hapt-dev/hapt_dev_recordings.npz")
    parser.add_argument("--subjects", default="3,7,15,21,26,29", help="held out of training (with --checkpoint)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--as-rate", type=positive, default=RECORDING_RATE_HZ, metavar="HZ")
    parser.add_argument("--json", default=None, help="write every figure here")
    args = parser.parse_args(argv)
    device = pick_device(args.device)
    folds = folds_of(args.nested) if args.nested else [(Path(args.checkpoint), _subject_list(args.subjects))]
    if not Path(args.recordings).is_file():
        raise UsageError(f"--recordings {args.recordings} does not exist; point it at hapt_dev_recordings.npz "
                         "(the development recordings, not needed by the tests)")
    if args.json:
        check_out_file(args.json, True, reads=[args.recordings, args.checkpoint], flag="--json")
    archive = open_recordings(args.recordings)
    check_signals(archive, args.recordings)
    tally, windows_tally, fitted = RecordingTally(), RecordingTally(), {}
    for checkpoint, held_out in folds:
        about = fitted[str(checkpoint)] = {"held_out": held_out, **score_fold(
            load_bundle(checkpoint), archive, set(held_out), device, args.as_rate, tally, windows_tally)}
        print(f"{checkpoint}: held out {held_out}; temperatures {about['temperatures']}, uncertain below "
              f"{about['uncertain_below']}", flush=True)
    print_table(f"recordings given at {args.as_rate:g} Hz, per-sample accuracy over samples labelled 1..6 "
                "(mean and worst over people)", tally)
    if windows_tally.samples:
        print_table("the folds' test windows (predict.py --data-dir)", windows_tally)
    write_json(args.json, {
        "recordings": {option: tally.summary(option) for option in sorted(tally.samples)},
        "calibration": {option: tally.calibration_summary(option) for option in sorted(tally.calibration)},
        "windows": {option: windows_tally.summary(option) for option in sorted(windows_tally.samples)},
        "fitted": fitted})


def _subject_list(text):
    try:
        return [int(subject) for subject in text.split(",")]
    except ValueError:
        raise UsageError(f"--subjects must be numbers separated by commas, got {text!r}") from None


if __name__ == "__main__":
    sys.exit(run_entry_point(main))
