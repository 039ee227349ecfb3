"""A recording that carries its own labels (the `label` column the store's converter reads), scored by
predict.py per sample: every sample of a class against the window that speaks for it; samples of no class
(unlabelled stretches, transitions) are left out and counted."""
import numpy as np

from inference.timeline import labels_at


def label_values(bundle):
    """The label value of each class of the checkpoint: its description's, else 1..K (UCI HAR's, and the
    converter's default)."""
    described = bundle.described
    if described is not None and described.labels_are_numbers():
        return tuple(int(value) for value in described.class_labels)
    return tuple(range(1, len(bundle.class_names) + 1))


def score_recording(recording, bundle, window_labels, predictions):
    """{accuracy, samples scored, left out, per class, subject} of the timeline's window labels (smoothed,
    uncertain counted as not right) against the recording's label column; None without one."""
    if "label" not in (recording.extra or {}):
        return None
    values = np.rint(recording.extra["label"]).astype(np.int64)
    index = {value: number for number, value in enumerate(label_values(bundle))}
    truth = np.array([index.get(int(value), -1) for value in values])
    times = recording.time_s if recording.time_s is not None else np.arange(len(values)) / predictions.source_rate_hz
    spoken = labels_at(np.asarray(times, dtype=np.float64), window_labels, predictions.start_s, predictions.end_s)
    scored = (truth >= 0) & (spoken >= 0)
    right = spoken[scored] == truth[scored]
    per_class = {name: float(right[truth[scored] == number].mean())
                 for number, name in enumerate(bundle.class_names) if np.any(truth[scored] == number)}
    subjects = np.unique(recording.extra["subject"]) if "subject" in recording.extra else []
    return {"accuracy": float(right.mean()) if len(right) else None, "samples_scored": int(scored.sum()),
            "samples_left_out": int(len(values) - scored.sum()), "per_class": per_class,
            "label_values": dict(zip(bundle.class_names, label_values(bundle), strict=True)),
            "subject": int(subjects[0]) if len(subjects) == 1 else None,
            "scored_as": "each labelled sample against the window that speaks for it, after smoothing; samples "
                         "of no class, and outside every window, left out; uncertain windows count as not right"}


def format_score(score):
    """One line for the summary."""
    if score["accuracy"] is None:
        return (f"labels: no sample of the recording carries a class's label value ({score['samples_left_out']} "
                "left out); nothing to score")
    classes = ", ".join(f"{name} {value:.3f}" for name, value in score["per_class"].items())
    return (f"labels: per-sample accuracy {score['accuracy']:.4f} over {score['samples_scored']:,} labelled samples "
            f"({score['samples_left_out']:,} of no class left out); {classes}")
