"""predict.py --data-dir: a checkpoint's test report on a split, without training."""
import json
from pathlib import Path

import numpy as np

from data.splits import load_har_data
from evaluation.figures import plot_confusion_matrix
from evaluation.metrics import classification_report, format_people, format_report, per_subject_accuracy
from inference.bundle import load_bundle, pick_device, probabilities
from inference.outputs import prepare_out_dir
from training.checkpoint.atomic import write_atomic
from training.errors import UsageError

OUTPUTS = ("test_report.json", "confusion_matrix.png")


def evaluate_checkpoint(args):
    bundle = load_bundle(args.checkpoint)
    device = pick_device(args.device)
    config = bundle.config
    dataset = "npz" if args.dataset == "auto" and str(args.data_dir).endswith(".npz") else args.dataset
    data = splits_as_trained(config, dataset, args.data_dir)
    split = getattr(data, args.split)
    _check_fits(bundle, data, split, args)
    out = prepare_out_dir(args.out, OUTPUTS, args.overwrite)
    report = write_report(bundle, split, device, out, f"{args.split} split",
                          {"checkpoint": str(bundle.path), "split": args.split, "data": data.description})
    print(f"{bundle.describe()}\n{data.description}\n{args.split} split:\n{format_report(report)}")
    print(format_people(report))
    print(f"wrote {out / 'test_report.json'}, {out / 'confusion_matrix.png'}")
    return 0


def splits_as_trained(config, dataset, data_dir):
    """The splits of `data_dir` rebuilt as the run with `config` built them: same mode, validation
    subjects (or share) and seed."""
    return load_har_data(dataset, data_dir, config.get("mode", "flatten"), config.get("val_fraction", 0.2),
                         split_seed=config.get("seed", 0), val_subjects=config.get("val_subjects"))


def write_report(bundle, split, device, out, title, about, figure=True):
    """test_report.json (with `about` in it) and, with `figure`, confusion_matrix.png of the bundle on
    a split, in folder `out`; returns the report."""
    probs = probabilities(bundle, split.signals, device)
    predictions = probs.argmax(axis=1)
    loss = float(-np.log(np.clip(probs[np.arange(len(split)), split.labels], 1e-12, None)).mean())
    people, worst = per_subject_accuracy(split.labels, predictions, split.subjects)
    report = {**classification_report(split.labels, predictions, bundle.class_names), "loss": loss,
              "per_subject": people, "worst_subject": worst, **about}
    write_atomic(out / "test_report.json",
                 lambda partial: Path(partial).write_text(json.dumps(report, indent=2)))
    if figure:
        write_atomic(out / "confusion_matrix.png", lambda partial: plot_confusion_matrix(
            report["confusion_matrix"], bundle.class_names, partial, title=title))
    return report


def _check_fits(bundle, data, split, args):
    if tuple(data.channel_names) != bundle.channel_names:
        raise UsageError(f"{args.data_dir} gives channels {', '.join(data.channel_names)}; the checkpoint was "
                         f"trained on {', '.join(bundle.channel_names)}")
    if tuple(data.class_names) != bundle.class_names:
        raise UsageError(f"{args.data_dir} has classes {', '.join(data.class_names)}; the checkpoint knows "
                         f"{', '.join(bundle.class_names)}")
    if split.signals.shape[2] != bundle.window_steps:
        raise UsageError(f"{args.data_dir} has windows of {split.signals.shape[2]} steps; the checkpoint was "
                         f"trained on {bundle.window_steps}")
    if bundle.members > 1 and args.split == "val":
        raise UsageError("an ensemble's members trained on every training subject between them, so it has no "
                         "validation split: use --split test")
    if len(split) == 0:
        why = "; the checkpoint trained on every training subject (--val-fraction 0), so there is no validation " \
              "split: use --split test" if args.split == "val" else ""
        raise UsageError(f"the {args.split} split of {args.data_dir} is empty{why}")
