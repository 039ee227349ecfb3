"""When multi-GPU pays: model size x per-GPU batch x strategy, measured on 1 and 2 ranks, predicted for more.

For every model size and batch, one 1-process profile and one 2-rank profile per strategy (DDP,
DDP with fp16 gradients, FSDP). Each strategy's prediction for N ranks comes from the 1-process
profile alone (its step, and the neighbour, straggler and DDP costs it measured) plus the
collectives the 2-rank run measured as microbenchmarks, never from the 2-rank step itself, so
the 2-rank column checks the prediction. Writes <out>/scaling_map.csv and scaling_map.png.

The load of a shared machine drifts over minutes, so --rounds K sweeps everything K times, each round
pairing its own 1-process and 2-rank profiles (A B A B): a round's speedup divides figures taken
minutes apart, never hours. The map gives the median over the rounds and the lowest and highest.

Run from the repository root: python -m benchmarks.scaling.map --out DIR (the same command on a GPU node
gives the GPU map).
"""
import csv
import math
import statistics
import sys
import time
from pathlib import Path

from benchmarks.scaling.report import profile_of
from profiling.comm_model import STRATEGIES, Exchange, predict_strategy
from profiling.entry_points import comma_choices, comma_counts, entry_parser
from profiling.scaling import link_from, topology_of
from profiling.topology import links_at
from training.config.checks import check_at_least
from training.entry_point import run_entry_point

# Transformer sizes from the default (~0.09M parameters) past 10M; the 3M one is the studies' second
# configuration (d_model 256, 4 blocks, 8 heads, FFN 1024).
SIZES = {"0.1M": [], "0.8M": ["--width", "128", "--depth", "4", "--ffn", "512"],
         "3.4M": ["--width", "256", "--depth", "4", "--heads", "8", "--ffn", "1024"],
         "10.6M": ["--width", "384", "--depth", "6", "--heads", "8", "--ffn", "1536"]}
PARALLEL_FLAGS = {"ddp": ["--multi-gpu", "ddp"], "ddp_fp16": ["--multi-gpu", "ddp", "--grad-compression", "fp16"],
                  "fsdp": ["--multi-gpu", "fsdp"]}
COLUMNS = ("size", "parameters", "batch_size", "strategy", "ranks", "measured_samples_per_s", "measured_speedup",
           "measured_speedup_low", "measured_speedup_high", "rounds", "predicted_samples_per_s", "predicted_speedup",
           "prediction_error", "bytes_sent_per_rank_mb", "model_state_mb_per_rank")
# What differs between rounds; the rest of a row is the same in every round.
ROUND_FIGURES = ("measured_samples_per_s", "measured_speedup", "predicted_samples_per_s", "predicted_speedup")


def build_parser():
    parser = entry_parser("benchmarks.scaling.map", __doc__)
    parser.add_argument("--out", required=True, help="scaling_map.csv, scaling_map.png and the profiles under runs/")
    parser.add_argument("--sizes", type=comma_choices(SIZES), default=list(SIZES), help=f"from {', '.join(SIZES)}")
    parser.add_argument("--batch-sizes", type=comma_counts, default=[16, 64], help="per GPU / process")
    parser.add_argument("--strategies", type=comma_choices(STRATEGIES), default=list(STRATEGIES),
                        help=f"from {', '.join(STRATEGIES)}")
    parser.add_argument("--predict-gpus", type=comma_counts, default=[2, 4, 8])
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--threads-per-rank", type=int, default=1, help="CPU: OMP_NUM_THREADS of every run")
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2, help="timed blocks of --steps within each profile")
    parser.add_argument("--rounds", type=int, default=1, help="sweeps of the whole map, each with its own profiles")
    parser.add_argument("--reuse", action="store_true", help="keep profiles already under <out>/runs")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks instead of one-line errors")
    return parser


def main(argv):
    args = build_parser().parse_args(argv)
    # Every count the sweep multiplies or divides by, checked before the first profile runs.
    check_at_least(("--batch-sizes", args.batch_sizes, 1), ("--predict-gpus", args.predict_gpus, 1),
                   ("--threads-per-rank", args.threads_per_rank, 1), ("--steps", args.steps, 1),
                   ("--repeats", args.repeats, 1), ("--rounds", args.rounds, 1),
                   ("--warmup-steps", args.warmup_steps, 0))
    # What profile_of reads besides these: the steps of each run (no phase pass), the world sizes the
    # 1-process profile also predicts, and no extra flags.
    args.phase_steps, args.world_sizes, args.profiler_args = 0, [1, 2], ""
    out, started, rounds = Path(args.out), time.perf_counter(), []
    for number in range(1, args.rounds + 1):
        runs, rows = out / "runs" / f"round{number}", []
        for size in args.sizes:
            for batch in args.batch_sizes:
                configuration = ["--model", "transformer", *SIZES[size], "--batch-size", str(batch)]
                print(f"round {number} of {args.rounds}: {size} parameters, batch {batch} "
                      f"({time.perf_counter() - started:.0f} s so far)", flush=True)
                baseline = profile_of(args, configuration, 1, runs / f"{size}_bs{batch}_1")
                measured = {name: profile_of(args, configuration, 2, runs / f"{size}_bs{batch}_2_{name}",
                                              PARALLEL_FLAGS[name]) for name in args.strategies}
                rows += map_rows(size, baseline, measured, args.predict_gpus)
        rounds.append(rows)
    rows = combine_rounds(rounds)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "scaling_map.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    write_map_figure(rows, out / "scaling_map.png")
    print(format_errors(rows))
    print(f"done in {time.perf_counter() - started:.0f} s; wrote {out / 'scaling_map.csv'}, {out / 'scaling_map.png'}")
    return 0


def map_rows(size, baseline, measured, predict_gpus):
    """Rows of one size and batch: the 1-process figure, then for each strategy its measured 2-rank
    figure and its predictions for every N of predict_gpus, each from `baseline` (its step, host
    effects and nodes) and the collectives the strategy's 2-rank run measured inside a node; a ring
    over more ranks than a node holds is paced by the baseline's link between nodes where slower."""
    model, base_timing = baseline["model"], baseline["timing"]
    step_1_s, samples_1 = base_timing["step_time_s"]["mean"], base_timing["samples_per_s"]["mean"]
    common = {"size": size, "parameters": model["parameters"], "batch_size": baseline["config"]["batch_size"]}
    rows = [{**common, "strategy": "one process", "ranks": 1, "measured_samples_per_s": samples_1,
             "measured_speedup": 1.0, "model_state_mb_per_rank": 4 * model["gradient_bytes"] / 2**20}]
    exchange = Exchange(model["gradient_bytes"], tuple(model["fsdp_unit_bytes"]))
    for name, profile in measured.items():
        # The collectives this strategy's ranks measured inside their node; between nodes the baseline's link.
        inside = {kind: link_from(entry) for kind, entry in profile["collective_links"].items()}
        topology = topology_of(baseline, inside)
        measured_samples = profile["timing"]["samples_per_s"]["mean"]
        for n in predict_gpus:
            predicted = predict_strategy(name, step_1_s, exchange, n, links_at(topology, n),
                                         baseline.get("host_effects"))
            row = {**common, "strategy": name, "ranks": n, "predicted_speedup": predicted["speedup"],
                   "predicted_samples_per_s": samples_1 * predicted["speedup"],
                   "bytes_sent_per_rank_mb": predicted["bytes_sent_per_rank"] / 2**20,
                   "model_state_mb_per_rank": predicted["model_state_bytes_per_rank"] / 2**20}
            if n == profile["config"]["world_size"]:
                measured_speedup = _ratio(measured_samples, samples_1)
                error = _ratio(predicted["speedup"], measured_speedup)
                row.update(measured_samples_per_s=measured_samples, measured_speedup=measured_speedup,
                           prediction_error=None if error is None else error - 1)
            rows.append(row)
    return rows


def combine_rounds(rounds):
    """One row per configuration from the rows of every round (each a list from map_rows, in the same
    order): the median of each round's figures, the lowest and highest measured speedup, and the
    prediction error of the medians."""
    combined = []
    for same in zip(*rounds, strict=True):
        row = {**same[0], "rounds": len(same)}
        for column in ROUND_FIGURES:
            values = [each[column] for each in same if each.get(column) is not None]
            row[column] = statistics.median(values) if values else None
        speedups = [each["measured_speedup"] for each in same if each.get("measured_speedup") is not None]
        if speedups:
            row.update(measured_speedup_low=min(speedups), measured_speedup_high=max(speedups))
        if row.get("prediction_error") is not None:
            error = _ratio(row["predicted_speedup"], row["measured_speedup"])
            row["prediction_error"] = None if error is None else error - 1
        combined.append(row)
    return combined


def _ratio(numerator, denominator):
    """numerator / denominator, or None where a profile measured nothing (no samples per second)."""
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def format_errors(rows):
    """The check of the predictions: measured against predicted where both exist."""
    checked = [row for row in rows if row.get("prediction_error") is not None]
    lines = ["measured vs predicted speedup on 2 ranks:"]
    lines += [f"  {row['size']:>6} params, batch {row['batch_size']:>3}, {row['strategy']:<8} measured "
              f"{row['measured_speedup']:.2f}x{_spread(row)}, predicted {row['predicted_speedup']:.2f}x "
              f"({row['prediction_error']:+.1%})" for row in checked]
    if checked:
        worst = max(checked, key=lambda row: abs(row["prediction_error"]))
        lines.append(f"largest error {abs(worst['prediction_error']):.1%} ({worst['size']}, batch "
                     f"{worst['batch_size']}, {worst['strategy']})")
    return "\n".join(lines)


def _spread(row):
    rounds = row.get("rounds") or 1
    if rounds == 1:
        return ""
    return f" (median of {rounds} rounds, {row['measured_speedup_low']:.2f}-{row['measured_speedup_high']:.2f}x)"


def write_map_figure(rows, path):
    """Speedup against model size, a panel per batch: measured 2-rank points, predicted lines for each
    strategy and N, and where the prediction crosses 1x (break-even) marked."""
    from evaluation.figures import pyplot
    plt = pyplot()
    batches = sorted({row["batch_size"] for row in rows})
    figure, axes = plt.subplots(1, len(batches), figsize=(6.5 * len(batches), 4.5), squeeze=False,
                                constrained_layout=True)
    colours = {"ddp": "tab:blue", "ddp_fp16": "tab:green", "fsdp": "tab:red"}
    for ax, batch in zip(axes[0], batches, strict=True):
        for strategy, colour in colours.items():
            chosen = [row for row in rows if row["batch_size"] == batch and row["strategy"] == strategy]
            for n, style in zip(sorted({row["ranks"] for row in chosen}), ("-", "--", ":"), strict=False):
                line = sorted((row for row in chosen if row["ranks"] == n), key=lambda row: row["parameters"])
                x = [row["parameters"] for row in line]
                ax.plot(x, [row["predicted_speedup"] for row in line], style, color=colour,
                        label=f"{strategy}, {n} ranks predicted")
                for left, right in zip(line, line[1:], strict=False):  # break-even between two sizes
                    if (left["predicted_speedup"] - 1) * (right["predicted_speedup"] - 1) < 0:
                        ax.axvline(math.sqrt(left["parameters"] * right["parameters"]), color=colour, alpha=0.3)
            points = [row for row in chosen if row.get("measured_speedup") is not None]
            middle = [row["measured_speedup"] for row in points]
            spread = [[m - row.get("measured_speedup_low", m) for m, row in zip(middle, points, strict=True)],
                      [row.get("measured_speedup_high", m) - m for m, row in zip(middle, points, strict=True)]]
            ax.errorbar([row["parameters"] for row in points], middle, yerr=spread, fmt="o", color=colour,
                        capsize=3, zorder=3, label=f"{strategy}, 2 ranks measured (bars: lowest to highest round)")
        ax.axhline(1.0, color="black", linewidth=1)
        ax.set_xscale("log")
        ax.set_xlabel("parameters")
        ax.set_ylabel("speedup over one process (global samples/s)")
        ax.set_title(f"per-GPU batch {batch}; faint lines: predicted break-even")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="upper left")
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


if __name__ == "__main__":
    sys.exit(run_entry_point(main))
