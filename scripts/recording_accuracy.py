"""Per-sample accuracy of predict.py's recording path on labelled continuous recordings.

usage: python -m scripts.recording_accuracy --checkpoint RUN/best.pt
           [--recordings ../shared/data/hapt-dev/hapt_dev_recordings.npz] [--subjects 3,7,15,21,26,29]
           [--as-rate HZ]

Each recording (keys uSS_sK_acc / _gyro / _label, 50 Hz, acc in g) goes through the same
functions as predict.py; every sample labelled 1..6 is scored against the window that speaks
for it. Transitions (7..12) and unlabelled samples (0) are left out. --as-rate first resamples
each recording to another rate, as if the phone had recorded at it, so that predict.py has to
bring it back to the model's rate. Development data only:
nothing in the tests needs it.
"""
import argparse
from collections import defaultdict

import numpy as np

from data.recordings import Recording
from data.resample import resample
from inference.bundle import load_bundle, pick_device
from inference.classify import classify_recording
from inference.timeline import labels_at, smooth_labels

RECORDING_RATE_HZ = 50.0
SMOOTHINGS = (None, "median", "hmm")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--recordings", default="../shared/data/hapt-dev/hapt_dev_recordings.npz")
    parser.add_argument("--subjects", default="3,7,15,21,26,29", help="held out of training")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--as-rate", type=float, default=RECORDING_RATE_HZ, metavar="HZ")
    args = parser.parse_args()
    bundle, device = load_bundle(args.checkpoint), pick_device(args.device)
    subjects = {int(s) for s in args.subjects.split(",")}
    archive = np.load(args.recordings, allow_pickle=False)
    names = sorted({key.rsplit("_", 1)[0] for key in archive.files if int(key[1:3]) in subjects})
    # tallies[smoothing][subject] = [correct samples, scored samples]
    tallies = {smoothing: defaultdict(lambda: [0, 0]) for smoothing in SMOOTHINGS}
    for name in names:
        label = archive[f"{name}_label"].astype(np.int64)
        acc, gyro = (resample(archive[f"{name}_{sensor}"].astype(np.float64), RECORDING_RATE_HZ, args.as_rate)
                     for sensor in ("acc", "gyro"))
        predictions = classify_recording(bundle, Recording(acc, gyro, None, name), device, sample_rate_hz=args.as_rate)
        times_s = np.arange(len(label)) / RECORDING_RATE_HZ
        scored = (label >= 1) & (label <= 6)
        for smoothing in SMOOTHINGS:
            window_labels = smooth_labels(predictions.probabilities, smoothing)
            predicted = labels_at(times_s, window_labels, predictions.start_s, predictions.end_s)
            tally = tallies[smoothing][int(name[1:3])]
            tally[0] += int(np.sum(predicted[scored] == label[scored] - 1))
            tally[1] += int(np.sum(scored))
    print(f"{bundle.describe()}\n{len(names)} recordings of subjects {sorted(subjects)} given at "
          f"{args.as_rate:g} Hz; per-sample accuracy over samples labelled 1..6")
    print(f"{'subject':>7}  {'samples':>8}  " + "  ".join(f"{str(s or 'none'):>7}" for s in SMOOTHINGS))
    for subject in sorted(subjects):
        counts = [tallies[s][subject] for s in SMOOTHINGS]
        print(f"{subject:>7}  {counts[0][1]:>8}  " + "  ".join(f"{c / max(n, 1):7.4f}" for c, n in counts))
    totals = [np.sum(list(tallies[s].values()), axis=0) for s in SMOOTHINGS]
    print(f"{'all':>7}  {totals[0][1]:>8}  " + "  ".join(f"{c / max(n, 1):7.4f}" for c, n in totals))


if __name__ == "__main__":
    main()
