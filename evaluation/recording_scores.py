"""Scores of whole labelled recordings, per person: per-sample accuracy, per-sample calibration, and
what marking unsure windows as uncertain costs and gains. A model for new people is judged by its
worst person and the spread between people, not only by the mean."""
from collections import defaultdict

import numpy as np

from evaluation.calibration import expected_calibration_error


def _joined(parts):
    """[(a, b), ...] of one person's recordings as (all a, all b)."""
    return tuple(np.concatenate(column) for column in zip(*parts, strict=True))


class RecordingTally:
    """{option: {person: [(right, uncertain) per recording]}}, and the per-sample probabilities kept
    for calibration, with the per-person and overall summaries."""

    def __init__(self):
        self.samples = defaultdict(lambda: defaultdict(list))
        self.calibration = defaultdict(lambda: defaultdict(list))  # option -> person -> [(probs, labels)]

    def add(self, option, person, predicted, labels, uncertain=None):
        """Samples marked `uncertain` count as not right."""
        uncertain = np.zeros(len(labels), bool) if uncertain is None else np.asarray(uncertain)
        self.samples[option][person].append((np.asarray(predicted) == np.asarray(labels), uncertain))

    def add_calibration(self, option, person, probabilities, labels):
        """Per-sample probabilities of the windows (unsmoothed) and the samples' labels, for ECE."""
        self.calibration[option][person].append((probabilities, labels))

    def summary(self, option):
        people = {person: _joined(parts) for person, parts in sorted(self.samples[option].items())}
        accuracy = {person: float(np.mean(correct & ~uncertain)) for person, (correct, uncertain) in people.items()}
        worst = min(accuracy, key=accuracy.get)
        values = np.array(list(accuracy.values()))
        row = {"mean": float(values.mean()), "worst_person": int(worst), "worst": accuracy[worst],
               "spread": float(values.max() - values.min()), "people": len(values),
               "per_person": {str(person): value for person, value in accuracy.items()}}
        correct, uncertain = _joined(people.values())
        row["pooled"] = float(np.mean(correct & ~uncertain))
        if uncertain.any():
            row.update(uncertain_share=float(uncertain.mean()), uncertain_samples=int(uncertain.sum()),
                       kept_accuracy=float(correct[~uncertain].mean()) if (~uncertain).any() else 0.0,
                       wrong_among_uncertain=float(1 - correct[uncertain].mean()))
        if option in self.calibration:
            row.update(self.calibration_summary(option))
        return row

    def calibration_summary(self, option):
        people = {str(person): _joined(parts) for person, parts in sorted(self.calibration[option].items())}
        per_person = {person: expected_calibration_error(*joined) for person, joined in people.items()}
        worst = max(per_person, key=per_person.get)
        return {"ece": expected_calibration_error(*_joined(people.values())),
                "ece_mean_person": float(np.mean(list(per_person.values()))), "ece_worst_person": int(worst),
                "ece_worst": per_person[worst]}


def uncertain_threshold(probabilities, labels, grid=None):
    """The top-probability threshold, chosen on held-out windows, below which marking a window
    uncertain removes more wrong windows than right ones: the threshold that maximises (wrong
    below it) - (right below it); None when no threshold removes more wrong than right."""
    grid = np.round(np.arange(0.30, 0.96, 0.05), 2) if grid is None else np.asarray(grid)
    confidence = probabilities.max(axis=1)
    right = probabilities.argmax(axis=1) == labels
    gains = [int(np.sum(~right & (confidence < t)) - np.sum(right & (confidence < t))) for t in grid]
    best = int(np.argmax(gains))
    return float(grid[best]) if gains[best] > 0 else None
