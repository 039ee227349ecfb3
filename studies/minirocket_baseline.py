"""The baseline a user would pick instead of this trainer: aeon's MiniRocket features (10,000 random
dilated kernels) and a ridge classifier, on the same windows and the same subject-wise folds.

With --folds K it fits on every other fold's subjects and scores each fold's people, the folds being
those of `main.py --cv-folds K --seed S` on the same data; unless --no-test it also fits on every
training subject and scores the test split. Per person, per fold, the worst person. aeon is a
benchmark-only dependency (pip install aeon), never the trainer's. Its MiniRocket takes series of one
length: windows padded at their end with NaN (unequal lengths) are given to it padded with their
last value instead, as a user of aeon would pad them.
Example: python -m studies.minirocket_baseline --data-dir ../hapt-dev-ucihar --folds 7 --json out.json
Windows of your own (main.py --dataset npz's file, its test split as main.py takes it):
python -m studies.minirocket_baseline --dataset npz --data-dir windows.npz
"""
import statistics
import sys
import time

import numpy as np

from crossval.folds import fold_subjects
from data.sources import load_har_data
from data.splits import Split
from evaluation.metrics import classification_report, per_subject_accuracy
from outputs.safety import check_out_file
from profiling.entry_points import entry_parser, json_file, write_json
from training.entry_point import run_entry_point


def main(argv=None):
    parser = entry_parser("studies.minirocket_baseline", __doc__)
    parser.add_argument("--dataset", default="uci-har", choices=("uci-har", "npz"), help="as main.py --dataset")
    parser.add_argument("--data-dir", required=True, help="a UCI HAR layout, or an .npz of windows (--dataset npz)")
    parser.add_argument("--folds", type=int, default=0, help="K > 1: subject-wise folds of the training subjects")
    parser.add_argument("--seed", type=int, default=42, help="deals the folds, as main.py --seed does")
    parser.add_argument("--kernel-seeds", default="0", help="comma-separated random_state of the kernels")
    parser.add_argument("--mode", default="flatten", help="the channels, as main.py --mode")
    parser.add_argument("--threads", type=int, default=1, help="aeon's n_jobs (-1: every core)")
    parser.add_argument("--no-test", action="store_true")
    parser.add_argument("--json", type=json_file, help="write the figures here")
    opts = parser.parse_args(argv)
    if opts.json:  # an earlier figures file may be replaced; an .npz of windows it reads may not
        check_out_file(opts.json, overwrite=True, reads=(opts.data_dir,), flag="--json")
    try:
        from aeon.classification.convolution_based import MiniRocketClassifier
    except ImportError:
        parser.exit(2, "error: this benchmark needs aeon: pip install aeon\n")
    data = load_har_data(opts.dataset, opts.data_dir, mode=opts.mode, val_fraction=0.0)
    train, test = (Split(last_value_padded(split.signals), split.labels, split.subjects)
                   for split in (data.train, data.test))
    print(f"{data.description}\naeon MiniRocketClassifier (10,000 kernels, ridge with its own alpha search)")
    results = {"data": data.description, "runs": []}
    for kernel_seed in (int(seed) for seed in opts.kernel_seeds.split(",")):
        def score(train_mask, scored, about, kernel_seed=kernel_seed):
            """Fit on the masked training windows, score `scored`: accuracy, macro-F1, each person, seconds."""
            classifier = MiniRocketClassifier(random_state=kernel_seed, n_jobs=opts.threads)
            started = time.perf_counter()
            classifier.fit(train.signals[train_mask].astype(np.float64), train.labels[train_mask])
            predictions = classifier.predict(scored.signals.astype(np.float64))
            report = classification_report(scored.labels, predictions, data.class_names)
            people, worst = per_subject_accuracy(scored.labels, predictions, scored.subjects)
            row = {"kernel_seed": kernel_seed, **about, "accuracy": report["accuracy"], "macro_f1": report["macro_f1"],
                   "per_subject": people, "worst_subject": worst, "seconds": round(time.perf_counter() - started, 1)}
            print(f"kernel seed {kernel_seed}, {about}: accuracy {row['accuracy']:.4f}, macro-F1 "
                  f"{row['macro_f1']:.4f}, worst person {worst} ({people[worst]['accuracy']:.4f}), "
                  f"{row['seconds']} s", flush=True)
            results["runs"].append(row)
            return row

        if opts.folds > 1:
            rows = []
            for fold, subjects in enumerate(fold_subjects(train.subjects, opts.folds, opts.seed)):
                held = np.isin(train.subjects, subjects)
                scored = Split(train.signals[held], train.labels[held], train.subjects[held])
                rows.append(score(~held, scored, {"fold": fold, "subjects": subjects}))
            accuracies = [row["accuracy"] for row in rows]
            people = {subject: figures for row in rows for subject, figures in row["per_subject"].items()}
            worst = min(people, key=lambda subject: people[subject]["accuracy"])
            print(f"kernel seed {kernel_seed}, {opts.folds} folds: mean {statistics.mean(accuracies):.4f} +- "
                  f"{statistics.pstdev(accuracies):.4f}, worst fold {min(accuracies):.4f}, worst person "
                  f"{worst} ({people[worst]['accuracy']:.4f})", flush=True)
        if not opts.no_test:
            score(np.ones(len(train), dtype=bool), test, {"split": "test"})
    write_json(opts.json, results)
    return 0


def last_value_padded(signals):
    """Windows [N, C, T] whose NaN padding (after each one's last step) holds that step's values."""
    lengths = (~np.isnan(signals).any(axis=1)).sum(axis=1)
    if (lengths == signals.shape[2]).all():
        return signals
    filled = signals.copy()
    for window, length in zip(filled, lengths, strict=True):
        window[:, length:] = window[:, length - 1:length]
    return filled


if __name__ == "__main__":
    sys.exit(run_entry_point(main))
