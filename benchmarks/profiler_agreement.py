"""Does the profiler time what training runs? `python main.py` and `python profiler.py` at the same
settings, taken in turn (A B, B A, ...), their samples/s side by side.

main.py's figure is the median over its epochs after the first (the first pays for warm-up); the
profiler's is its headline throughput (after its own warm-up steps). Extra arguments are given to
both, e.g. `python -m benchmarks.profiler_agreement --rounds 4 -- --model cnn1d --batch-size 64`.
"""
import json
import statistics
import sys
import tempfile
from pathlib import Path

from profiling.entry_points import at_least, entry_parser, run_in_repo
from profiling.interleave import interleave
from training.entry_point import run_entry_point


def samples_per_s(script, flags, epochs):
    """main.py's or profiler.py's samples/s, run in a scratch folder."""
    with tempfile.TemporaryDirectory(prefix="har-agreement-") as scratch:
        out = Path(scratch) / "out"
        if script == "main.py":
            run_in_repo([sys.executable, "main.py", *flags, "--epochs", str(epochs), "--save-dir", str(out),
                         "--no-resume", "--no-test"])
            records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line]
            return statistics.median(record["samples_per_s"] for record in records[1:])
        run_in_repo([sys.executable, "profiler.py", *flags, "--predict-gpus", "1", "--phase-steps", "0",
                     "--output-dir", str(out)])
        return json.loads((out / "profile.json").read_text())["timing"]["samples_per_s"]["mean"]


def main(argv=None):
    parser = entry_parser("benchmarks.profiler_agreement", __doc__)
    parser.add_argument("--rounds", type=at_least(1), default=3)
    parser.add_argument("--epochs", type=at_least(2), default=4,
                        help="main.py epochs per round (the first is not counted)")
    parser.add_argument("flags", nargs="*", help="training flags for both, after --")
    opts = parser.parse_args(argv)
    sides = {script: lambda _, script=script: samples_per_s(script, opts.flags, opts.epochs)
             for script in ("main.py", "profiler.py")}
    rates = {name: [] for name in sides}
    print(f"flags: {' '.join(opts.flags) or '(defaults)'}", flush=True)
    for round_index, (results, _) in enumerate(interleave(sides, opts.rounds)):
        for name, rate in results.items():
            rates[name].append(rate)
        main_rate, profiler_rate = results["main.py"], results["profiler.py"]
        print(f"round {round_index + 1}: main.py {main_rate:,.0f} samples/s, profiler.py {profiler_rate:,.0f} "
              f"samples/s, profiler/main {profiler_rate / main_rate:.3f}", flush=True)
    ratios = [p / m for p, m in zip(rates["profiler.py"], rates["main.py"], strict=True)]
    print(f"median: main.py {statistics.median(rates['main.py']):,.0f}, profiler.py "
          f"{statistics.median(rates['profiler.py']):,.0f} samples/s; profiler/main median of per-round ratios "
          f"{statistics.median(ratios):.3f} (range {min(ratios):.3f} to {max(ratios):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(run_entry_point(main))
