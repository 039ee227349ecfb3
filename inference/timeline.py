"""From a sequence of window probabilities to a timeline: smoothing, segments, per-sample labels, and
timeline.png (the activity over time, the confidence under it, and the signal's magnitude)."""
from dataclasses import dataclass

import numpy as np
from scipy.ndimage import median_filter

from evaluation.figures import pyplot  # the same Agg set-up as the training figures

SMOOTHERS = ("median", "hmm")
MEDIAN_WINDOWS = 5  # at the default half-window stride, about 6.4 s of UCI HAR windows
# Activities last tens of seconds while a window steps on every 1.28 s, so a change of
# activity between two neighbouring windows is rare: 2% makes the expected stretch ~64 s.
SWITCH_PROBABILITY = 0.02
UNCERTAIN = "uncertain"  # the timeline's name for windows the model is too unsure of, when asked for
# timeline.png's cost stays flat in the length of a recording: the bars are one collection per class
# however many segments there are, and a curve with more points than the figure has pixels is drawn
# as the range (min to max) of each pixel column, which looks the same.
FIGURE_WIDTH_IN, DPI = 12, 100
CURVE_COLUMNS = 2 * FIGURE_WIDTH_IN * DPI  # beyond this many points a curve is drawn as its range per column


@dataclass
class Segment:
    start_s: float
    end_s: float
    activity: str
    confidence: float  # mean probability of `activity` over the segment's windows


def smooth_labels(probabilities, method=None, median_windows=MEDIAN_WINDOWS, switch_probability=SWITCH_PROBABILITY,
                  transitions=None):
    """Class index per window: argmax, argmax of per-class running medians, or the Viterbi path
    (through `transitions` [from, to] when given, else the sticky matrix of `switch_probability`)."""
    if method is None or len(probabilities) == 0:
        return np.argmax(probabilities, axis=1)
    if method == "median":
        return np.argmax(median_filter(probabilities, size=(median_windows, 1), mode="nearest"), axis=1)
    if method == "hmm":
        return viterbi(probabilities, switch_probability, transitions)
    raise ValueError(f"unknown smoothing {method!r}; choose one of {', '.join(SMOOTHERS)}")


def sticky_transitions(classes, switch_probability):
    """[from, to]: stay with 1 - switch_probability, change to each other class alike."""
    matrix = np.full((classes, classes), switch_probability / max(classes - 1, 1))
    np.fill_diagonal(matrix, 1.0 - switch_probability)
    return matrix


def viterbi(probabilities, switch_probability=SWITCH_PROBABILITY, transitions=None):
    """Most likely class path under a row-stochastic transition matrix [from, to] (default the
    sticky one), with the window probabilities standing in for the likelihoods and a uniform prior
    over the first window's class. A zero in the matrix is a change the path never makes."""
    count, classes = probabilities.shape
    log_emission = np.log(np.clip(probabilities, 1e-12, None))
    matrix = sticky_transitions(classes, switch_probability) if transitions is None else np.asarray(transitions)
    with np.errstate(divide="ignore"):  # log 0 = -inf: that change is impossible, not merely unlikely
        log_transition = np.log(matrix)
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


def mark_uncertain(labels, probabilities, below):
    """`labels` with every window whose own top probability is under `below` set to the index one
    past the classes (UNCERTAIN in the timeline); `below` None marks none."""
    if below is None:
        return labels
    return np.where(probabilities.max(axis=1) < below, probabilities.shape[1], labels)


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
        if label == len(class_names):  # mark_uncertain's label: the confidence it had in its best guess
            name, confidence = UNCERTAIN, probabilities[first:stop].max(axis=1).mean()
        else:
            name, confidence = class_names[label], probabilities[first:stop, label].mean()
        segments.append(Segment(float(own_start[first]), float(own_end[stop - 1]), name, float(confidence)))
    return segments


def labels_at(times_s, labels, start_s, end_s):
    """The window label that speaks for each time in `times_s` (-1 outside the windows)."""
    own_start, own_end = owned_spans(start_s, end_s)
    index = np.searchsorted(own_end, times_s, side="right")
    inside = (times_s >= own_start[0]) & (times_s < own_end[-1])
    return np.where(inside, labels[np.minimum(index, len(labels) - 1)], -1)


def timeline_names(class_names, segments):
    """The class names, and UNCERTAIN after them when a segment carries it."""
    return (*class_names, UNCERTAIN) if any(s.activity == UNCERTAIN for s in segments) else tuple(class_names)


def time_per_activity(segments, class_names):
    """Seconds per class (every class listed, in class order)."""
    totals = dict.fromkeys(class_names, 0.0)
    for segment in segments:
        totals[segment.activity] += segment.end_s - segment.start_s
    return totals


def format_summary(segments, class_names, header):
    class_names = timeline_names(class_names, segments)
    totals = time_per_activity(segments, class_names)
    whole_s = sum(totals.values()) or 1.0
    width = max(len(name) for name in class_names)
    lines = [header, f"{'activity':<{width}}  {'time':>9}  share  segments"]
    for name in class_names:
        count = sum(segment.activity == name for segment in segments)
        minutes, seconds = divmod(totals[name], 60)
        clock = f"{int(minutes)}:{seconds:04.1f}"
        lines.append(f"{name:<{width}}  {clock:>9}  {totals[name] / whole_s:5.1%}  {count:8d}")
    return "\n".join(lines)


def plot_timeline(predictions, segments, path, title):
    plt = pyplot()
    names = list(timeline_names(predictions.class_names, segments))
    colours = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
    figure, (activity_ax, confidence_ax, signal_ax) = plt.subplots(
        3, 1, figsize=(FIGURE_WIDTH_IN, 2.2 + 0.3 * len(names) + 3.2), sharex=True,
        gridspec_kw={"height_ratios": [max(2, 0.45 * len(names)), 1.2, 1.2]}, constrained_layout=True)
    spans = {name: [] for name in names}  # one bar collection per class
    for segment in segments:
        spans[segment.activity].append((segment.start_s, segment.end_s - segment.start_s))
    for row, name in enumerate(names):
        if spans[name]:
            activity_ax.broken_barh(spans[name], (row - 0.4, 0.8), color=colours(row % colours.N))
    activity_ax.set_yticks(range(len(names)), names, fontsize=8)
    activity_ax.set_ylim(-0.6, len(names) - 0.4)
    activity_ax.set_title(title)
    activity_ax.grid(axis="x", alpha=0.3)
    centres_s = (predictions.start_s + predictions.end_s) / 2
    draw_curve(confidence_ax, centres_s, predictions.probabilities.max(axis=1), color="black", linewidth=0.8)
    confidence_ax.set_ylim(0, 1.02)
    confidence_ax.set_ylabel("confidence")
    confidence_ax.grid(alpha=0.3)
    times_s = predictions.start_s_of_stream + np.arange(len(predictions.acc_magnitude_g)) / predictions.sample_rate_hz
    draw_curve(signal_ax, times_s, predictions.acc_magnitude_g, color="tab:grey", linewidth=0.4)
    signal_ax.set_ylabel(predictions.magnitude_label)
    signal_ax.set_xlabel("time (s)")
    signal_ax.grid(alpha=0.3)
    figure.savefig(path, dpi=DPI)
    plt.close(figure)


def draw_curve(ax, times, values, color, linewidth):
    """A line; past CURVE_COLUMNS points, the band from the minimum to the maximum of each column's run
    of consecutive points (runs of equal length, the last one shorter)."""
    if len(values) <= CURVE_COLUMNS:
        ax.plot(times, values, color=color, linewidth=linewidth)
        return
    per_column = -(-len(values) // CURVE_COLUMNS)
    starts = np.arange(0, len(values), per_column)
    centres = times[np.minimum(starts + per_column // 2, len(times) - 1)]
    ax.fill_between(centres, np.minimum.reduceat(values, starts), np.maximum.reduceat(values, starts),
                    color=color, linewidth=linewidth, step="mid")
