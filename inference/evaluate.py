"""predict.py --data-dir / --dataset synthetic: a checkpoint's test report on a split, without training."""
import json
import shlex
import sys
from pathlib import Path

import numpy as np

from data.errors import DataError
from data.sources import load_har_data, source_for
from evaluation.calibration import CALIBRATION_FILE, calibration_fields, fit_temperature, format_calibration, mean_nll
from evaluation.figures import plot_confusion_matrix
from evaluation.metrics import classification_report, format_people, format_report, per_subject_accuracy
from inference.adaptation import adapted_per_group
from inference.bundle import load_bundle, pick_device, probabilities
from inference.temperature import run_temperature, temperature_choice, write_calibration
from outputs.safety import check_out_dir, prepare_out_dir, write_atomic
from training.errors import UsageError


def outputs_of(split):
    """The files an evaluation of `split` writes: its report is named after it, as training names its own."""
    return f"{split}_report.json", "confusion_matrix.png", CALIBRATION_FILE


def evaluate_checkpoint(args):
    outputs = outputs_of(args.split)
    # The run's calibration.json is read by --temperature run; an evaluation writes its own elsewhere.
    reads = [args.checkpoint, Path(args.checkpoint).parent / CALIBRATION_FILE, args.temperature]
    check_out_dir(args.out, outputs, args.overwrite, reads)
    temperature = temperature_choice(args.temperature, args.checkpoint)
    bundle = load_bundle(args.checkpoint)
    device = pick_device(args.device)
    source = _source_of(args)
    _check_source(bundle, source, args)
    data = splits_as_trained(bundle.config, source.name, args.data_dir, bundle.described)
    split = getattr(data, args.split)
    _check_fits(bundle, data, split, args)
    if args.split == "val" and bundle.refitted:
        print("warning: this final model was trained on its run's validation people too (--final-model everyone): "
              "its figures on them are not a held-out estimate; the run's val_report.json is", file=sys.stderr)
    adapt = args.adapt == "subject"
    fitted = None
    if temperature == "fit":
        temperature, fitted = fitted_temperature(bundle, data, device, adapt)
    report = report_of(bundle, split, device,
                       {"checkpoint": str(bundle.path), "split": args.split, "data": data.description},
                       temperature, adapt)
    out = prepare_out_dir(args.out, outputs, args.overwrite)
    write_report_files(report, bundle.class_names, out, f"{args.split} split", report_name=outputs[0])
    written = list(outputs[:2])
    if fitted is not None:
        write_calibration(out / CALIBRATION_FILE, temperature, {**fitted, "checkpoint": str(bundle.path),
                                                                "features_per_subject": adapt})
        written.append(CALIBRATION_FILE)
    # An earlier evaluation's temperature (--overwrite) would sit beside a report made at another.
    stale = (out / CALIBRATION_FILE).exists() and fitted is None
    if stale:
        (out / CALIBRATION_FILE).unlink()
    print(f"{bundle.describe()}\n{data.description}\n{args.split} split:\n{format_report(report)}")
    print(format_people(report))
    print(format_calibration(report, fitted))
    print(f"wrote {', '.join(str(out / name) for name in written)}"
          + (f"; removed the earlier {CALIBRATION_FILE}: this report's temperature was not fitted" if stale else ""))
    return 0


def fitted_temperature(bundle, data, device, adapt):
    """(temperature, where it was fitted) on the run's own validation split; (1.0, None) where the
    run held none out (an ensemble, --val-fraction 0): there is nothing unseen to fit it on. A final
    model trained on its validation people too takes the one its run fitted on them before (its
    calibration.json), when they were still unseen."""
    if bundle.members > 1 or len(data.val) == 0:
        return 1.0, None
    if bundle.refitted:
        return run_temperature(bundle.path), {"fitted_on": "the training run's validation split, by the model chosen "
                                              "there before this final model trained on it too",
                                              "windows": len(data.val)}
    probs = split_probabilities(bundle, data.val, device, adapt)
    temperature = fit_temperature(probs, np.asarray(data.val.labels, dtype=np.int64))
    return temperature, {"fitted_on": "the run's validation split", "windows": len(data.val),
                         "subjects": sorted(int(s) for s in np.unique(data.val.subjects))}


def split_probabilities(bundle, split, device, adapt=False):
    """[N, classes] probabilities of a split; with `adapt`, MiniRocket's features standardised per subject."""
    if adapt:
        return adapted_per_group(bundle, split.signals, np.asarray(split.subjects), device)
    return probabilities(bundle, split.signals, device)


def splits_as_trained(config, dataset, data_dir, described=None):
    """The splits of `data_dir` (or of the synthetic data) rebuilt with the data options of the run's RunConfig;
    windows that a description reads are read by the one the model's data had (`described`, the checkpoint's),
    not by the path the run was given, which may have moved."""
    reads_one = source_for(dataset, data_dir).takes_description
    data = load_har_data(**config.data_options(dataset=dataset, data_dir=data_dir,
                                               description=described if reads_one else None))
    for line in data.warnings:  # a training run's log says them; scoring windows has no log
        print(f"warning: {line}", file=sys.stderr)
    return data


def report_of(bundle, split, device, about, temperature=1.0, adapt=False):
    """The test report (with `about` in it) of the bundle on a split, with its calibration at `temperature`
    (which leaves the accuracy: the argmax does not move)."""
    labels = np.asarray(split.labels, dtype=np.int64)
    subjects = np.asarray(split.subjects, dtype=np.int64)
    probs = split_probabilities(bundle, split, device, adapt)
    predictions = probs.argmax(axis=1)
    people, worst = per_subject_accuracy(labels, predictions, subjects)
    report = {**classification_report(labels, predictions, bundle.class_names), "loss": mean_nll(probs, labels),
              "per_subject": people, "worst_subject": worst,
              **calibration_fields(probs, labels, subjects, temperature)}
    if adapt:
        report["features_standardised"] = "per subject"
    return {**report, **about}


def write_report_files(report, class_names, out, title, figure=True, report_name="test_report.json"):
    write_atomic(out / report_name,
                 lambda partial: Path(partial).write_text(json.dumps(report, indent=2)))
    if figure:
        write_atomic(out / "confusion_matrix.png", lambda partial: plot_confusion_matrix(
            report["confusion_matrix"], class_names, partial, title=title))


def write_report(bundle, split, device, out, title, about, figure=True):
    """test_report.json (with `about` in it) and, with `figure`, confusion_matrix.png of the bundle on
    a split, in folder `out`; returns the report."""
    report = report_of(bundle, split, device, about)
    write_report_files(report, bundle.class_names, out, title, figure)
    return report


def _source_of(args):
    """The kind of data --dataset names, or for auto the kind --data-dir holds (as main.py reads it); a path no
    kind claims is refused with the command that evaluates on the built-in data instead."""
    try:
        return source_for(args.dataset, args.data_dir)
    except DataError as exc:
        raise UsageError(f"{exc}: {_synthetic_command(args)}") from None


def _check_source(bundle, source, args):
    """What can be said about --data-dir before it is read, with the command that works instead."""
    if bundle.members > 1 and args.split == "val":
        raise UsageError("an ensemble's members trained on every training subject between them, so it has no "
                         "validation split: use --split test")
    mode = bundle.config.data.mode
    if mode not in source.modes:
        raise UsageError(f"checkpoint {bundle.path} was trained with --mode {mode} on UCI HAR channels, while "
                         f"--dataset {source.name} windows are used as they are; evaluate it on the UCI HAR Dataset "
                         "(--data-dir) or on --dataset synthetic")
    if source.takes_path and not source.claims(Path(args.data_dir)):
        raise UsageError(f"--data-dir {args.data_dir} does not hold {source.about}; for other data give the "
                         f"--dataset it is (or auto), or evaluate on the built-in synthetic data: "
                         f"{_synthetic_command(args)}")


def _synthetic_command(args):
    """This command line with --dataset synthetic in place of --data-dir, ready to paste."""
    words = ["python", "predict.py", "--checkpoint", args.checkpoint, "--dataset", "synthetic", "--out", args.out]
    words += ["--split", args.split] if args.split != "test" else []
    words += ["--device", args.device] if args.device != "auto" else []
    return shlex.join(str(word) for word in words + (["--overwrite"] if args.overwrite else []))


def _check_fits(bundle, data, split, args):
    source = args.data_dir if args.data_dir is not None else "the synthetic data"
    if tuple(data.channel_names) != bundle.channel_names:
        raise UsageError(f"{source} gives channels {', '.join(data.channel_names)}; the checkpoint was "
                         f"trained on {', '.join(bundle.channel_names)}")
    if tuple(data.class_names) != bundle.class_names:
        raise UsageError(f"{source} has classes {', '.join(data.class_names)}; the checkpoint knows "
                         f"{', '.join(bundle.class_names)}")
    if data.padded and not bundle.padded:
        raise UsageError(f"{source} holds windows of {data.own_lengths[0]} to {data.own_lengths[1]} steps, padded at "
                         "their end with NaN, and the checkpoint's model was trained on windows of one length, so it "
                         "would read the padding as signal; evaluate it on windows of its own length")
    if split.signals.shape[2] != bundle.window_steps:
        raise UsageError(f"{source} has windows of {split.signals.shape[2]} steps; the checkpoint was "
                         f"trained on {bundle.window_steps}")
    if len(split) == 0:
        why = "; the checkpoint trained on every training subject (--val-fraction 0), so there is no validation " \
              "split: use --split test" if args.split == "val" else ""
        raise UsageError(f"the {args.split} split of {source} is empty{why}")
