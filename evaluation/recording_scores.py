"""Scores of whole labelled recordings, per person: per-sample accuracy, per-sample calibration, and
what marking unsure windows as uncertain costs and gains. A model for new people is judged by its
worst person and the spread between people, not only by the mean."""
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from evaluation.calibration import expected_calibration_error


@dataclass
class PersonSamples:
    """One person's scored samples under one option, gathered over their recordings."""
    correct: list = field(default_factory=list)  # bool arrays: prediction == label
    uncertain: list = field(default_factory=list)  # bool arrays: marked uncertain (counted as not right)

    def add(self, predicted, labels, uncertain=None):
        self.correct.append(np.asarray(predicted) == np.asarray(labels))
        self.uncertain.append(np.zeros(len(labels), bool) if uncertain is None else np.asarray(uncertain))

    def arrays(self):
        return np.concatenate(self.correct), np.concatenate(self.uncertain)

    def accuracy(self):
        correct, uncertain = self.arrays()
        return float(np.mean(correct & ~uncertain))


class RecordingTally:
    """{option: {person: PersonSamples}} with the per-person and overall summaries."""

    def __init__(self):
        self.samples = defaultdict(lambda: defaultdict(PersonSamples))
        self.calibration = defaultdict(lambda: defaultdict(list))  # option -> person -> [(probs, labels)]

    def add(self, option, person, predicted, labels, uncertain=None):
        self.samples[option][person].add(predicted, labels, uncertain)

    def add_calibration(self, option, person, probabilities, labels):
        """Per-sample probabilities of the windows (unsmoothed) and the samples' labels, for ECE."""
        self.calibration[option][person].append((probabilities, labels))

    def person_accuracy(self, option):
        """{person: per-sample accuracy} (samples marked uncertain count as wrong)."""
        return {person: samples.accuracy() for person, samples in sorted(self.samples[option].items())}

    def summary(self, option):
        accuracy = self.person_accuracy(option)
        worst = min(accuracy, key=accuracy.get)
        values = np.array(list(accuracy.values()))
        row = {"mean": float(values.mean()), "worst_person": int(worst), "worst": accuracy[worst],
               "spread": float(values.max() - values.min()), "people": len(values),
               "per_person": {str(person): value for person, value in accuracy.items()}}
        correct, uncertain = (np.concatenate(parts) for parts in
                              zip(*(s.arrays() for s in self.samples[option].values()), strict=True))
        row["pooled"] = float(np.mean(correct & ~uncertain))
        if uncertain.any():
            row.update(uncertain_share=float(uncertain.mean()), uncertain_samples=int(uncertain.sum()),
                       kept_accuracy=float(correct[~uncertain].mean()) if (~uncertain).any() else 0.0,
                       wrong_among_uncertain=float(1 - correct[uncertain].mean()))
        if option in self.calibration:
            row.update(self.calibration_summary(option))
        return row

    def calibration_summary(self, option):
        per_person = {}
        pooled = [], []
        for person, parts in sorted(self.calibration[option].items()):
            probabilities, labels = (np.concatenate(p) for p in zip(*parts, strict=True))
            per_person[str(person)] = expected_calibration_error(probabilities, labels)
            pooled[0].append(probabilities)
            pooled[1].append(labels)
        worst = max(per_person, key=per_person.get)
        return {"ece": expected_calibration_error(np.concatenate(pooled[0]), np.concatenate(pooled[1])),
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
