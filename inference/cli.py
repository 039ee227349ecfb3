"""Command-line parsers of predict.py and export.py."""
import argparse
import math

from data.recordings import ACC_UNITS, GYRO_UNITS
from data.sources import AUTO, SOURCES, dataset_choices
from inference.adaptation import ADAPT_CHOICES
from inference.export import EXPORT_FORMATS
from inference.timeline import SMOOTHERS
from training.config.cli import DefaultsInHelp, usage_error
from training.errors import UsageError

# The options of one mode of predict.py (None when not given): a recording's, an evaluation's.
RECORDING_ONLY = ("sample_rate", "acc_unit", "gyro_unit", "stride", "smooth", "transitions", "uncertain_below")
EVALUATION_ONLY = ("split",)


def predict_parser():
    parser = argparse.ArgumentParser(
        prog="predict.py", formatter_class=DefaultsInHelp,
        description="Classify a whole recording with a trained checkpoint, or evaluate it on a dataset split.")
    parser.add_argument("--checkpoint", required=True, help="best.pt or last.pt written by training")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--recording", help="CSV (time_s, acc_x..z, gyro_x..z) or .npz (acc, gyro, time_s)")
    source.add_argument("--data-dir", help="evaluate instead: the data a run reads (a UCI HAR folder, an .npz of "
                                           "windows, a window store, a folder of labelled recordings); none with "
                                           "--dataset synthetic")
    parser.add_argument("--out", required=True, help="output folder (created if missing)")
    parser.add_argument("--overwrite", action="store_true", help="replace outputs already in --out")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    group = parser.add_argument_group("recording")
    group.add_argument("--sample-rate", type=float, default=None, metavar="HZ",
                       help="the recording's rate when it has no time_s column")
    # None when not given: a recording read by a model's own channels takes no unit (data/recordings.py).
    group.add_argument("--acc-unit", choices=tuple(ACC_UNITS), default=None,
                       help="of acc_x..acc_z (not of a model's own channels, read as recorded); default: g")
    group.add_argument("--gyro-unit", choices=tuple(GYRO_UNITS), default=None,
                       help="of gyro_x..gyro_z (not of a model's own channels); default: rad/s")
    group.add_argument("--stride", type=int, default=None, metavar="STEPS",
                       help="samples (at the model's rate) between window starts; default half a window")
    # median by default: on the nested estimate over 21 people's recordings it matched hmm overall
    # and lifted the worst person more (docs/training.md); hmm can hold a wrong state for long.
    group.add_argument("--smooth", nargs="?", choices=("none", *SMOOTHERS), const="hmm", default=None,
                       help="smooth the window sequence: median of the probabilities over 5 windows (the "
                            "default), hmm (a sticky Viterbi path; what --smooth alone picks), or none")
    group.add_argument("--transitions", default=None, metavar="FILE",
                       help="with --smooth hmm: a transition matrix learnt from labelled recordings (python -m "
                            "inference.transitions) in place of the fixed switch probability")
    group.add_argument("--uncertain-below", type=float, default=None, metavar="P",
                       help="windows whose top probability is below P are 'uncertain' in the timeline instead "
                            "of an activity; off by default")
    group = parser.add_argument_group("new people")
    group.add_argument("--temperature", default=None, metavar="T|FILE|fit|run|none",
                       help="divide the logits by T before the probabilities are reported: a number, a "
                            "calibration.json, 'fit' (evaluation only: fitted on the run's validation split), "
                            "'run' (the calibration.json the training run wrote beside the checkpoint, else 1) "
                            "or 'none'; default: fit when evaluating, run for a recording")
    group.add_argument("--adapt", choices=(*ADAPT_CHOICES, "subject"), default="none",
                       help="minirocket: standardise the features with the statistics of the recording "
                            "(--adapt recording) or of each person's windows (--adapt subject, evaluation) "
                            "instead of the training windows'; a recording of under 10 windows, or of one "
                            "activity as the model sees it, is refused: it has nothing to centre on")
    group = parser.add_argument_group("evaluation")
    group.add_argument("--dataset", choices=dataset_choices(), default=AUTO,
                       help="auto: the kind of data --data-dir holds, as main.py reads it; synthetic: the built-in "
                            "data, generated as the checkpoint's run generated it (its --synthetic-seed and "
                            "--synthetic-windows-per-subject)")
    group.add_argument("--split", choices=("train", "val", "test"), default=None,
                       help="default: test; val and train are rebuilt with the checkpoint's --val-subjects (or "
                            "--val-fraction) and --seed; the report is <split>_report.json")
    parser.add_argument("--debug", action="store_true", help="full tracebacks instead of one-line errors")
    parser.error = usage_error(parser.prog)  # one line, like every other bad input
    return parser


def parse_predict_args(argv):
    """The arguments; options of one mode (a recording, or an evaluation) or of hmm smoothing are refused
    in the other, and the dataset to evaluate on is --data-dir, or the synthetic data without it."""
    args = predict_parser().parse_args(argv)
    recording = args.recording is not None
    if args.sample_rate is not None and not (math.isfinite(args.sample_rate) and args.sample_rate > 0):
        raise UsageError(f"--sample-rate must be a positive number of Hz, got {args.sample_rate}")
    # Each mode's options are refused in the other, so that none is given in vain.
    other_mode = [f"--{name.replace('_', '-')}" for name in (EVALUATION_ONLY if recording else RECORDING_ONLY)
                  if getattr(args, name) is not None]
    if other_mode:
        mode = "classifying a recording (--recording)" if not recording else "an evaluation (--data-dir)"
        one = len(other_mode) == 1
        raise UsageError(f"{' and '.join(other_mode)} only appl{'ies' if one else 'y'} to {mode}; drop "
                         f"{'it' if one else 'them'} here")
    args.split = args.split or "test"
    args.smooth = {None: "median", "none": None}.get(args.smooth, args.smooth)
    if recording and args.dataset != AUTO:
        raise UsageError(f"--dataset {args.dataset} picks the data to evaluate on; with --recording drop it")
    made = args.dataset != AUTO and not SOURCES[args.dataset].takes_path  # the synthetic data
    if not recording and made and args.data_dir is not None:
        raise UsageError(f"--data-dir is not read with --dataset {args.dataset}; drop one of them")
    if not recording and not made and args.data_dir is None:
        raise UsageError("give --recording FILE to classify a recording, or --data-dir DATA to evaluate on a "
                         "dataset (--dataset synthetic, without --data-dir, evaluates on the built-in synthetic data)")
    if args.transitions is not None and args.smooth != "hmm":
        raise UsageError("--transitions is the matrix of --smooth hmm; add --smooth hmm or drop --transitions")
    if args.uncertain_below is not None and not (math.isfinite(args.uncertain_below) and
                                                 0 < args.uncertain_below < 1):
        raise UsageError(f"--uncertain-below must be a probability between 0 and 1, got {args.uncertain_below}")
    wanted = "recording" if recording else "subject"
    if args.adapt not in ("none", wanted):
        raise UsageError(f"--adapt {args.adapt} is for {'an evaluation' if recording else 'a recording'}; "
                         f"use --adapt {wanted} here")
    if args.temperature is None:
        args.temperature = "run" if recording else "fit"
    if recording and args.temperature == "fit":
        raise UsageError("--temperature fit needs the run's validation split, which a recording lacks: leave "
                         "--temperature out (the training run's calibration.json), or give a calibration.json "
                         "or a number")
    return args


def export_parser():
    parser = argparse.ArgumentParser(
        prog="export.py", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Export a checkpoint as a self-contained model: raw-unit windows [B, C, T] in, logits out.")
    parser.add_argument("--checkpoint", required=True, help="best.pt or last.pt written by training")
    parser.add_argument("--format", choices=EXPORT_FORMATS, required=True)
    parser.add_argument("--out", required=True, help="file to write, e.g. model.pt or model.onnx")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    parser.add_argument("--debug", action="store_true", help="full tracebacks instead of one-line errors")
    parser.error = usage_error(parser.prog)  # one line, like every other bad input
    return parser
