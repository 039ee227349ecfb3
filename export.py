"""Export a checkpoint as TorchScript or ONNX: raw-unit windows in, logits out. See README.md."""
import sys

from training.entry_point import run_entry_point


def main(argv):
    from inference.bundle import load_bundle
    from inference.cli import export_parser
    from inference.export import check_suffix, export
    from outputs.safety import check_out_file
    args = export_parser().parse_args(argv)
    out = check_out_file(args.out, args.overwrite, reads=[args.checkpoint])
    check_suffix(out, args.format)
    bundle = load_bundle(args.checkpoint)
    difference = export(bundle, args.format, out)
    print(bundle.describe())
    print(f"wrote {out} ({args.format}): input 'signals' float32 [batch, {len(bundle.channel_names)}, "
          f"{bundle.window_steps}] in raw units, channels {', '.join(bundle.channel_names)}; output 'logits' "
          f"[batch, {len(bundle.class_names)}] for {', '.join(bundle.class_names)}")
    if bundle.members > 1:
        print(f"the logits are the log of the {bundle.members} models' mean probabilities: softmax gives that mean")
    if difference is None:
        print("not checked: onnxruntime is not installed (pip install onnxruntime)")
    else:
        print(f"checked against the PyTorch model: largest logit difference {difference:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(run_entry_point(main))
