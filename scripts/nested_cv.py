"""An honest estimate on new people: nested subject-wise evaluation of one training command.

The outer folds deal every training subject of --data-dir into K groups (as `--cv-folds K --seed S`
would). For each outer fold, the other subjects' windows become the training split of an .npz and
the fold's own people its test split, and `main.py --dataset npz` runs on it with the flags given
after `--`: whatever those flags choose inside (a validation split, inner --cv-folds, an
--ensemble) never sees the outer fold's people. The run's test_report.json is then the outer score:
a single model's, or the ensemble's with --cv-folds --ensemble.

  python -m scripts.nested_cv --data-dir ../hapt-all21 --out runs/nested --name default
  python -m scripts.nested_cv --data-dir ../hapt-all21 --out runs/nested --name ensemble -- --cv-folds 5 --ensemble
  python -m scripts.nested_cv --out runs/nested --summary

With --nproc-per-node N each outer fold's command runs under torchrun as N ranks
(main_multi_gpu.py --multi-gpu ddp): inner folds (and the refit) then train one per rank, with the
results of a sequential run, on N GPUs or N CPU cores. --outer-only 5,2 trains only those outer
folds (one job each on a cluster, say); the report covers every outer fold finished so far and
says how many of all those are.

Each configuration's nested_report.json holds per outer fold its subjects, accuracy and macro-F1,
every person's accuracy, the mean, the worst fold and the worst person. The same command again
continues where a killed one stopped (finished outer folds are kept).
"""
import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from crossval.folds import fold_subjects  # noqa: E402
from data.splits import load_har_data  # noqa: E402

REPORT = "nested_report.json"


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    flags = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(prog="python -m scripts.nested_cv", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", help="a UCI HAR layout; its training subjects are dealt into outer folds")
    parser.add_argument("--out", required=True, help="windows/ (the outer folds' .npz files) and one folder per --name")
    parser.add_argument("--name", help="this configuration's folder under --out")
    parser.add_argument("--outer-folds", type=int, default=7)
    parser.add_argument("--seed", type=int, default=42, help="deals the outer folds")
    parser.add_argument("--nproc-per-node", type=int, default=1,
                        help="ranks per outer fold's run (torchrun); inner folds train one per rank")
    parser.add_argument("--outer-only", type=_fold_list, default=None,
                        help="comma-separated outer folds (from 0) to train now; the others are left as they are")
    parser.add_argument("--summary", action="store_true", help="print every configuration's figures and stop")
    opts = parser.parse_args(argv)
    out = Path(opts.out)
    if opts.summary:
        print(format_summary(out))
        return 0
    if not (opts.data_dir and opts.name):
        parser.error("--data-dir and --name are needed to run a configuration")
    files = write_outer_folds(opts.data_dir, out / "windows", opts.outer_folds, opts.seed)
    config_dir = out / opts.name
    config_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for fold, (path, subjects) in enumerate(files):
        run_dir = config_dir / f"outer-{fold}"
        report_path = run_dir / "test_report.json"
        if not report_path.is_file():
            if opts.outer_only is not None and fold not in opts.outer_only:
                continue
            started = time.perf_counter()
            command = outer_command(path, run_dir, flags, opts.nproc_per_node)
            print(f"outer fold {fold + 1}/{len(files)} (people {subjects}): {' '.join(command[1:])}", flush=True)
            with open(config_dir / f"outer-{fold}.log", "w") as log:
                code = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
            if code != 0 or not report_path.is_file():
                print(f"outer fold {fold + 1} failed (exit {code}); see {config_dir / f'outer-{fold}.log'}")
                return 1
            (run_dir / "wall_s.txt").write_text(f"{time.perf_counter() - started:.0f}\n")
        report = json.loads(report_path.read_text())
        rows.append({"fold": fold, "subjects": subjects, "accuracy": report["accuracy"],
                     "macro_f1": report["macro_f1"], "per_subject": report["per_subject"],
                     "wall_s": float((run_dir / "wall_s.txt").read_text()) if (run_dir / "wall_s.txt").is_file()
                     else None})
    if not rows:
        print("no outer fold finished yet")
        return 0
    summary = summarise(rows, flags, len(files))
    (config_dir / REPORT).write_text(json.dumps(summary, indent=2))
    print(format_summary(out, only=opts.name))
    return 0


def outer_command(path, run_dir, flags, nproc_per_node=1):
    """The training command of one outer fold: main.py, or N ranks of main_multi_gpu.py under torchrun."""
    launch = [sys.executable, str(REPO / "main.py")]
    if nproc_per_node > 1:
        launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc_per_node}",
                  str(REPO / "main_multi_gpu.py"), "--multi-gpu", "ddp"]
    return [*launch, "--dataset", "npz", "--data-dir", str(path), "--save-dir", str(run_dir), *flags]


def write_outer_folds(data_dir, folder, folds, seed):
    """One .npz per outer fold (its people as the test split, everyone else's windows as training),
    written once; returns [(path, subjects)]."""
    data = load_har_data("uci-har", data_dir, val_fraction=0.0)
    train = data.train  # the dataset's own test split is not used: the outer folds are the test
    groups = fold_subjects(train.subjects, folds, seed)
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for fold, subjects in enumerate(groups):
        path = folder / f"outer-{fold}-seed-{seed}-of-{folds}.npz"
        if not path.is_file():
            split = np.where(np.isin(train.subjects, subjects), "test", "train")
            np.savez(path, signals=train.signals, labels=train.labels, subjects=train.subjects, split=split,
                     class_names=np.array(data.class_names), channel_names=np.array(data.channel_names),
                     sample_rate_hz=data.sample_rate_hz)
        files.append((path, subjects))
    return files


def _fold_list(text):
    try:
        return {int(part) for part in text.split(",") if part.strip()}
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated outer fold numbers, got {text!r}") from None


def summarise(rows, flags, outer_folds=None):
    people = {subject: figures for row in rows for subject, figures in row["per_subject"].items()}
    worst_fold = min(rows, key=lambda row: row["accuracy"])
    worst_person = min(people, key=lambda subject: people[subject]["accuracy"])
    accuracies = [figures["accuracy"] for figures in people.values()]
    return {"flags": flags, "folds": rows, "outer_folds": outer_folds or len(rows),  # of which `folds` finished
            "mean": {"accuracy": statistics.mean(row["accuracy"] for row in rows),
                     "macro_f1": statistics.mean(row["macro_f1"] for row in rows)},
            "worst_fold": {"fold": worst_fold["fold"], "accuracy": worst_fold["accuracy"],
                           "macro_f1": worst_fold["macro_f1"]},
            "worst_person": {"subject": worst_person, "accuracy": people[worst_person]["accuracy"]},
            "people": {"median": statistics.median(accuracies), "below_0.9": sum(a < 0.9 for a in accuracies)}}


def format_summary(out, only=None):
    lines = [f"{'configuration':<22} {'outer mean':>10} {'macro-F1':>8} {'worst fold':>10} {'worst person':>15} "
             f"{'median person':>13}  flags"]
    for report_path in sorted(Path(out).glob(f"{only or '*'}/{REPORT}")):
        summary = json.loads(report_path.read_text())
        worst = summary["worst_person"]
        name, finished = report_path.parent.name, len(summary["folds"])
        if finished < summary.get("outer_folds", finished):
            name += f" ({finished} of {summary['outer_folds']})"
        lines.append(f"{name:<22} {summary['mean']['accuracy']:>10.4f} "
                     f"{summary['mean']['macro_f1']:>8.4f} {summary['worst_fold']['accuracy']:>10.4f} "
                     f"{worst['accuracy']:>8.4f} ({worst['subject']:>3}) {summary['people']['median']:>13.4f}  "
                     f"{' '.join(summary['flags']) or '(defaults)'}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
