"""predict.py --recording: classify a whole recording and write windows.csv, timeline.csv, timeline.png, and
where the recording carries its labels, scores.json."""
import json
import sys
from pathlib import Path

from data.recordings import read_recording, unit_warning
from evaluation.calibration import scaled
from inference.bundle import load_bundle, pick_device
from inference.classify import check_checkpoint, check_usable, classify_recording, own_channels
from inference.recording_labels import format_score, score_recording
from inference.temperature import temperature_choice
from inference.timeline import format_summary, mark_uncertain, merge_segments, plot_timeline, smooth_labels
from inference.transitions import read_transitions
from outputs.safety import check_out_dir, prepare_out_dir, write_atomic, write_csv
from training.errors import UsageError

OUTPUTS = ("windows.csv", "timeline.csv", "timeline.png")
SCORES = "scores.json"  # only for a recording with a label column


def predict_recording(args):
    """Everything that can be refused is refused before the first file is written, --out first of all."""
    check_out_dir(args.out, (*OUTPUTS, SCORES), args.overwrite,
                  reads=[args.checkpoint, args.recording, args.transitions])
    bundle = load_bundle(args.checkpoint)
    device = pick_device(args.device)
    if args.stride is not None and not 1 <= args.stride <= bundle.window_steps:
        raise UsageError(f"--stride must be between 1 and the window length ({bundle.window_steps} samples), "
                         f"got {args.stride}")
    temperature = temperature_choice(args.temperature, args.checkpoint)
    transitions = None if args.transitions is None else \
        read_transitions(args.transitions, bundle.class_names, args.stride or bundle.window_steps // 2)
    check_checkpoint(bundle)
    recording = read_recording(args.recording, args.acc_unit, args.gyro_unit, channels=own_channels(bundle))
    check_usable(bundle, recording)
    doubt = unit_warning(recording, args.acc_unit)  # None for a model's own channels: no acc to judge
    if doubt:
        print(f"warning: {doubt}", file=sys.stderr)
    predictions = classify_recording(bundle, recording, device, args.stride, args.sample_rate,
                                     adapt=args.adapt == "recording")
    # The smoothers were chosen on the model's own probabilities: they keep reading those, so that a
    # temperature changes how sure the reported probabilities are and never which activity is reported.
    labels = smooth_labels(predictions.probabilities, args.smooth, transitions=transitions)
    predictions.probabilities = scaled(predictions.probabilities, temperature)
    labels = mark_uncertain(labels, predictions.probabilities, args.uncertain_below)
    segments = merge_segments(labels, predictions.probabilities, predictions.start_s, predictions.end_s,
                              bundle.class_names)
    score = score_recording(recording, bundle, labels, predictions)
    written = (*OUTPUTS, SCORES) if score is not None else OUTPUTS
    out = prepare_out_dir(args.out, written, args.overwrite)
    names = bundle.class_names
    write_csv(out / "windows.csv", ["start_s", "end_s", "predicted", "confidence", *names],
              [[f"{start:.3f}", f"{end:.3f}", names[row.argmax()], f"{row.max():.4f}", *(f"{p:.4f}" for p in row)]
               for start, end, row in zip(predictions.start_s, predictions.end_s, predictions.probabilities,
                                          strict=True)])
    write_csv(out / "timeline.csv", ["start_s", "end_s", "activity", "confidence"],
              [[f"{s.start_s:.3f}", f"{s.end_s:.3f}", s.activity, f"{s.confidence:.4f}"] for s in segments])
    title = f"{recording.path}: {bundle.config.model.name}" + (f", {args.smooth} smoothing" if args.smooth else "")
    write_atomic(out / "timeline.png", lambda partial: plot_timeline(predictions, segments, partial, title))
    stale = _scores_beside(out, score)
    print(format_summary(segments, names, f"{bundle.describe()}\n{recording.path}: "
                         f"{predictions.duration_s:.1f} s at {predictions.source_rate_hz:.4g} Hz, "
                         f"{len(labels)} windows, {len(segments)} segments"
                         + (f" ({args.smooth} smoothing)" if args.smooth else "")
                         + _new_people_note(args, temperature, labels, len(names))))
    if score is not None:
        print(format_score(score))
    print(f"wrote {', '.join(str(out / name) for name in written)}"
          + (f"; removed the earlier {SCORES}: this recording carries no labels" if stale else ""))
    return 0


def _scores_beside(out, score):
    """scores.json for a labelled recording; an earlier one (--overwrite) beside a timeline of a recording
    without labels would score another recording, and goes. Whether one went."""
    path = Path(out) / SCORES
    if score is not None:
        write_atomic(path, lambda partial: Path(partial).write_text(json.dumps(score, indent=2)))
        return False
    stale = path.exists()
    if stale:
        path.unlink()
    return stale


def _new_people_note(args, temperature, labels, classes):
    """What the options for new people did, for the summary's header."""
    notes = [f"temperature {temperature:.3g}"] if temperature != 1.0 else []
    notes += ["features standardised on this recording"] if args.adapt == "recording" else []
    notes += ["learnt transitions"] if args.transitions is not None else []
    if args.uncertain_below is not None:
        notes.append(f"{int((labels == classes).sum())} windows uncertain (top probability < {args.uncertain_below:g})")
    return "".join(f"; {note}" for note in notes)
