"""Does the profiler time what training runs? `python main.py` and `python profiler.py` at the same
settings, taken in turn (A B, B A, ...), their samples/s side by side.

main.py's figure is the median over its epochs after the first (the first pays for warm-up); the
profiler's is its headline throughput (after its own warm-up steps). Extra arguments are given to
both, e.g. `python -m benchmarks.profiler_agreement --rounds 4 -- --model cnn1d --batch-size 64`.

--whole-run compares whole runs instead: `python main.py` with the flags as given (all its epochs,
the test, no figures) timed from outside, against the wall time profiler.py predicts for it (its
run_time for one process), with the parts of each side: set-up (the feature pool's build apart),
training, evaluation. On the built-in synthetic data of UCI HAR's size, needing no download:
`python -m benchmarks.profiler_agreement --whole-run --rounds 3 -- --dataset synthetic`. With
`--ranks 2` the measured side is main_multi_gpu.py's DDP on this machine's CPU cores, the predicted
one the profiler's prediction for 2 ranks, made from one process.
"""
import json
import math
import os
import re
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from profiling.entry_points import at_least, entry_parser, env_without_torchrun, run_in_repo
from profiling.interleave import interleave
from training.entry_point import run_entry_point
from training.reporting.logger import INPUTS_LAP, SET_UP_LAP, START_UP, read_time_line


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
                        help="main.py epochs per round (the first is not counted); not with --whole-run")
    parser.add_argument("--whole-run", action="store_true",
                        help="main.py's whole run (wall time) against the profiler's prediction of it")
    parser.add_argument("--ranks", type=at_least(1), default=1,
                        help="with --whole-run: 2+ runs main_multi_gpu.py's DDP on this machine's CPU cores, "
                             "against the profiler's prediction for that many ranks (from one process)")
    parser.add_argument("flags", nargs="*", help="training flags for both, after --")
    opts = parser.parse_args(argv)
    if opts.whole_run:
        return compare_whole_runs(opts.flags, opts.rounds, opts.ranks)
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


POOL_LINE = re.compile(r"= ([\d,]+) transformed once.*?, ([\d,]+) windows/s in all")


def measured_run(flags, ranks=1):
    """main.py's whole run (with 2+ ranks main_multi_gpu.py's DDP on this machine's CPU cores): its
    wall time from outside, the parts of its time line (its exit: the wall time after the time
    line's parts, whose tenths it rounds to), the feature pool's build (windows over windows/s, from
    its closing line) and its samples/s (median of the epochs after the first)."""
    with tempfile.TemporaryDirectory(prefix="har-agreement-") as scratch:
        out = Path(scratch) / "out"
        command = ["main.py"] if ranks == 1 else ["main_multi_gpu.py", "--multi-gpu", "ddp", "--nproc-per-node",
                                                  str(ranks), "--device", "cpu"]
        stdout, wall_s = run_in_repo([sys.executable, *command, *flags, "--no-figures", "--save-dir", str(out),
                                      "--no-resume"])
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line]
    laps = read_time_line(stdout)
    pool = POOL_LINE.search(stdout)
    build_s = int(pool.group(1).replace(",", "")) / int(pool.group(2).replace(",", "")) if pool else 0.0
    timed_s = laps.get(START_UP, 0.0) + sum(value for name, value in laps.items() if name != START_UP)
    return {"wall_s": wall_s, "start_up_s": laps.get(START_UP, 0.0), "exit_s": wall_s - timed_s,
            "set_up_s": laps[INPUTS_LAP] + laps[SET_UP_LAP],
            "build_s": build_s, "training_s": laps["training"], "evaluation_s": laps.get("evaluation", 0.0),
            "samples_per_s": statistics.median(record["samples_per_s"] for record in records[1:] or records)}


def predicted_run(flags, ranks=1):
    """profiler.py's prediction of that run, from one process, in the same parts. For 2+ ranks the one
    process runs the step as torchrun runs each rank's (OMP_NUM_THREADS=1 unless it is set), with
    the ranks on this host (--gpus-per-node)."""
    with tempfile.TemporaryDirectory(prefix="har-agreement-") as scratch:
        out = Path(scratch) / "out"
        counts = ["--predict-gpus", "1"] if ranks == 1 else ["--predict-gpus", f"1,{ranks}", "--gpus-per-node",
                                                             str(ranks)]
        env = None if ranks == 1 else env_without_torchrun(OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        run_in_repo([sys.executable, "profiler.py", *flags, "--no-figures", *counts, "--phase-steps", "0",
                     "--output-dir", str(out)], env)
        profile = json.loads((out / "profile.json").read_text())
    parts, run = profile["run_time"]["parts"], profile["run_time"]["predictions"][-1]
    return {"wall_s": run["total_s"], "start_up_s": parts["start_up_s"], "exit_s": parts["exit_s"],
            # main.py pays the imports its run adds during its set-up.
            "set_up_s": parts["inputs_s"] + parts["imports_s"] + parts["set_up_s"], "build_s": run["build_s"],
            "training_s": run["training_s"], "evaluation_s": run["evaluation_s"],
            "samples_per_s": profile["config"]["global_samples_per_step"] * ranks / run["step_s"]}


def compare_whole_runs(flags, rounds, ranks=1):
    """Rounds in turn (A B, B A, ...): each side's parts and the profiler / main.py ratio of each."""
    sides = {"main.py": lambda _: measured_run(flags, ranks), "profiler.py": lambda _: predicted_run(flags, ranks)}
    ratios = {key: [] for key in WHOLE_RUN_KEYS}
    print(f"flags: {' '.join(flags) or '(defaults)'}, {ranks} rank(s); seconds, main.py measured / profiler.py "
          "predicted", flush=True)
    mark = (time.perf_counter(), _children_cpu_s())
    for round_index, (results, busy_cores) in enumerate(interleave(sides, rounds)):
        measured, predicted = results["main.py"], results["profiler.py"]
        for key in WHOLE_RUN_KEYS:
            ratios[key].append(predicted[key] / measured[key] if measured[key] else math.nan)
        now = (time.perf_counter(), _children_cpu_s())
        # The meter counts the two commands this round ran as other processes: their CPU time is taken out.
        busy = "" if busy_cores is None else \
            f"; other processes kept {max(busy_cores - (now[1] - mark[1]) / (now[0] - mark[0]), 0.0):.1f} cores busy"
        mark = now
        print(f"round {round_index + 1}: " + ", ".join(
            f"{key} {_figure(measured[key])} / {_figure(predicted[key])}" for key in WHOLE_RUN_KEYS) + busy, flush=True)
    print("profiler / main.py, median of the per-round ratios (range): " + ", ".join(
        f"{key} {statistics.median(kept):.3f} ({min(kept):.3f} to {max(kept):.3f})"
        for key, values in ratios.items() if (kept := [value for value in values if math.isfinite(value)])))
    return 0


WHOLE_RUN_KEYS = ("wall_s", "start_up_s", "exit_s", "set_up_s", "build_s", "training_s", "evaluation_s",
                  "samples_per_s")


def _children_cpu_s():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _figure(value):
    return f"{value:,.0f}" if value >= 1000 else f"{value:.2f}"


if __name__ == "__main__":
    sys.exit(run_entry_point(main))
