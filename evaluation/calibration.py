"""Calibration: how sure a model is against how often it is right (the expected calibration error),
and temperature scaling (Guo et al., "On Calibration of Modern Neural Networks", 2017): one number T,
fitted on held-out windows, divides the logits; every window's argmax, and so the accuracy, stays.

The probabilities are enough to scale: log p differs from the logits by one constant per window,
which softmax removes, so softmax(log p / T) = softmax(logits / T), for an ensemble's averaged
probabilities too.
"""
import numpy as np
import torch

from evaluation.metrics import shown_people

ECE_BINS = 15  # equal-width confidence bins, the usual choice since Guo et al. (2017)
CALIBRATION_FILE = "calibration.json"  # a temperature and where it was fitted, beside a checkpoint or a report
# The temperatures that still say something: above 100 every gap between log-probabilities shrinks a
# hundredfold (a window 10^6 times surer of one class comes out 1.15 times surer), so confidences turn
# uniform; below 0.01 they all become 0 or 1, and near float's smallest numbers NaN. Fitted ones sit
# at 0.35 to 0.69 (docs/training.md), far inside.
TEMPERATURE_RANGE = (0.01, 100.0)


def expected_calibration_error(probabilities, labels, bins=ECE_BINS):
    """Over equal-width bins of the top probability, the window-weighted mean of |accuracy - mean confidence|."""
    probabilities, labels = np.asarray(probabilities, dtype=np.float64), np.asarray(labels, dtype=np.int64)
    if len(labels) == 0:
        return 0.0
    confidence = probabilities.max(axis=1)
    correct = (probabilities.argmax(axis=1) == labels).astype(np.float64)
    # Bin b holds confidences in (b/bins, (b+1)/bins]; a confidence of exactly 0 joins the first.
    which = np.clip(np.ceil(confidence * bins).astype(np.int64) - 1, 0, bins - 1)
    counts = np.bincount(which, minlength=bins)
    gaps = np.abs(np.bincount(which, correct, bins) - np.bincount(which, confidence, bins))
    return float(gaps.sum() / counts.sum())


def per_subject_calibration(probabilities, labels, subjects, bins=ECE_BINS):
    """{subject id (as text): expected calibration error of that person's windows}."""
    probabilities, labels, subjects = (np.asarray(a) for a in (probabilities, labels, subjects))
    return {str(int(subject)): expected_calibration_error(probabilities[subjects == subject],
                                                          labels[subjects == subject], bins)
            for subject in np.unique(subjects)}


def _log_probabilities(probabilities):
    return torch.log(torch.as_tensor(np.asarray(probabilities), dtype=torch.float64).clamp_min(1e-300))


def fit_temperature(probabilities, labels):
    """The T in TEMPERATURE_RANGE minimising the mean NLL under softmax(log p / T). The NLL is convex in
    b = 1 / T: its slope, the mean over windows of (log p's mean under softmax(b log p)) - log p of the
    label, rises with b. Its zero is found by bisection on log b to float precision, or it lies beyond
    the range and the nearer end is the range's best. (A torch.optim optimizer would import
    torch._dynamo when built, about a second of a small run's start.)"""
    if len(labels) == 0:
        return 1.0
    log_p = _log_probabilities(probabilities)
    labelled = log_p.gather(1, torch.as_tensor(np.asarray(labels), dtype=torch.int64)[:, None]).mean()

    def slope(log_b):
        weights = torch.softmax(log_p * np.exp(log_b), dim=1)
        return float((weights * log_p).sum(dim=1).mean() - labelled)

    low, high = TEMPERATURE_RANGE
    below, above = np.log(1 / high), np.log(1 / low)  # log b at T = high, and at T = low
    if slope(below) >= 0:
        return high
    if slope(above) <= 0:
        return low
    for _ in range(64):  # each halves the interval: 64 leave it below float precision
        middle = (below + above) / 2
        below, above = (middle, above) if slope(middle) < 0 else (below, middle)
    return float(1 / np.exp((below + above) / 2))


def scaled(probabilities, temperature):
    """softmax(log p / T) [N, classes] float64: the probabilities at temperature T (1 gives them back)."""
    if temperature == 1.0 or len(probabilities) == 0:
        return np.asarray(probabilities, dtype=np.float64)
    return torch.softmax(_log_probabilities(probabilities) / temperature, dim=1).numpy()


def calibration_fields(probabilities, labels, subjects, temperature=1.0):
    """A report's ECE overall and per person, and under "temperature" all that at a temperature other than 1."""
    fields = {"ece": expected_calibration_error(probabilities, labels),
              "ece_per_subject": per_subject_calibration(probabilities, labels, subjects), "ece_bins": ECE_BINS}
    if temperature != 1.0:
        tempered = scaled(probabilities, temperature)
        fields["temperature"] = {"value": temperature, "loss": mean_nll(tempered, labels),
                                 "ece": expected_calibration_error(tempered, labels),
                                 "ece_per_subject": per_subject_calibration(tempered, labels, subjects)}
    return fields


def mean_nll(probabilities, labels):
    labels = np.asarray(labels, dtype=np.int64)
    return float(-np.log(np.clip(np.asarray(probabilities)[np.arange(len(labels)), labels], 1e-12, None)).mean())


def format_calibration(report, fitted):
    """The ECE overall, then per person at the report's temperature; `fitted` is None for one given."""
    line = f"expected calibration error ({ECE_BINS} equal-width bins): {report['ece']:.4f} at temperature 1"
    tempered = report.get("temperature")
    if tempered is not None:
        where = f"fitted on {fitted['windows']} validation windows" if fitted else "given"
        line += f", {tempered['ece']:.4f} at temperature {tempered['value']:.3f} ({where})"
    elif fitted is None:
        line += " (no temperature: none given, or no validation split to fit one on)"
    people = (tempered or report)["ece_per_subject"]
    if not people:
        return line
    worst = max(people, key=people.get)
    words, shown = shown_people(people, worst_is_lowest=False)
    return (f"{line}\nper person ECE{'' if tempered is None else ' at that temperature'}{words}: "
            + ", ".join(f"{subject} {value:.3f}" for subject, value in shown)
            + f"; worst: subject {worst} ({people[worst]:.3f})")
