"""An honest estimate on new people: nested subject-wise evaluation of one training command.

The outer folds deal every training subject of --data-dir into K groups (as `--cv-folds K --seed S`
would). For each outer fold, the other subjects' windows become the training split of an .npz and
the fold's own people its test split, and `main.py --dataset npz` runs on it with the flags given
after `--`: whatever those flags choose inside (a validation split, inner --cv-folds, an
--ensemble) never sees the outer fold's people. The run's test_report.json is then the outer score:
a single model's, or the ensemble's with --cv-folds --ensemble.

  python -m studies.nested_cv --data-dir ../hapt-all21 --out runs/nested --name default
  python -m studies.nested_cv --data-dir ../hapt-all21 --out runs/nested --name ensemble -- --cv-folds 5 --ensemble
  python -m studies.nested_cv --out runs/nested --summary

With --nproc-per-node N each outer fold's command runs under torchrun as N ranks
(main_multi_gpu.py --multi-gpu ddp): inner folds (and the refit) then train one per rank, with the
results of a sequential run, on N GPUs or N CPU cores. --outer-only 5,2 trains only those outer
folds (one job each on a cluster, say); the report covers every outer fold finished so far and
says how many of all those are.

A re-run reuses what matches (data/provenance.py): an outer fold's windows are rewritten when
--data-dir's files, --seed or --outer-folds changed; a finished outer fold is kept only when its
flags and the making of its windows are those of now, else the command is refused (--name names
one configuration: give another --name); a finished outer fold whose report changed since is
trained again, alone.

Each configuration's nested_report.json holds per outer fold its subjects, accuracy and macro-F1,
every person's accuracy, the mean, the worst fold and the worst person. The same command again
continues where a killed one stopped (finished outer folds are kept) and rewrites that report;
--summary refuses a damaged one in one line, naming the --name that rewrites it.
"""
import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from crossval.folds import fold_subjects
from data import uci_har
from data.errors import DataError
from data.provenance import check, file_identity, make_record, read_record, write_record
from data.sources import load_har_data
from outputs.safety import check_output_folder
from profiling.entry_points import REPO, entry_parser
from training.config.checks import check_at_least
from training.config.cli import parse_config
from training.entry_point import run_entry_point
from training.errors import UsageError

REPORT = "nested_report.json"
IDENTITY = "nested_identity.json"  # in each outer fold's folder once it reported: its flags and windows
WALL = "wall_s.txt"  # beside it: the seconds the outer fold took to train
OWN_FLAGS = ("--dataset", "--data-dir", "--save-dir", "--resume")
FOLD_FIGURES = ("accuracy", "macro_f1", "per_subject")  # what the report keeps of an outer fold's test report


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    flags = argv[cut + 1:]
    opts = parse(argv[:cut], flags)
    out = Path(opts.out)
    if opts.summary:
        print(format_summary(out))
        return 0
    files = write_outer_folds(opts.data_dir, out / "windows", opts.outer_folds, opts.seed)
    config_dir = out / opts.name
    runs = [(fold, path, subjects, config_dir / f"outer-{fold}") for fold, (path, subjects) in enumerate(files)]
    inputs = {fold: outer_inputs(path, subjects, flags) for fold, path, subjects, _ in runs}
    verdicts = {fold: check(read_record(run_dir / IDENTITY), inputs[fold], run_dir) for fold, _, _, run_dir in runs}
    for fold, verdict in verdicts.items():  # every outer fold checked before any trains
        if verdict.changed:
            raise UsageError(f"{config_dir / f'outer-{fold}'} was trained with other flags or windows "
                             f"({verdict.describe(limit=2)}); --name {opts.name} names that configuration: give "
                             f"this one another --name, or remove {config_dir} to start it over")
    config_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for fold, path, subjects, run_dir in runs:
        report_path, verdict = run_dir / "test_report.json", verdicts[fold]
        if not verdict.matches:
            if opts.outer_only is not None and fold not in opts.outer_only:
                continue
            if verdict.damaged:  # finished once, its report changed since: that outer fold alone again
                print(f"outer fold {fold + 1}: {verdict.describe()}; training it again from the start", flush=True)
                shutil.rmtree(run_dir)
            if not train_outer_fold(fold, len(files), path, subjects, run_dir, flags, opts.nproc_per_node):
                return 1
            write_record(run_dir / IDENTITY, make_record(inputs[fold], run_dir, [report_path.name]))
        report = json.loads(report_path.read_text())
        rows.append({"fold": fold, "subjects": subjects, **{key: report[key] for key in FOLD_FIGURES},
                     "wall_s": wall_seconds(run_dir / WALL)})
    if not rows:
        print("no outer fold finished yet")
        return 0
    (config_dir / REPORT).write_text(json.dumps(summarise(rows, flags, len(files)), indent=2))
    print(format_summary(out, only=opts.name))
    return 0


def parse(argv, flags):
    """The script's own options and the training flags after `--`, each checked before any window is
    written; a bad one is a UsageError (one line, exit 2)."""
    parser = entry_parser("studies.nested_cv", __doc__)
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
    parser.add_argument("--debug", action="store_true", help="show full tracebacks instead of one-line errors")
    opts = parser.parse_args(argv)
    check_output_folder(opts.out, "--out")
    if opts.summary:
        return opts
    if not (opts.data_dir and opts.name):
        raise UsageError("--data-dir and --name are needed to run a configuration (or --summary to print them)")
    if opts.name in (".", "..") or Path(opts.name).name != opts.name:
        raise UsageError(f"--name {opts.name!r} must be a plain folder name under --out, without '/'")
    check_at_least(("--outer-folds", opts.outer_folds, 2), ("--nproc-per-node", opts.nproc_per_node, 1))
    outside = sorted(fold for fold in opts.outer_only or () if not 0 <= fold < opts.outer_folds)
    if outside:
        raise UsageError(f"--outer-only {outside[0]} is not an outer fold: they are 0..{opts.outer_folds - 1}")
    taken = [flag for flag in flags for own in OWN_FLAGS if flag == own or flag.startswith(own + "=")]
    if taken:
        raise UsageError(f"{taken[0]} after -- would replace what each outer fold sets itself "
                         f"({', '.join(OWN_FLAGS)}); drop it")
    command = outer_command(Path("outer.npz"), Path("outer"), flags, opts.nproc_per_node)
    script = next(index for index, part in enumerate(command) if part.endswith(".py"))
    try:  # as main.py would take them
        parse_config(command[script + 1:], multi_gpu=opts.nproc_per_node > 1)
    except UsageError as exc:
        raise UsageError(f"the training flags after --: {exc}") from None
    return opts


def _fold_list(text):
    try:
        return {int(part) for part in text.split(",") if part.strip()}
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated outer fold numbers, got {text!r}") from None


def train_outer_fold(fold, folds, path, subjects, run_dir, flags, nproc_per_node):
    """One outer fold's training command, its output in <name>/outer-k.log; True once it reported."""
    started = time.perf_counter()
    command = outer_command(path, run_dir, flags, nproc_per_node)
    print(f"outer fold {fold + 1}/{folds} (people {subjects}): {' '.join(command[1:])}", flush=True)
    log_path = run_dir.parent / f"outer-{fold}.log"
    with open(log_path, "w") as log:
        code = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    if code != 0 or not (run_dir / "test_report.json").is_file():
        print(f"outer fold {fold + 1} failed (exit {code}); see {log_path}")
        return False
    (run_dir / WALL).write_text(f"{time.perf_counter() - started:.0f}\n")
    return True


def wall_seconds(path):
    """An outer fold's recorded wall time, or None where there is none or it is not a number: a figure
    the summary can do without, so a damaged one is said in one line rather than refused."""
    try:
        return float(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        print(f"warning: {path} does not hold a number of seconds; that fold's time is left out", file=sys.stderr)
        return None


def outer_inputs(path, subjects, flags):
    """What decides an outer fold's score: its training flags and its windows (what they were made
    from, as their record says: a rewrite of the same windows still matches)."""
    windows = read_record(windows_record(path))
    return {"flags": flags, "subjects": subjects, "windows": windows["inputs"] if windows else None}


def outer_command(path, run_dir, flags, nproc_per_node=1):
    """The training command of one outer fold: main.py, or N ranks of main_multi_gpu.py under torchrun."""
    launch = [sys.executable, str(REPO / "main.py")]
    if nproc_per_node > 1:
        launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc_per_node}",
                  str(REPO / "main_multi_gpu.py"), "--multi-gpu", "ddp"]
    return [*launch, "--dataset", "npz", "--data-dir", str(path), "--save-dir", str(run_dir), *flags]


def write_outer_folds(data_dir, folder, folds, seed):
    """One .npz per outer fold (its people as the test split, everyone else's windows as training),
    written once and rewritten only when what it was made from changed (--data-dir's files, checked
    by checksum, the seed or the number of folds; data/provenance.py); returns [(path, subjects)]."""
    root = uci_har.find_root(data_dir)
    if root is None:
        raise DataError(f"--data-dir {data_dir} is not a UCI HAR layout (train/Inertial Signals and test/ inside)")
    data = load_har_data("uci-har", data_dir, val_fraction=0.0)
    train = data.train  # the dataset's own test split is not used: the outer folds are the test
    unique = np.unique(train.subjects)
    if folds > len(unique):
        raise UsageError(f"--outer-folds {folds} is more than the {len(unique)} training subjects of {data_dir}; "
                         f"use at most {len(unique)}")
    signal_files, *other_files = uci_har.source_files(root, "train")
    sources = {f"data file {path.name}": file_identity(path, checksum=True) for path in signal_files + other_files}
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for fold, subjects in enumerate(fold_subjects(train.subjects, folds, seed)):
        path = folder / f"outer-{fold}-seed-{seed}-of-{folds}.npz"
        inputs = {**sources, "seed": seed, "outer folds": folds, "fold": fold, "subjects": subjects}
        if not check(read_record(windows_record(path)), inputs, folder).matches:
            with open(path, "wb") as handle:
                np.savez(handle, signals=train.signals, labels=train.labels, subjects=train.subjects,
                         split=np.where(np.isin(train.subjects, subjects), "test", "train"),
                         class_names=np.array(data.class_names), channel_names=np.array(data.channel_names),
                         sample_rate_hz=data.sample_rate_hz)
            write_record(windows_record(path), make_record(inputs, folder, [path.name]))
        files.append((path, subjects))
    return files


def windows_record(path):
    return path.with_name(path.name[:-len(".npz")] + ".identity.json")


def summarise(rows, flags, outer_folds=None):
    people = {subject: figures["accuracy"] for row in rows for subject, figures in row["per_subject"].items()}
    worst_fold = min(rows, key=lambda row: row["accuracy"])
    worst_person = min(people, key=people.get)
    return {"flags": flags, "folds": rows, "outer_folds": outer_folds or len(rows),  # of which `folds` finished
            "mean": {key: statistics.mean(row[key] for row in rows) for key in ("accuracy", "macro_f1")},
            "worst_fold": {key: worst_fold[key] for key in ("fold", "accuracy", "macro_f1")},
            "worst_person": {"subject": worst_person, "accuracy": people[worst_person]},
            "people": {"mean": statistics.mean(people.values()), "median": statistics.median(people.values()),
                       "std": person_std(rows), "below_0.9": sum(a < 0.9 for a in people.values())}}


def format_summary(out, only=None):
    lines = [f"{'configuration':<22} {'outer mean':>10} {'macro-F1':>8} {'worst fold':>10} {'worst person':>15} "
             f"{'median person':>13} {'person std':>10}  flags"]
    for report_path in sorted(Path(out).glob(f"{only or '*'}/{REPORT}")):
        try:
            lines.append(_summary_line(report_path.parent.name, json.loads(report_path.read_text())))
        except (OSError, ValueError, KeyError, TypeError, AttributeError, statistics.StatisticsError) as exc:
            raise UsageError(f"{report_path} is damaged ({type(exc).__name__}: {exc}); run that configuration "
                             f"again (--name {report_path.parent.name}) to rewrite it") from None
    return "\n".join(lines)


def _summary_line(name, summary):
    worst, finished = summary["worst_person"], len(summary["folds"])
    if finished < summary.get("outer_folds", finished):
        name += f" ({finished} of {summary['outer_folds']})"
    return (f"{name:<22} {summary['mean']['accuracy']:>10.4f} "
            f"{summary['mean']['macro_f1']:>8.4f} {summary['worst_fold']['accuracy']:>10.4f} "
            f"{worst['accuracy']:>8.4f} ({worst['subject']:>3}) {summary['people']['median']:>13.4f} "
            f"{person_std(summary['folds']):>10.4f}  {' '.join(summary['flags']) or '(defaults)'}")


def person_std(rows):
    """The standard deviation of the accuracy over every outer fold's people."""
    return statistics.pstdev(figures["accuracy"] for row in rows for figures in row["per_subject"].values())


if __name__ == "__main__":
    sys.exit(run_entry_point(main))
