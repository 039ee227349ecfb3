"""The scaling report's PNG figures: speedup and efficiency, throughput, epoch time, extrapolation."""
import numpy as np

from evaluation.figures import pyplot
from profiling.scaling import extrapolate, group_key, measured_link, row_key

plt = pyplot()

DPI = 130
MEASURED, PREDICTED, IDEAL = "#1f77b4", "#ff7f0e", "black"


def write_figures(rows, profiles, predict_gpus, output_dir):
    """Write every figure into output_dir; returns their paths."""
    output_dir.mkdir(parents=True, exist_ok=True)
    labels = _config_labels(rows)
    paths = [_speedup_efficiency(rows, labels, output_dir / "speedup_efficiency.png"),
             _per_world_bars(rows, labels, "samples_per_s", "samples_per_s_std", "global samples/s",
                             "Throughput (mean +- std over runs)", output_dir / "throughput.png"),
             _per_world_bars(rows, labels, "epoch_time_s", None, "epoch time (s)",
                             "Epoch time = steps per epoch of the full training split x mean step time",
                             output_dir / "epoch_time.png"),
             _extrapolation(rows, profiles, predict_gpus, output_dir / "predicted_scaling.png")]
    return [path for path in paths if path is not None]


def _speedup_efficiency(rows, labels, path):
    worlds = sorted({r["world_size"] for r in rows if r["world_size"] > 1 and r["measured_speedup"] is not None})
    if not worlds:
        return None
    fig, axes = plt.subplots(len(worlds), 2, figsize=(11, 4 * len(worlds)), squeeze=False)
    x = np.arange(len(labels))
    for (ax_speed, ax_eff), n in zip(axes, worlds, strict=True):
        by_config = {row_key(r): r for r in rows if r["world_size"] == n}
        picked = [by_config.get(key) for key in labels]
        for ax, measured, predicted, ideal, unit in (
                (ax_speed, "measured_speedup", "predicted_speedup", n, "x"),
                (ax_eff, "measured_efficiency", "predicted_efficiency", 1.0, "")):
            values = [_value(r, measured) for r in picked]
            errors = [_value(r, "measured_speedup_std") / (1 if unit else n) for r in picked]
            ax.bar(x - 0.2, values, 0.4, yerr=errors, capsize=3, color=MEASURED, label="measured")
            ax.bar(x + 0.2, [_value(r, predicted) for r in picked], 0.4, color=PREDICTED,
                   label="predicted (1-process step + all-reduce)")
            ax.axhline(ideal, color=IDEAL, linestyle="--", label=f"ideal ({ideal:g}{unit})")
            for xi, value in zip(x, values, strict=True):  # inside the bar, clear of the error bar
                ax.text(xi - 0.2, value / 2, f"{value:.2f}{unit}" if unit else f"{value:.0%}", ha="center",
                        va="center", fontsize=8, color="white", rotation=90)
            ax.set_xticks(x, [labels[key] for key in labels])
            ax.set_ylim(0, max([ideal, *values, *[_value(r, predicted) for r in picked]]) * 1.35)
            ax.grid(axis="y", alpha=0.3)
        ax_speed.set_ylabel(f"speedup at {n} processes (x)")
        ax_speed.set_title(f"Speedup over 1 process, {n} processes (global samples/s)")
        ax_eff.set_ylabel("efficiency = speedup / N")
        ax_eff.set_title(f"Scaling efficiency, {n} processes")
        ax_speed.legend(fontsize=7.5, loc="upper left", ncol=3)
    return _save(fig, path)


def _per_world_bars(rows, labels, key, std_key, ylabel, title, path):
    worlds = sorted({r["world_size"] for r in rows})
    fig, ax = plt.subplots(figsize=(10, 4.5))
    x = np.arange(len(labels))
    width = 0.8 / len(worlds)
    for i, n in enumerate(worlds):
        by_config = {row_key(r): r for r in rows if r["world_size"] == n}
        values = [_value(by_config.get(k), key) for k in labels]
        errors = [_value(by_config.get(k), std_key) for k in labels] if std_key else None
        offset = (i - (len(worlds) - 1) / 2) * width
        bars = ax.bar(x + offset, values, width, yerr=errors, capsize=3, label=f"{n} process(es)")
        ax.bar_label(bars, labels=[f"{v:,.0f}" if v >= 100 else f"{v:.2f}" for v in values], fontsize=8, padding=2)
    ax.set_xticks(x, [labels[k] for k in labels])
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.margins(y=0.15)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def _extrapolation(rows, profiles, predict_gpus, path):
    """Predicted speedup against GPU count from each 1-process step and the largest run's link,
    with the measured points on top."""
    groups = {}
    for profile in profiles:
        groups.setdefault(group_key(profile), {})[profile["config"]["world_size"]] = profile
    fig, ax = plt.subplots(figsize=(7.5, 5))
    counts = sorted(set(predict_gpus) | {1})
    ax.plot(counts, counts, color=IDEAL, linestyle="--", label="ideal")
    drawn = False
    for key, by_world in sorted(groups.items()):
        multi = [n for n in by_world if n > 1 and measured_link(by_world[n])]
        if 1 not in by_world or not multi:
            continue
        link = measured_link(by_world[max(multi)])
        predicted = extrapolate(by_world[1], link, counts)
        line, = ax.plot(counts, [p["speedup"] for p in predicted], marker="o", label=f"{key[0]} bs{key[1]} predicted")
        measured = [r for r in rows if (r["model"], r["batch_size"]) == key[:2] and r["measured_speedup"] is not None]
        ax.scatter([r["world_size"] for r in measured], [r["measured_speedup"] for r in measured], marker="x", s=70,
                   color=line.get_color(), zorder=3)
        drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel("GPUs / processes (N)")
    ax.set_ylabel("speedup (global samples/s over 1)")
    ax.set_title("Predicted weak scaling (lines, no overlap) and measured (x)", fontsize=10)
    ax.set_xticks(counts)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def _config_labels(rows):
    """Ordered {(model, batch, precision, accumulation): tick label}."""
    labels = {}
    for row in rows:
        labels.setdefault(row_key(row), f"{row['model']}\nbatch {row['batch_size']}")
    return labels


def _value(row, key):
    if row is None or key is None or row.get(key) is None:
        return 0.0
    return row[key]


def _save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path
