"""From a sequence of window probabilities to a timeline: smoothing, segments, per-sample labels."""
from dataclasses import dataclass

import numpy as np
from scipy.ndimage import median_filter

SMOOTHERS = ("median", "hmm")
MEDIAN_WINDOWS = 5  # at the default half-window stride, about 6.4 s of UCI HAR windows
# Activities last tens of seconds while a window steps on every 1.28 s, so a change of
# activity between two neighbouring windows is rare: 2% makes the expected stretch ~64 s.
SWITCH_PROBABILITY = 0.02


@dataclass
class Segment:
    start_s: float
    end_s: float
    activity: str
    confidence: float  # mean probability of `activity` over the segment's windows


def smooth_labels(probabilities, method=None, median_windows=MEDIAN_WINDOWS, switch_probability=SWITCH_PROBABILITY):
    """Class index per window: argmax, argmax of per-class running medians, or the Viterbi path."""
    if method is None or len(probabilities) == 0:
        return np.argmax(probabilities, axis=1)
    if method == "median":
        return np.argmax(median_filter(probabilities, size=(median_windows, 1), mode="nearest"), axis=1)
    if method == "hmm":
        return viterbi(probabilities, switch_probability)
    raise ValueError(f"unknown smoothing {method!r}; choose one of {', '.join(SMOOTHERS)}")


def viterbi(probabilities, switch_probability):
    """Most likely class path when the class stays with 1 - switch_probability per window and
    the window probabilities stand in for the likelihoods (a uniform prior over classes)."""
    count, classes = probabilities.shape
    log_emission = np.log(np.clip(probabilities, 1e-12, None))
    log_transition = np.full((classes, classes), np.log(switch_probability / max(classes - 1, 1)))
    np.fill_diagonal(log_transition, np.log1p(-switch_probability))
    score = log_emission[0] - np.log(classes)
    came_from = np.zeros((count, classes), dtype=np.int64)
    for step in range(1, count):
        candidates = score[:, None] + log_transition  # [from, to]
        came_from[step] = np.argmax(candidates, axis=0)
        score = candidates[came_from[step], np.arange(classes)] + log_emission[step]
    path = np.empty(count, dtype=np.int64)
    path[-1] = int(np.argmax(score))
    for step in range(count - 1, 0, -1):
        path[step - 1] = came_from[step, path[step]]
    return path


def owned_spans(start_s, end_s):
    """The stretch of time each window speaks for: overlapping windows split their overlap at the
    midpoint between their centres; the first and last reach the ends of the recording."""
    centres = (start_s + end_s) / 2
    cuts = (centres[1:] + centres[:-1]) / 2
    return np.r_[start_s[0], cuts], np.r_[cuts, end_s[-1]]


def merge_segments(labels, probabilities, start_s, end_s, class_names):
    """Runs of equal labels as Segments covering the recording without gaps or overlaps."""
    own_start, own_end = owned_spans(start_s, end_s)
    edges = np.flatnonzero(np.diff(labels)) + 1
    segments = []
    for first, stop in zip(np.r_[0, edges], np.r_[edges, len(labels)], strict=True):
        label = int(labels[first])
        segments.append(Segment(float(own_start[first]), float(own_end[stop - 1]), class_names[label],
                                float(probabilities[first:stop, label].mean())))
    return segments


def labels_at(times_s, labels, start_s, end_s):
    """The window label that speaks for each time in `times_s` (-1 outside the windows)."""
    own_start, own_end = owned_spans(start_s, end_s)
    index = np.searchsorted(own_end, times_s, side="right")
    inside = (times_s >= own_start[0]) & (times_s < own_end[-1])
    return np.where(inside, labels[np.minimum(index, len(labels) - 1)], -1)


def time_per_activity(segments, class_names):
    """Seconds per class (every class listed, in class order)."""
    totals = dict.fromkeys(class_names, 0.0)
    for segment in segments:
        totals[segment.activity] += segment.end_s - segment.start_s
    return totals


def format_summary(segments, class_names, header):
    totals = time_per_activity(segments, class_names)
    whole_s = sum(totals.values()) or 1.0
    width = max(len(name) for name in class_names)
    lines = [header, f"{'activity':<{width}}  {'time':>9}  share  segments"]
    for name in class_names:
        count = sum(segment.activity == name for segment in segments)
        lines.append(f"{name:<{width}}  {_clock(totals[name]):>9}  {totals[name] / whole_s:5.1%}  {count:8d}")
    return "\n".join(lines)


def _clock(seconds):
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}:{rest:04.1f}"
