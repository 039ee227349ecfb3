"""What --grad-compression costs in accuracy on new people: subject-wise cross-validation where every
fold is a DDP run, once per compression, on the same folds (those of --cv-folds K --seed S).

Each fold trains with `main_multi_gpu.py --multi-gpu ddp --nproc-per-node N` on the other folds'
subjects and is judged on its own (`--val-subjects`, `--no-test`); the table gives, per compression,
the mean and spread over folds and the worst fold, by the best epoch and by the last one.
Example: python -m studies.compression_accuracy --data-dir ../hapt-all21 --out runs/compression
"""
import json
import statistics
import sys
from pathlib import Path

import numpy as np

from benchmarks import at_least, entry_parser, run_in_repo
from crossval.folds import fold_subjects
from data.splits import load_har_data
from training.errors import run_entry_point


def main(argv=None):
    parser = entry_parser("studies.compression_accuracy", __doc__)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--out", required=True, help="one folder per compression and fold; results.json")
    parser.add_argument("--folds", type=int, default=7)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--ranks", type=at_least(1), default=2)
    parser.add_argument("--compressions", default="none,fp16")
    parser.add_argument("flags", nargs="*", help="more training flags, after --")
    opts = parser.parse_args(argv)
    data = load_har_data("uci-har", opts.data_dir)
    folds = fold_subjects(np.concatenate([data.train.subjects, data.val.subjects]), opts.folds, opts.seed)
    results = {}
    for compression in opts.compressions.split(","):
        rows = results[compression] = [_fold(opts, compression, fold, subjects) for fold, subjects in enumerate(folds)]
        accuracies = [row["accuracy"] for row in rows]
        worst = min(rows, key=lambda row: row["accuracy"])
        print(f"{compression}: accuracy {statistics.mean(accuracies):.4f} +- {statistics.pstdev(accuracies):.4f}, "
              f"macro-F1 {statistics.mean(row['macro_f1'] for row in rows):.4f}, worst fold {worst['accuracy']:.4f} "
              f"(subjects {worst['subjects']}), last epoch "
              f"{statistics.mean(row['last_epoch_accuracy'] for row in rows):.4f}",
              flush=True)
    Path(opts.out, "results.json").write_text(json.dumps({"folds": folds, "results": results}, indent=2))
    for compression, rows in results.items():
        if results.get("none") and compression != "none":
            gaps = [row["accuracy"] - base["accuracy"] for row, base in zip(rows, results["none"], strict=True)]
            print(f"{compression} - none: mean {statistics.mean(gaps):+.4f}, per fold "
                  + ", ".join(f"{gap:+.4f}" for gap in gaps))
    return 0


def _fold(opts, compression, index, subjects):
    save_dir = Path(opts.out) / compression / f"fold-{index}"
    command = [sys.executable, "main_multi_gpu.py", "--multi-gpu", "ddp", "--nproc-per-node", str(opts.ranks),
               "--device", "cpu", "--dataset", "uci-har", "--data-dir", opts.data_dir, "--no-test",
               "--seed", str(opts.seed), "--val-subjects", ",".join(map(str, subjects)),
               "--grad-compression", compression, "--save-dir", str(save_dir), *opts.flags]
    if not (save_dir / "val_report.json").is_file():  # a finished fold is not run again
        run_in_repo(command)
    report = json.loads((save_dir / "val_report.json").read_text())
    records = [json.loads(line) for line in (save_dir / "metrics.jsonl").read_text().splitlines() if line]
    return {"fold": index, "subjects": subjects, "accuracy": report["accuracy"], "macro_f1": report["macro_f1"],
            "last_epoch_accuracy": records[-1]["val_acc"]}


if __name__ == "__main__":
    sys.exit(run_entry_point(main))
