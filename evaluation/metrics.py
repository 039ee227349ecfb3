"""Classification metrics from labels and predictions, all read off one confusion matrix.

Computed in numpy rather than imported from scikit-learn, whose import costs every training
process (each rank of a torchrun job) more than a second; the definitions are scikit-learn's, with
zero_division=0, and the tests hold them against it.
"""
import numpy as np


def confusion_matrix(labels, predictions, num_classes):
    """[true class, predicted class] counts."""
    labels, predictions = np.asarray(labels, dtype=np.int64), np.asarray(predictions, dtype=np.int64)
    cells = np.bincount(labels * num_classes + predictions, minlength=num_classes * num_classes)
    return cells.reshape(num_classes, num_classes)


def per_class_scores(matrix):
    """(precision, recall, F1, support) per class; a ratio with nothing to divide by is 0."""
    hits, predicted, support = np.diag(matrix), matrix.sum(axis=0), matrix.sum(axis=1)
    return (_ratio(hits, predicted), _ratio(hits, support), _ratio(2 * hits, predicted + support), support)


def _ratio(numerator, denominator):
    return np.divide(numerator, denominator, out=np.zeros(len(numerator)), where=denominator > 0)


def summary_metrics(labels, predictions, num_classes):
    """Accuracy and macro-F1 (over every class, present or not), the figures logged every epoch."""
    return _summary(confusion_matrix(labels, predictions, num_classes))


def _summary(matrix):
    total = matrix.sum()
    if total == 0:
        return {"acc": 0.0, "macro_f1": 0.0}
    return {"acc": float(np.trace(matrix) / total), "macro_f1": float(per_class_scores(matrix)[2].mean())}


def per_subject_accuracy(labels, predictions, subjects):
    """{subject id (as text, for JSON): {"accuracy", "windows"}}, and the worst subject's id: a model
    for new people is judged by the person it fails, not only by the mean."""
    labels, predictions, subjects = (np.asarray(a) for a in (labels, predictions, subjects))
    table = {str(int(subject)): {"accuracy": float(np.mean(predictions[subjects == subject] ==
                                                           labels[subjects == subject])),
                                 "windows": int(np.sum(subjects == subject))} for subject in np.unique(subjects)}
    worst = min(table, key=lambda subject: table[subject]["accuracy"]) if table else None
    return table, worst


def best_record(records):
    """The metrics.jsonl epoch record best.pt holds: the first with the highest validation macro-F1,
    or the last one when no epoch was validated (--val-fraction 0)."""
    validated = [record for record in records if record["val_macro_f1"] is not None]
    return max(validated, key=lambda record: record["val_macro_f1"]) if validated else records[-1]


def classification_report(labels, predictions, class_names):
    """The JSON-ready test report: overall figures, per-class figures and the confusion matrix."""
    matrix = confusion_matrix(labels, predictions, len(class_names))
    precision, recall, f1, support = per_class_scores(matrix)
    summary = _summary(matrix)  # the same matrix, not counted again
    return {"accuracy": summary["acc"], "macro_f1": summary["macro_f1"],  # named as scikit-learn names them
            "num_samples": int(len(labels)), "class_names": list(class_names),
            "per_class": {name: {"precision": float(precision[i]), "recall": float(recall[i]),
                                 "f1": float(f1[i]), "support": int(support[i])}
                          for i, name in enumerate(class_names)},
            "confusion_matrix": matrix.tolist()}  # rows are true classes, columns predicted classes


def format_report(report):
    """A readable table of the test report for the console."""
    names = report["class_names"]
    width = max(len(name) for name in names)
    lines = [f"{'class':<{width}}  precision  recall     f1  support"]
    for name in names:
        row = report["per_class"][name]
        lines.append(f"{name:<{width}}  {row['precision']:9.3f}  {row['recall']:6.3f}  {row['f1']:5.3f}  "
                     f"{row['support']:7d}")
    lines.append(f"accuracy {report['accuracy']:.4f}   macro-F1 {report['macro_f1']:.4f}   "
                 f"({report['num_samples']} windows)")
    lines.append("confusion matrix (rows true, columns predicted; order as above):")
    lines.extend("  " + " ".join(f"{count:5d}" for count in row) for row in report["confusion_matrix"])
    return "\n".join(lines)


PEOPLE_SHOWN = 20  # more people than this (a set whose every window is its own subject) show the worst only


def shown_people(values, worst_is_lowest=True):
    """What a per-person line lists of {subject: value}: ('' and every pair in order), or where there
    are more than PEOPLE_SHOWN people, (the words that say so, the PEOPLE_SHOWN worst pairs)."""
    pairs = list(values.items())
    if len(pairs) <= PEOPLE_SHOWN:
        return "", pairs
    worst = sorted(pairs, key=lambda pair: pair[1], reverse=not worst_is_lowest)[:PEOPLE_SHOWN]
    return f", the {PEOPLE_SHOWN} worst of {len(pairs)} (all in the report)", worst


def format_people(report):
    """One line of a report's per-person accuracies, then its worst person."""
    people, worst = report["per_subject"], report["worst_subject"]
    words, shown = shown_people({subject: row["accuracy"] for subject, row in people.items()})
    return (f"per person{words}: " + ", ".join(f"{subject} {value:.3f}" for subject, value in shown) +
            f"; worst: subject {worst} ({people[worst]['accuracy']:.3f})")


def format_cv_table(summary):
    """The cross-validation summary as a console table: one row per fold, then mean, std, worst."""
    has_test = "test_mean" in summary
    lines = [f"{'fold':>4}  {'best epoch':>10}  {'val acc':>7}  {'val F1':>6}" + ("  test acc" if has_test else "")
             + "  subjects"]
    for row in summary["folds"]:
        test = f"  {row['test_accuracy']:8.4f}" if has_test else ""
        lines.append(f"{row['fold']:>4}  {row['best_epoch']:>10}  {row['val_accuracy']:7.4f}  "
                     f"{row['val_macro_f1']:6.4f}{test}  {','.join(map(str, row['subjects']))}")
    for name in ("mean", "std", "worst"):
        lines.append(f"{name:>4}  {'':>10}  {summary[name]['accuracy']:7.4f}  {summary[name]['macro_f1']:6.4f}")
    if "worst_subject" in summary:
        worst = summary["worst_subject"]
        lines.append(f"worst person: subject {worst}, accuracy {summary['per_subject'][worst]['accuracy']:.4f} "
                     f"(every person's in cv_report.json)")
    lines.append(f"pooled accuracy over all held-out windows {summary['pooled_accuracy']:.4f}"
                 f"; worst fold {summary['worst']['fold']}; mean at the last epoch (no choice made on the "
                 f"fold) {summary['last_epoch_mean']['accuracy']:.4f}")
    if has_test:
        lines.append(f"test split, mean over the fold models: accuracy {summary['test_mean']['accuracy']:.4f}, "
                     f"macro-F1 {summary['test_mean']['macro_f1']:.4f}")
    refit = summary.get("refit", {})
    if "test_accuracy" in refit:
        lines.append(f"test split, the refit on every training subject: accuracy {refit['test_accuracy']:.4f}, "
                     f"macro-F1 {refit['test_macro_f1']:.4f} ({refit['save_dir']})")
    ensemble = summary.get("ensemble", {})
    if "test_accuracy" in ensemble:
        lines.append(f"test split, the ensemble of {len(ensemble['members'])} models: accuracy "
                     f"{ensemble['test_accuracy']:.4f}, macro-F1 {ensemble['test_macro_f1']:.4f} ({ensemble['path']})")
    return "\n".join(lines)
