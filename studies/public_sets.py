"""Public sets of other devices and kinds that aeon ships with its package, as .npz files of windows
for `main.py --dataset npz`: BasicMotions (a smartwatch's accelerometer and gyroscope, 10 Hz, four
activities), GunPoint (a hand's position, one channel), PickupGestureWiimoteZ (a Wii remote's
accelerometer z, unequal lengths) and JapaneseVowels (12 speech coefficients, unequal lengths: the
UEA multivariate kind). Each keeps its published train/test split (the `split` array); a window is
its own subject, since the sets name none. Series of unequal length are padded at their end with
NaN to the longest one, as main.py reads them (each over its own steps); aeon's MiniRocket takes
series of one length only, and studies.minirocket_baseline gives it each padded with its last value.
"""
import numpy as np

PUBLIC_SETS = ("BasicMotions", "GunPoint", "PickupGestureWiimoteZ", "JapaneseVowels")


def public_set_windows(name):
    """(signals float32 [N, C, T], labels str [N], split str [N], longest minus shortest length) of an
    aeon-bundled set; needs aeon (a benchmark dependency only)."""
    from aeon.datasets import load_classification
    parts = {split: load_classification(name, split=split) for split in ("train", "test")}
    series = [x for signals, _ in parts.values() for x in signals]
    lengths = [x.shape[-1] for x in series]
    longest = max(lengths)
    signals = np.stack([np.pad(x, ((0, 0), (0, longest - x.shape[-1])), constant_values=np.nan) for x in series])
    labels = np.concatenate([np.asarray(labels, dtype=str) for _, labels in parts.values()])
    split = np.concatenate([np.full(len(labels), split) for split, (_, labels) in parts.items()])
    return signals.astype(np.float32), labels, split, longest - min(lengths)


def write_public_set(name, path):
    """The set as --dataset npz reads it, at `path`; returns (train windows, test windows, channels,
    steps, classes, padded: whether any series was padded)."""
    signals, labels, split, spread = public_set_windows(name)
    np.savez(path, signals=signals, labels=labels, subjects=np.arange(len(labels)), split=split)
    return (int((split == "train").sum()), int((split == "test").sum()), signals.shape[1], signals.shape[2],
            len(np.unique(labels)), spread > 0)
