"""timeline.png: the activity over time, the confidence under it, and the signal's magnitude."""
import numpy as np

from evaluation.figures import pyplot  # the same Agg set-up as the training figures


def plot_timeline(predictions, segments, path, title):
    plt = pyplot()
    names = list(predictions.class_names)
    colours = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
    figure, (activity_ax, confidence_ax, signal_ax) = plt.subplots(
        3, 1, figsize=(12, 2.2 + 0.3 * len(names) + 3.2), sharex=True,
        gridspec_kw={"height_ratios": [max(2, 0.45 * len(names)), 1.2, 1.2]}, constrained_layout=True)
    for segment in segments:
        row = names.index(segment.activity)
        activity_ax.broken_barh([(segment.start_s, segment.end_s - segment.start_s)], (row - 0.4, 0.8),
                                color=colours(row % colours.N))
    activity_ax.set_yticks(range(len(names)), names, fontsize=8)
    activity_ax.set_ylim(-0.6, len(names) - 0.4)
    activity_ax.set_title(title)
    activity_ax.grid(axis="x", alpha=0.3)
    centres_s = (predictions.start_s + predictions.end_s) / 2
    confidence_ax.plot(centres_s, predictions.probabilities.max(axis=1), color="black", linewidth=0.8)
    confidence_ax.set_ylim(0, 1.02)
    confidence_ax.set_ylabel("confidence")
    confidence_ax.grid(alpha=0.3)
    times_s = predictions.start_s_of_stream + np.arange(len(predictions.acc_magnitude_g)) / predictions.sample_rate_hz
    signal_ax.plot(times_s, predictions.acc_magnitude_g, color="tab:grey", linewidth=0.4)
    signal_ax.set_ylabel("|acc| (g)")
    signal_ax.set_xlabel("time (s)")
    signal_ax.grid(alpha=0.3)
    figure.savefig(path, dpi=100)
    plt.close(figure)
