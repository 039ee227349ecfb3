"""Would test-time augmentation pay? Scores a nested run's outer-fold models on their held-out people
with each window's class probabilities averaged over fixed copies of it: circular time shifts, small
rotations of every sensor's x/y/z, a gain, or a half turn about x, against the plain window.

  python -m studies.nested_cv --data-dir ../hapt-all21 --out runs/nested --name minirocket
  python -m studies.tta_nested --run runs/nested/minirocket

Per set of copies: every outer fold's accuracy, their mean, the worst fold and the worst person, so
that a choice is made on the outer folds, as the nested estimate asks. Inference only: no training.
"""
import math
import statistics
import sys

import numpy as np

from benchmarks import entry_parser
from data.augment import sensor_triples
from evaluation.metrics import per_subject_accuracy
from inference.bundle import load_bundle, pick_device, probabilities
from inference.evaluate import splits_as_trained
from studies import outer_fold_dirs
from training.errors import run_entry_point

SHIFTS = tuple(("shift", steps) for steps in (-8, -4, 4, 8))  # training's shift augmentation draws from +-8
ROTATIONS = tuple(("rotate", (axis, degrees)) for axis in range(3) for degrees in (-10, 10))  # training: up to 10
# Each set: the copies averaged with the plain window (gains as training's scale augmentation, 1 +- 0.1).
TTA_SETS = {"none": (), "shift": SHIFTS, "rotate": ROTATIONS, "scale": (("scale", 0.9), ("scale", 1.1)),
            "shift+rotate": SHIFTS + ROTATIONS, "flip": (("flip", None),)}


def axis_rotation(axis, degrees):
    """3x3 rotation about x (0), y (1) or z (2)."""
    c, s = math.cos(math.radians(degrees)), math.sin(math.radians(degrees))
    first, second = [i for i in range(3) if i != axis]
    matrix = np.eye(3)
    matrix[[first, first, second, second], [first, second, first, second]] = c, -s, s, c
    return matrix


def transformed(windows, kind, value, triples):
    """A copy of raw-unit windows [N, C, T]: shifted by `value` steps, rotated by `value` = (axis,
    degrees) or turned half about x (every sensor's x/y/z together), or scaled by `value`."""
    if kind == "shift":
        return np.roll(windows, value, axis=2)
    if kind == "scale":
        return (windows * value).astype(np.float32)
    matrix = axis_rotation(*value) if kind == "rotate" else np.diag([1.0, -1.0, -1.0])
    out = windows.copy()
    for triple in triples:
        out[:, triple] = np.einsum("ij,njt->nit", matrix, windows[:, triple])
    return out


def score_outer_fold(checkpoint, device):
    """{set name: (accuracy, {person: accuracy})} of one outer fold's model on its held-out people."""
    bundle = load_bundle(checkpoint)
    data = splits_as_trained(bundle.config, bundle.config.data.dataset, bundle.config.data.data_dir)
    test, triples = data.test, sensor_triples(data.channel_names)
    copies = {copy for chosen in TTA_SETS.values() for copy in chosen}
    probs = {copy: probabilities(bundle, transformed(test.signals, *copy, triples), device) for copy in copies}
    plain = probabilities(bundle, test.signals, device)
    scores = {}
    for name, chosen in TTA_SETS.items():
        predictions = np.mean([plain, *(probs[copy] for copy in chosen)], axis=0).argmax(axis=1)
        people, _ = per_subject_accuracy(test.labels, predictions, test.subjects)
        scores[name] = (float(np.mean(predictions == test.labels)), {p: row["accuracy"] for p, row in people.items()})
    return scores


def main(argv=None):
    parser = entry_parser("studies.tta_nested", __doc__)
    parser.add_argument("--run", required=True, help="one configuration's folder of studies.nested_cv")
    parser.add_argument("--checkpoint", default="best.pt", help="each outer fold's file, e.g. ensemble.pt")
    parser.add_argument("--device", default="auto")
    opts = parser.parse_args(argv)
    folds = outer_fold_dirs(opts.run, opts.checkpoint)
    if not folds:
        parser.exit(2, f"error: no outer-*/{opts.checkpoint} under {opts.run}; run studies.nested_cv first\n")
    device = pick_device(opts.device)
    by_fold = {run_dir.name: score_outer_fold(run_dir / opts.checkpoint, device) for run_dir in folds}
    print(f"{len(folds)} outer folds of {opts.run} ({opts.checkpoint}); accuracy on each fold's held-out people")
    print(f"{'copies':>13} {'mean':>7} {'worst':>7}  {'worst person':>12}  per fold ({', '.join(by_fold)})")
    for name in TTA_SETS:
        accuracies = [scores[name][0] for scores in by_fold.values()]
        people = {person: acc for scores in by_fold.values() for person, acc in scores[name][1].items()}
        worst = min(people, key=people.get)
        print(f"{name:>13} {statistics.fmean(accuracies):7.4f} {min(accuracies):7.4f}  "
              f"{worst:>5} {people[worst]:.4f}  " + " ".join(f"{a:.4f}" for a in accuracies))


if __name__ == "__main__":
    sys.exit(run_entry_point(main))
