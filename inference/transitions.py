"""A transition matrix for the HMM smoothing, learnt from labelled recordings: how often one
window's activity follows another's at the stride predict.py steps its windows by (docs/using_a_model.md).

  python -m inference.transitions --recordings ../shared/data/hapt-dev/hapt_dev_recordings.npz \\
      --subjects 1,5,6 --out transitions.json

Classes other than UCI HAR's six: --class-names as the checkpoint names them and --class-labels,
each one's value in the label arrays (default 1..K), or --description, the dataset description the
model's data was read by (its classes, label values, window and stride); any other value
(unlabelled stretches, transitions) breaks a sequence, so the windows on either side of it count as
neighbours.
"""
import argparse
import json
import re
import zipfile
from pathlib import Path

import numpy as np

from data.labels import classes_from_flags
from data.layout import read_layout
from data.preprocess import window_starts
from data.uci_har import CLASS_NAMES
from outputs.safety import check_out_file, write_atomic
from training.config.cli import usage_error
from training.entry_point import run_entry_point
from training.errors import UsageError

WINDOW_STEPS = 128  # UCI HAR's windows at 50 Hz
LABEL_KEY = re.compile(r"u(\d+)_s\d+_label")  # person and session of a labelled recording


def window_labels(sample_classes, window_steps, stride_steps):
    """Class index at the centre of each window predict.py would cut (-1 where the centre has none):
    dropped later, so that the activities on either side of a postural transition count as neighbours."""
    starts = window_starts(len(sample_classes), window_steps, stride_steps)
    return np.asarray(sample_classes)[starts + window_steps // 2]


def transition_counts(sequences, classes):
    """[from, to] counts of consecutive classes over sequences of window classes, -1 entries dropped."""
    counts = np.zeros((classes, classes), dtype=np.int64)
    for sequence in sequences:
        kept = np.asarray(sequence)[np.asarray(sequence) >= 0]
        np.add.at(counts, (kept[:-1], kept[1:]), 1)
    return counts


def transition_matrix(counts):
    """Row-stochastic matrix from counts with one added to every cell: no change is ever impossible on
    the strength of a few recordings."""
    smoothed = np.asarray(counts, dtype=np.float64) + 1.0
    return smoothed / smoothed.sum(axis=1, keepdims=True)


def open_recordings(path):
    """A hapt-dev style archive (keys uSS_sK_label: one integer label per sample), refused in one line
    when it is none, so that every reader of it may take its keys and labels as they should be."""
    if not Path(path).is_file():
        raise UsageError(f"--recordings {path} is not a file")
    hint = "give an .npz with uSS_sK_label keys (integer labels, one per sample)"
    try:
        archive = np.load(path, allow_pickle=False)
        labels = {key: archive[key] for key in getattr(archive, "files", ()) if key.endswith("_label")}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):
        raise UsageError(f"--recordings {path} is not a readable .npz archive; {hint}") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise UsageError(f"--recordings {path} holds a single array, not an archive of recordings; {hint}")
    for key, label in labels.items():
        if not LABEL_KEY.fullmatch(key):
            raise UsageError(f"--recordings {path}: key {key} names no person and session; {hint}")
        if not isinstance(label, np.ndarray):  # a zip member that is no .npy
            raise UsageError(f"--recordings {path}: {key} is not an array; {hint}")
        if label.ndim != 1 or not np.issubdtype(label.dtype, np.integer):
            raise UsageError(f"--recordings {path}: {key} holds {label.dtype} of shape {label.shape}; {hint}")
    return archive


def subject_of(label_key):
    """The person of a uSS_sK_label key that open_recordings accepted."""
    return int(LABEL_KEY.fullmatch(label_key).group(1))


UCI_HAR_LABELS = tuple(range(1, len(CLASS_NAMES) + 1))  # the activities' values in a hapt-dev archive


def recording_classes(archive, subjects, class_labels=UCI_HAR_LABELS):
    """{recording name: per-sample class index (-1 for any other value: transitions, unlabelled
    samples)} of the given subjects in an archive open_recordings accepted; class k's label value is
    class_labels[k] (UCI HAR's activities 1..6 by default)."""
    names = sorted(key[:-len("_label")] for key in archive.files if key.endswith("_label")
                   and subject_of(key) in subjects)
    result = {}
    for name in names:
        label = archive[f"{name}_label"].astype(np.int64)
        index = np.full(len(label), -1, dtype=np.int64)
        for k, value in enumerate(class_labels):
            index[label == value] = k
        result[name] = index
    return result


def learn_transitions(sample_class_sequences, window_steps, stride_steps, classes=None):
    """(counts, matrix) over per-sample class sequences (UCI HAR's six classes unless `classes` says)."""
    classes = len(CLASS_NAMES) if classes is None else classes
    sequences = [window_labels(sequence, window_steps, stride_steps)
                 for sequence in sample_class_sequences if len(sequence) >= window_steps]
    counts = transition_counts(sequences, classes)
    return counts, transition_matrix(counts)


def write_transitions(path, counts, class_names, window_steps, stride_steps, about):
    record = {"class_names": list(class_names), "window_steps": int(window_steps), "stride_steps": int(stride_steps),
              "counts": np.asarray(counts).tolist(), "matrix": transition_matrix(counts).tolist(), **about}
    write_atomic(path, lambda partial: Path(partial).write_text(json.dumps(record, indent=2)))


def read_transitions(path, class_names, stride_steps):
    """The matrix of a transitions file, refused in one line unless it is row-stochastic over the
    checkpoint's classes and learnt at the stride the windows are cut at."""
    try:
        record = json.loads(Path(path).read_text())
        matrix = np.asarray(record["matrix"], dtype=np.float64)
        names, stride = tuple(record["class_names"]), int(record["stride_steps"])
    except FileNotFoundError:
        raise UsageError(f"--transitions {path} does not exist") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"--transitions {path} is not a transitions file ({type(exc).__name__}); write one with "
                         "python -m inference.transitions") from None
    if names != tuple(class_names):
        raise UsageError(f"--transitions {path} is over classes {', '.join(names)}; the checkpoint knows "
                         f"{', '.join(class_names)}")
    if matrix.shape != (len(names), len(names)) or not np.isfinite(matrix).all() or (matrix < 0).any() \
            or not np.allclose(matrix.sum(axis=1), 1.0, atol=1e-6):
        raise UsageError(f"--transitions {path}: its matrix is not {len(names)} x {len(names)} with rows of "
                         "non-negative probabilities summing to 1")
    if stride != stride_steps:
        raise UsageError(f"--transitions {path} was learnt at a stride of {stride} samples, the windows here are "
                         f"cut every {stride_steps}: give --stride {stride} or learn it at {stride_steps}")
    return matrix


def main(argv):
    parser = argparse.ArgumentParser(prog="python -m inference.transitions", description=__doc__.splitlines()[0])
    parser.add_argument("--recordings", required=True,
                        help="an .npz with uSS_sK_label keys (labels 1..6 UCI HAR's activities unless --class-labels)")
    parser.add_argument("--description", default=None,
                        help="a dataset description (data/layout.py): its classes, their label values, its "
                             "window and stride, in place of the flags below")
    parser.add_argument("--class-names", default=None,
                        help="the classes, in the checkpoint's order (default UCI HAR's six)")
    parser.add_argument("--class-labels", default=None,
                        help="each class's value in the label arrays, comma-separated (default 1..K)")
    parser.add_argument("--subjects", required=True, help="comma-separated: the training people only")
    parser.add_argument("--window-steps", type=int, default=None, help=f"default {WINDOW_STEPS}")
    parser.add_argument("--stride", type=int, default=None, help="default half a window, as predict.py")
    parser.add_argument("--out", required=True, help="the transitions file to write (never one of the inputs)")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    parser.add_argument("--debug", action="store_true", help="full tracebacks instead of one-line errors")
    parser.error = usage_error(parser.prog)  # one line, like every other bad input
    args = parser.parse_args(argv)
    try:
        subjects = {int(s) for s in args.subjects.split(",")}
    except ValueError:
        raise UsageError(f"--subjects must be numbers separated by commas, got {args.subjects!r}") from None
    class_names, class_labels = _described_classes(args) if args.description else \
        classes_from_flags(args.class_names or ",".join(CLASS_NAMES), args.class_labels)
    args.window_steps = args.window_steps or WINDOW_STEPS
    stride = args.stride or args.window_steps // 2
    if not 1 <= stride <= args.window_steps:
        raise UsageError(f"--stride must be between 1 and --window-steps ({args.window_steps}), got {stride}")
    check_out_file(args.out, args.overwrite, reads=[path for path in (args.recordings, args.description) if path])
    classes = recording_classes(open_recordings(args.recordings), subjects, class_labels)
    if not classes:
        raise UsageError(f"{args.recordings} holds no labelled recording (uSS_sK_label) of subjects "
                         f"{', '.join(map(str, sorted(subjects)))}")
    counts, matrix = learn_transitions(classes.values(), args.window_steps, stride, len(class_names))
    if not counts.sum():  # the matrix would be the +1 smoothing alone: uniform, learnt from nothing
        raise UsageError(f"the {len(classes)} recordings of subjects {', '.join(map(str, sorted(subjects)))} hold "
                         f"no two consecutive windows of classes labelled {', '.join(map(str, class_labels))} "
                         f"(too short, or unlabelled): nothing was learnt and {args.out} was not written; give more "
                         "people or longer recordings")
    write_transitions(args.out, counts, class_names, args.window_steps, stride,
                      {"recordings": str(args.recordings), "subjects": sorted(subjects)})
    print(f"{len(classes)} recordings, {int(counts.sum())} window pairs; wrote {args.out}")
    print(np.array2string(matrix, precision=4, suppress_small=True))
    return 0


def _described_classes(args):
    """(class names, their label values) of --description, whose window and stride stand where the flags
    leave them; the class flags beside it are refused rather than weighed against it."""
    if args.class_names or args.class_labels:
        raise UsageError("--description gives the classes and their label values: drop --class-names and "
                         "--class-labels")
    described = read_layout(args.description)
    if not described.labels_are_numbers():
        raise UsageError(f"{described.where}: 'classes' must give whole-number labels, as the recordings' label "
                         "arrays hold")
    args.window_steps = args.window_steps or described.window_steps
    args.stride = args.stride or described.stride_steps
    return list(described.class_names), list(described.class_labels)


if __name__ == "__main__":
    raise SystemExit(run_entry_point(main))
