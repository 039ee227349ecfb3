"""PNG pictures of a run: the confusion matrix and the training curves (matplotlib, Agg backend)."""
import json
from pathlib import Path

import numpy as np

from evaluation.metrics import best_record


def pyplot():
    """matplotlib.pyplot on the Agg backend, imported only when a picture is drawn."""
    import matplotlib
    matplotlib.use("Agg")  # files only: no display on servers and CI
    import matplotlib.pyplot as plt
    return plt


def plot_confusion_matrix(matrix, class_names, path, title="confusion matrix"):
    """Counts on the left, rows normalised to recall on the right; rows are the true classes."""
    plt = pyplot()
    counts = np.asarray(matrix, dtype=np.int64)
    row_totals = counts.sum(axis=1, keepdims=True)
    recall = np.divide(counts, row_totals, out=np.zeros(counts.shape), where=row_totals > 0)
    size = 2.2 + 0.75 * len(class_names)
    figure, axes = plt.subplots(1, 2, figsize=(2 * size + 1.5, size), constrained_layout=True)
    for ax, values, label, fmt in ((axes[0], counts, "windows", "d"), (axes[1], recall, "share of the row", ".2f")):
        image = ax.imshow(values, cmap="Blues", vmin=0)
        figure.colorbar(image, ax=ax, shrink=0.8, label=label)
        ax.set_xticks(range(len(class_names)), class_names, rotation=45, ha="right", fontsize=8)
        ax.set_yticks(range(len(class_names)), class_names, fontsize=8)
        ax.set_xlabel("predicted")
        ax.set_ylabel("true")
        threshold = values.max() / 2 if values.size else 0
        for (row, col), value in np.ndenumerate(values):
            ax.text(col, row, format(value, fmt), ha="center", va="center", fontsize=7,
                    color="white" if value > threshold else "black")
    axes[0].set_title(f"{title}: counts")
    axes[1].set_title(f"{title}: row-normalised")
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_curves(records, path, best_epoch=None):
    """Loss, validation accuracy / macro-F1 and LR per epoch from metrics.jsonl records."""
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator
    epochs = [r["epoch"] for r in records]
    validated = [r for r in records if r["val_loss"] is not None]  # none under --val-fraction 0
    figure, (loss_ax, score_ax, lr_ax) = plt.subplots(1, 3, figsize=(14, 4), constrained_layout=True)
    loss_ax.plot(epochs, [r["train_loss"] for r in records], marker=".", label="train")
    for ax, key, label in ((loss_ax, "val_loss", "validation"), (score_ax, "val_acc", "val accuracy"),
                           (score_ax, "val_macro_f1", "val macro-F1")):
        ax.plot([r["epoch"] for r in validated], [r[key] for r in validated], marker=".", label=label)
    loss_ax.set_title("loss")
    score_ax.set_title("validation" if validated else "validation: none (--val-fraction 0)")
    lr_ax.plot(epochs, [r["lr"] for r in records], marker=".")
    lr_ax.set_title("learning rate (end of epoch)")
    for ax in (loss_ax, score_ax, lr_ax):
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs are whole: no 1.25
        ax.grid(alpha=0.3)
        if best_epoch is not None:
            ax.axvline(best_epoch, color="grey", linestyle="--", linewidth=1, label=f"best (epoch {best_epoch})")
    loss_ax.legend()
    score_ax.legend()
    figure.savefig(path, dpi=110)
    plt.close(figure)


CURVES, CONFUSION = "curves.png", "confusion_matrix.png"  # what write_run_figures draws in a run folder
RUN_FIGURES = (CURVES, CONFUSION)


def write_run_figures(save_dir, warn, use_test=True):
    """curves.png from metrics.jsonl and confusion_matrix.png from test_report.json (from
    val_report.json when there is none, or when `use_test` is off: --no-test), for whatever of
    them exists. Drawing is a convenience: a failure is a warning, never a failed run."""
    save_dir = Path(save_dir)
    written = []
    try:
        metrics = save_dir / "metrics.jsonl"
        if metrics.is_file():
            records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
            if records:
                best = best_record(records)["epoch"]
                plot_curves(records, save_dir / CURVES, best_epoch=best)
                written.append(save_dir / CURVES)
        for split in ("test", "val") if use_test else ("val",):
            report_path = save_dir / f"{split}_report.json"
            if report_path.is_file():
                report = json.loads(report_path.read_text())
                plot_confusion_matrix(report["confusion_matrix"], report["class_names"],
                                      save_dir / CONFUSION,
                                      title="test split" if split == "test" else "validation split")
                written.append(save_dir / CONFUSION)
                break
    except Exception as exc:  # noqa: BLE001 - any failure to draw must leave the run's result alone
        warn(f"could not draw the run's figures ({type(exc).__name__}: {exc}); the results are unaffected")
    return written
