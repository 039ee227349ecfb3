"""The metrics every report holds, against scikit-learn's definitions (zero_division=0)."""
import numpy as np
import pytest
from sklearn import metrics as reference

from evaluation.metrics import PEOPLE_SHOWN, classification_report, format_people, summary_metrics


@pytest.mark.parametrize("seed", range(4))
def test_figures_equal_scikit_learn_with_absent_and_never_predicted_classes(seed):
    generator = np.random.default_rng(seed)
    labels = generator.integers(0, 5, size=200)  # class 5 never occurs
    predictions = np.where(generator.random(200) < 0.7, labels, generator.integers(0, 6, size=200))
    predictions[predictions == 3] = 2  # class 3 is never predicted
    classes = np.arange(6)
    names = [f"class{i}" for i in classes]

    report = classification_report(labels, predictions, names)
    precision, recall, f1, support = reference.precision_recall_fscore_support(
        labels, predictions, labels=classes, zero_division=0)
    for i, name in enumerate(names):
        row = report["per_class"][name]
        assert (row["precision"], row["recall"], row["f1"], row["support"]) == pytest.approx(
            (precision[i], recall[i], f1[i], support[i]), abs=1e-12)
    assert report["confusion_matrix"] == reference.confusion_matrix(labels, predictions, labels=classes).tolist()
    assert report["accuracy"] == pytest.approx(reference.accuracy_score(labels, predictions), abs=1e-12)
    assert report["macro_f1"] == pytest.approx(
        reference.f1_score(labels, predictions, labels=classes, average="macro", zero_division=0), abs=1e-12)


def test_an_empty_split_scores_zero():
    assert summary_metrics(np.array([], dtype=int), np.array([], dtype=int), 6) == {"acc": 0.0, "macro_f1": 0.0}


def test_the_people_line_lists_everyone_up_to_twenty_then_the_lowest_twenty():
    def report(count):
        people = {str(index): {"accuracy": 1.0 - index / 200} for index in range(count)}
        return {"per_subject": people, "worst_subject": str(count - 1)}

    few = format_people(report(PEOPLE_SHOWN))
    assert few.startswith("per person: 0 1.000, 1 0.995") and few.count(",") == PEOPLE_SHOWN - 1
    many = format_people(report(150))
    listed = many.split(": ", 1)[1].split("; worst")[0].split(", ")
    assert many.startswith(f"per person, the {PEOPLE_SHOWN} worst of 150 (all in the report): ")
    assert [entry.split()[0] for entry in listed] == [str(index) for index in range(149, 129, -1)]
    assert many.endswith("; worst: subject 149 (0.255)")
