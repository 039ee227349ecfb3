"""predict.py --recording: classify a whole recording and write windows.csv, timeline.csv, timeline.png."""
from data.recordings import read_recording
from inference.bundle import load_bundle, pick_device
from inference.classify import check_usable, classify_recording
from inference.outputs import check_out_dir, prepare_out_dir, write_csv
from inference.plot import plot_timeline
from inference.timeline import format_summary, merge_segments, smooth_labels
from training.checkpoint.atomic import write_atomic
from training.errors import UsageError

OUTPUTS = ("windows.csv", "timeline.csv", "timeline.png")


def check_stride(stride_steps, window_steps):
    if stride_steps is not None and not 1 <= stride_steps <= window_steps:
        raise UsageError(f"--stride must be between 1 and the window length ({window_steps} samples), "
                         f"got {stride_steps}")


def predict_recording(args):
    """Everything that can be refused is refused before the first file is written, --out first of all."""
    check_out_dir(args.out, OUTPUTS, args.overwrite)
    bundle = load_bundle(args.checkpoint)
    device = pick_device(args.device)
    check_stride(args.stride, bundle.window_steps)
    recording = read_recording(args.recording, args.acc_unit, args.gyro_unit)
    check_usable(bundle, recording)
    predictions = classify_recording(bundle, recording, device, args.stride, args.sample_rate)
    labels = smooth_labels(predictions.probabilities, args.smooth)
    segments = merge_segments(labels, predictions.probabilities, predictions.start_s, predictions.end_s,
                              bundle.class_names)
    out = prepare_out_dir(args.out, OUTPUTS, args.overwrite)
    names = bundle.class_names
    write_csv(out / "windows.csv", ["start_s", "end_s", "predicted", "confidence", *names],
              [[f"{start:.3f}", f"{end:.3f}", names[row.argmax()], f"{row.max():.4f}", *(f"{p:.4f}" for p in row)]
               for start, end, row in zip(predictions.start_s, predictions.end_s, predictions.probabilities,
                                          strict=True)])
    write_csv(out / "timeline.csv", ["start_s", "end_s", "activity", "confidence"],
              [[f"{s.start_s:.3f}", f"{s.end_s:.3f}", s.activity, f"{s.confidence:.4f}"] for s in segments])
    title = f"{recording.path}: {bundle.config.get('model')}" + (f", {args.smooth} smoothing" if args.smooth else "")
    write_atomic(out / "timeline.png", lambda partial: plot_timeline(predictions, segments, partial, title))
    print(format_summary(segments, names, f"{bundle.describe()}\n{recording.path}: "
                         f"{predictions.duration_s:.1f} s at {predictions.source_rate_hz:.4g} Hz, "
                         f"{len(labels)} windows, {len(segments)} segments"
                         + (f" ({args.smooth} smoothing)" if args.smooth else "")))
    print(f"wrote {', '.join(str(out / name) for name in OUTPUTS)}")
    return 0
