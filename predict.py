"""Classify a whole recording with a trained checkpoint, or evaluate one on a split. See README.md."""
import sys

from training.entry_point import run_entry_point


def main(argv):
    from inference.cli import parse_predict_args
    args = parse_predict_args(argv)
    if args.recording is not None:
        from inference.recording_run import predict_recording
        return predict_recording(args)
    from inference.evaluate import evaluate_checkpoint
    return evaluate_checkpoint(args)


if __name__ == "__main__":
    sys.exit(run_entry_point(main))
