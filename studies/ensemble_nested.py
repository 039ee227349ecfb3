"""Would an ensemble of runs trained apart pay? For each outer fold of studies.nested_cv, the best.pt
of every named configuration (the same training command with another --seed, say) as one ensemble
(inference.ensemble: their class probabilities averaged), scored on the fold's held-out people.

  python -m studies.nested_cv --data-dir ../hapt-all21 --out runs/nested --name s1 -- --seed 1
  python -m studies.ensemble_nested --out runs/nested --names default,s1,s2

Prints, as studies.nested_cv --summary does, the mean over the outer folds, the worst fold, the
worst and the median person. --out/ensemble-<a+b+c>/ then reads as a nested configuration: its
nested_report.json, and per outer fold the ensemble as best.pt (studies.recording_accuracy --nested
scores it on whole recordings). Inference only: no training.
"""
import json
import shutil
import sys
from pathlib import Path

from evaluation.metrics import per_subject_accuracy, summary_metrics
from inference.bundle import load_bundle, pick_device, probabilities
from inference.ensemble import write_ensemble
from inference.evaluate import splits_as_trained
from profiling.entry_points import entry_parser
from studies import outer_fold_dirs, outer_fold_number
from studies.nested_cv import IDENTITY, REPORT, format_summary, summarise
from training.entry_point import run_entry_point
from training.errors import UsageError


def score_outer_fold(members, device, run_dir):
    """One outer fold's row as studies.nested_cv reports it, for the ensemble of `members`, which is
    kept as run_dir/best.pt beside the first member's nested_identity.json: the folder then reads as
    a nested configuration's outer fold (studies.recording_accuracy --nested, say)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(members[0].parent / IDENTITY, run_dir / IDENTITY)
    path = write_ensemble(members, run_dir / "best.pt")
    bundle = load_bundle(path)
    test = splits_as_trained(bundle.config, bundle.config.data.dataset, bundle.config.data.data_dir).test
    predictions = probabilities(bundle, test.signals, device).argmax(axis=1)
    people, _ = per_subject_accuracy(test.labels, predictions, test.subjects)
    figures = summary_metrics(test.labels, predictions, len(bundle.class_names))
    return {"accuracy": figures["acc"], "macro_f1": figures["macro_f1"], "per_subject": people}


def main(argv=None):
    parser = entry_parser("studies.ensemble_nested", __doc__)
    parser.add_argument("--out", required=True, help="the --out of studies.nested_cv")
    parser.add_argument("--names", required=True, type=lambda text: [n for n in text.split(",") if n],
                        help="comma-separated configurations (--name) under --out, two or more")
    parser.add_argument("--device", default="auto")
    opts = parser.parse_args(argv)
    if len(opts.names) < 2:
        raise UsageError("--names needs two configurations or more, e.g. --names default,s1")
    folds = {name: {d.name: d / "best.pt" for d in outer_fold_dirs(Path(opts.out) / name, "best.pt", IDENTITY)}
             for name in opts.names}
    shared = sorted(set.intersection(*(set(found) for found in folds.values())), key=outer_fold_number)
    if not shared:
        raise UsageError(f"no outer fold has a best.pt under every one of {', '.join(opts.names)} in {opts.out}; "
                         "run studies.nested_cv for each first")
    device, rows = pick_device(opts.device), []
    report_dir = Path(opts.out) / f"ensemble-{'+'.join(opts.names)}"
    for fold_dir in shared:
        row = score_outer_fold([folds[name][fold_dir] for name in opts.names], device, report_dir / fold_dir)
        rows.append({"fold": outer_fold_number(fold_dir), "subjects": sorted(map(int, row["per_subject"])), **row})
    (report_dir / REPORT).write_text(json.dumps(summarise(rows, [f"ensemble of {', '.join(opts.names)}"],
                                                          len(rows)), indent=2))
    print(format_summary(opts.out, only=report_dir.name))
    return 0


if __name__ == "__main__":
    sys.exit(run_entry_point(main))
