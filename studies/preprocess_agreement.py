"""How closely data/preprocess.py reproduces a UCI-HAR-layout split cut from the raw recordings.

Cuts every recording of the split's subjects as the layout was cut (128 samples every 64,
wholly inside one activity 1..6, recordings in name order) and prints the largest difference
from the windows the loader reads. Development data only: nothing in the tests needs it.
"""

import sys

import numpy as np

from benchmarks import entry_parser
from data.preprocess import cut_windows, uci_har_channels
from data.uci_har import SAMPLE_RATE_HZ, SIGNAL_NAMES, WINDOW_STEPS, find_root, load_split
from inference.transitions import recording_classes
from training.errors import UsageError, run_entry_point


def main(argv=None):
    parser = entry_parser("studies.preprocess_agreement", __doc__)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--recordings", default="../shared/data/hapt-dev/hapt_dev_recordings.npz")
    parser.add_argument("--split", default="test", choices=("train", "test"))
    parser.add_argument("--subjects", default="3,7,15,21,26,29", help="the subjects in --split")
    args = parser.parse_args(argv)
    root = find_root(args.data_dir)
    if root is None:
        raise UsageError(f"--data-dir {args.data_dir} does not hold the UCI HAR Dataset; point it at a folder "
                         "in its layout (../shared/data/hapt-dev's script writes one)")
    loaded, labels, _ = load_split(root, args.split)
    subjects = {int(s) for s in args.subjects.split(",")}
    archive = np.load(args.recordings, allow_pickle=False)
    ours = []
    for name, classes in recording_classes(archive, subjects).items():  # -1: not an activity 1..6
        channels = uci_har_channels(archive[f"{name}_acc"], archive[f"{name}_gyro"], SAMPLE_RATE_HZ)
        stream = np.stack([channels[channel] for channel in SIGNAL_NAMES])
        edges = np.flatnonzero(np.diff(classes)) + 1
        for first, stop in zip(np.r_[0, edges], np.r_[edges, len(classes)], strict=True):
            starts = np.arange(first, stop - WINDOW_STEPS + 1, WINDOW_STEPS // 2)
            if classes[first] >= 0 and len(starts):
                ours.append(cut_windows(stream, starts, WINDOW_STEPS))
    ours = np.concatenate(ours)
    if ours.shape != loaded.shape:
        raise UsageError(f"{len(ours)} windows cut here, {len(loaded)} in the {args.split} split: other --subjects?")
    print(f"{len(ours)} {args.split} windows of {sorted(subjects)}: largest |difference| "
          f"{np.abs(ours - loaded).max():.2e} (the text files keep 8 significant digits)")


if __name__ == "__main__":
    sys.exit(run_entry_point(main))
