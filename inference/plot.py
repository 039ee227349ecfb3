"""timeline.png: the activity over time, the confidence under it, and the signal's magnitude.

Its cost stays flat in the length of a recording: the bars are one collection per class however many
segments there are, and a curve with more points than the figure has pixels is drawn as the range
(min to max) of each pixel column, which looks the same."""
import numpy as np

from evaluation.figures import pyplot  # the same Agg set-up as the training figures
from inference.timeline import timeline_names

FIGURE_WIDTH_IN, DPI = 12, 100
CURVE_COLUMNS = 2 * FIGURE_WIDTH_IN * DPI  # beyond this many points a curve is drawn as its range per column


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
    signal_ax.set_ylabel("|acc| (g)")
    signal_ax.set_xlabel("time (s)")
    signal_ax.grid(alpha=0.3)
    figure.savefig(path, dpi=DPI)
    plt.close(figure)


def draw_curve(ax, times, values, color, linewidth):
    """A line; past CURVE_COLUMNS points, the band from each column's minimum to its maximum."""
    if len(values) <= CURVE_COLUMNS:
        ax.plot(times, values, color=color, linewidth=linewidth)
        return
    centres, low, high = column_ranges(times, values, CURVE_COLUMNS)
    ax.fill_between(centres, low, high, color=color, linewidth=linewidth, step="mid")


def column_ranges(times, values, columns):
    """(centre time, min, max) of `values` in `columns` runs of consecutive points of equal length (the
    last one shorter), so that every point lies in exactly one."""
    per_column = -(-len(values) // columns)
    padded = np.full(per_column * columns, np.nan)
    padded[:len(values)] = values
    blocks = padded.reshape(columns, per_column)
    used = ~np.all(np.isnan(blocks), axis=1)
    centres = times[np.minimum(np.arange(columns) * per_column + per_column // 2, len(times) - 1)]
    return centres[used], np.nanmin(blocks[used], axis=1), np.nanmax(blocks[used], axis=1)
