"""Training from a window store larger than memory: peak memory, throughput against in-memory data,
time to the first step, and the converter's speed.

  python -m benchmarks.store_stream make --out DIR --gigabytes 48   # a synthetic store of that size
  python -m benchmarks.store_stream measure --store DIR --rounds 3  # store vs in-memory, A B, B A
  python -m benchmarks.store_stream convert --src RECORDINGS        # build_store with 1 and 2 processes
  python -m benchmarks.store_stream rerun --store DIR --pairs 2     # the default's first run and re-run

`measure` runs each side in a process of its own: the run the trainer builds from the flags, its
TrainStep over the run's own loader for --steps steps (the first --warmup-steps uncounted). Peak memory
is the largest proportional set size (PSS) of the process and its DataLoader workers together,
sampled every 0.2 s: pages a forked worker shares with the trainer count once, where a sum of
resident sets would count them twice. Time to first step counts from the process's start to the
end of its first optimizer step.
"""
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from types import SimpleNamespace

from profiling.entry_points import at_least, descendants, entry_parser, json_file, run_in_repo, write_json

STARTED_S = time.time()  # before the imports below: a side's time to first step counts them
import numpy as np  # noqa: E402

from data import synthetic, uci_har  # noqa: E402
from data.build_store import assemble_manifest, job_inputs, run_job  # noqa: E402
from data.store import SHARD_DIR, finish_store  # noqa: E402
from profiling.interleave import interleave, per_side  # noqa: E402
from training.config.cli import REPO  # noqa: E402
from training.entry_point import run_entry_point  # noqa: E402
from training.errors import UsageError  # noqa: E402
from training.reporting.logger import SET_UP_LAP, read_time_line  # noqa: E402

GIB = 2 ** 30
WINDOW_BYTES_FLOAT16 = len(uci_har.SIGNAL_NAMES) * uci_har.WINDOW_STEPS * 2


def main(argv=None):
    parser = entry_parser("benchmarks.store_stream", __doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("make")
    make.add_argument("--out", required=True)
    make.add_argument("--gigabytes", type=float, required=True)
    make.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    measure = commands.add_parser("measure")
    measure.add_argument("--store", required=True)
    measure.add_argument("--rounds", type=at_least(1), default=3)
    measure.add_argument("--steps", type=at_least(1), default=300)
    measure.add_argument("--warmup-steps", type=int, default=30)
    measure.add_argument("--json", type=json_file, default=None)
    side = commands.add_parser("side")  # one side of `measure`, in a process of its own
    side.add_argument("--steps", type=at_least(1), required=True)
    side.add_argument("--warmup-steps", type=int, required=True)
    side.add_argument("flags", nargs="*")
    convert = commands.add_parser("convert")
    convert.add_argument("--src", required=True)
    rerun = commands.add_parser("rerun")
    rerun.add_argument("--store", required=True)
    rerun.add_argument("--pairs", type=at_least(1), default=2)
    rerun.add_argument("--json", type=json_file, default=None)
    rerun.add_argument("flags", nargs="*", help="more main.py flags, after --")
    for command in (make, measure, side, convert, rerun):
        command.error = parser.error  # one line, as the top parser's
    options = parser.parse_args(argv)
    _refuse_figures_inside_the_store(options)
    return {"make": make_store, "measure": measure_sides, "side": run_side, "convert": convert_speed,
            "rerun": rerun_share}[options.command](options)


def _refuse_figures_inside_the_store(options):
    """--json never goes into the store a command reads: a figures file named like one of its files
    (manifest.json) would replace it."""
    store, figures = getattr(options, "store", None), getattr(options, "json", None)
    if store and figures and Path(store).resolve() in Path(figures).resolve().parents:
        raise UsageError(f"--json {figures} is inside the store {store}, which this command reads; write it elsewhere")


def make_store(options):
    """A store of synthetic windows: copies of the synthetic data set (30 subjects, seeded apart),
    each copy's people numbered apart, written as the converter writes shards."""
    copies = int(np.ceil(options.gigabytes * 1e9 / (synthetic.NUM_SUBJECTS * synthetic.DEFAULT_WINDOWS_PER_SUBJECT *
                                                    WINDOW_BYTES_FLOAT16)))
    out = Path(options.out)
    (out / SHARD_DIR).mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=options.workers) as pool:
        records = [record for records in pool.map(_make_copy, [(copy, str(out)) for copy in range(copies)])
                   for record in records]
    test = [copy * 100 + subject for copy in range(copies) for subject in synthetic.TEST_SUBJECTS]
    layout = {"channels": list(uci_har.SIGNAL_NAMES), "class_names": list(uci_har.CLASS_NAMES),
              "sample_rate_hz": float(uci_har.SAMPLE_RATE_HZ), "window_steps": uci_har.WINDOW_STEPS,
              "stride_steps": None, "preprocessing": "uci-har", "test_subjects": test,
              "source": f"{copies} copies of the synthetic data (benchmarks.store_stream make)"}
    finish_store(out, assemble_manifest(records, layout, SimpleNamespace(dtype="float16", src=str(out),
                                                                           test_subjects=None)))
    windows = sum(record["windows"] for record in records)
    seconds = time.perf_counter() - started
    print(f"wrote {out}: {windows:,} windows, {windows * WINDOW_BYTES_FLOAT16 / 1e9:.1f} GB of signals, in "
          f"{seconds:.0f} s ({windows / seconds:,.0f} windows/s with {options.workers} process(es))")
    return 0


def _make_copy(arguments):
    copy, out = arguments
    done = Path(out) / SHARD_DIR / f"copy-{copy:05d}.done.json"
    if done.is_file():  # finished before an interruption
        return json.loads(done.read_text())
    raw = synthetic.generate(seed=1000 + copy)
    records = []
    for signals, labels, subjects in raw.values():
        for subject in np.unique(subjects):
            job = {"name": f"copy-{copy:05d}-sub-{int(subject):02d}", "signals": signals[subjects == subject],
                   "labels": labels[subjects == subject], "subject": copy * 100 + int(subject)}
            records.append(run_job(({**job, "inputs": job_inputs(job, "float16")}, out, "float16")))
    done.write_text(json.dumps(records))
    return records


def measure_sides(options):
    """The store against the same windows' shape in memory (the synthetic data set), A B, B A, ..."""
    sides = {"store": ["--dataset", "store", "--data-dir", options.store], "in memory": ["--dataset", "synthetic"]}

    def run(name):
        def one_round(round_index):
            stdout, _ = run_in_repo([sys.executable, "-m", "benchmarks.store_stream", "side", "--steps",
                                     str(options.steps), "--warmup-steps", str(options.warmup_steps), "--",
                                     *sides[name]])
            figures = json.loads(stdout.strip().splitlines()[-1])
            print(f"round {round_index + 1} {name:>9}: {figures['samples_per_s']:,.0f} samples/s, peak memory "
                  f"{figures['peak_pss_gib']:.2f} GiB PSS ({figures['peak_rss_gib']:.2f} GiB summing resident sets), "
                  f"first step after {figures['first_step_s']:.1f} s", flush=True)
            return figures
        return one_round

    results = per_side(interleave({name: run(name) for name in sides}, options.rounds))
    ratios = [store["samples_per_s"] / memory["samples_per_s"]
              for store, memory in zip(results["store"], results["in memory"], strict=True)]
    peak_gib = max(r["peak_pss_gib"] for r in results["store"])
    print(f"store / in memory samples/s, per round: {', '.join(f'{r:.3f}' for r in ratios)}; median "
          f"{float(np.median(ratios)):.3f}; peak memory (PSS) of the store runs {peak_gib:.2f} GiB")
    write_json(options.json, {"results": results, "ratios": ratios})
    return 0


def rerun_share(options):
    """`python main.py --dataset store` into a new folder (the default's feature pool built there), then
    the same command again with --no-resume (a fresh training on the pool it reuses): each run's wall
    time from outside, its laps, peak resident set and test accuracy, and the re-run's share of the
    first run's time. Pairs one after the other, each in a scratch folder of its own."""
    pairs = []
    for number in range(options.pairs):
        with tempfile.TemporaryDirectory(prefix="har-rerun-") as scratch:
            save_dir = Path(scratch) / "run"
            command = [sys.executable, "main.py", "--dataset", "store", "--data-dir", options.store,
                       "--save-dir", str(save_dir), "--no-resume", *options.flags]
            pair = {side: _watched_run(command, save_dir, Path(scratch) / f"{side}.log") for side in ("first", "again")}
        pair["share"] = pair["again"]["wall_s"] / pair["first"]["wall_s"]
        pairs.append(pair)
        for side in ("first", "again"):
            run = pair[side]
            laps, pool = run["laps"], "reused" if run["pool_reused"] else "built"
            print(f"pair {number + 1} {side:>5}: {run['wall_s']:.1f} s (set-up {laps.get(SET_UP_LAP, 0):.1f} s, "
                  f"training {laps.get('training', 0):.1f} s; pool {pool}), peak RSS {run['peak_rss_gib']:.2f} GiB, "
                  f"test accuracy {run['accuracy']:.4f}", flush=True)
        print(f"pair {number + 1}: the re-run took {pair['share']:.3f}x the first run's time", flush=True)
    shares = ", ".join(f"{pair['share']:.3f}" for pair in pairs)
    print(f"re-run / first run, per pair: {shares}")
    write_json(options.json, {"pairs": pairs})
    return 0


def _watched_run(command, save_dir, log):
    """{wall_s, laps, peak_rss_gib, accuracy, pool_reused} of one run of `command`, its output kept in
    `log`. The peak is this child's own (wait4), not the largest of every child so far (RUSAGE_CHILDREN)."""
    started = time.perf_counter()
    with open(log, "w") as output:
        child = subprocess.Popen(command, cwd=REPO, stdout=output, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)
    wall_s = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
    text = Path(log).read_text()
    if child.returncode != 0:
        raise UsageError(f"{' '.join(map(str, command))} failed:\n" + "\n".join(text.splitlines()[-5:]))
    return {"wall_s": wall_s, "laps": read_time_line(text), "peak_rss_gib": usage.ru_maxrss * 1024 / GIB,
            "accuracy": json.loads((save_dir / "test_report.json").read_text())["accuracy"],
            "pool_reused": "reused whole" in text}


def run_side(options):
    """One side: build the run, take --steps steps of its TrainStep, print one JSON line of figures."""
    from profiling.measure import timed_steps
    from profiling.workload import build_workload, optimizer_step
    from training.config.cli import parse_config
    from training.distributed.strategy import make_strategy
    stop_watch = watch_peak_memory()
    config = parse_config([*options.flags, "--device", "cpu"])
    work = build_workload(SimpleNamespace(run=config, bare_step=False), make_strategy(config))
    optimizer_step(work, sync_gradients=True)
    first_step_s = time.time() - STARTED_S
    for _ in range(options.warmup_steps - 1):
        optimizer_step(work, sync_gradients=True)
    samples_per_s = timed_steps(work, options.steps, sync_gradients=True)["samples_per_s"]
    peak_pss, peak_rss = stop_watch()
    print(json.dumps({"samples_per_s": samples_per_s, "peak_pss_gib": peak_pss / GIB, "peak_rss_gib": peak_rss / GIB,
                      "first_step_s": first_step_s, "train_windows": work.train_windows, "steps": options.steps}),
          flush=True)
    return 0


def watch_peak_memory():
    """Sample the memory of this process and its children (DataLoader workers) together every 0.2 s, as
    proportional set sizes: a page a worker shares with its parent counts once, not twice. Returns
    stop() -> (peak PSS, peak sum of resident sets) in bytes."""
    peaks, stopped = [0, 0], threading.Event()

    def sample():
        peaks[:] = map(max, peaks, tree_memory(os.getpid()))

    def watch():
        while not stopped.wait(0.2):
            sample()
    thread = threading.Thread(target=watch, daemon=True)
    thread.start()

    def stop():
        stopped.set()
        thread.join()
        sample()
        return tuple(peaks)
    return stop


def tree_memory(pid):
    """(PSS, RSS) of the process and every process below it, summed, in bytes."""
    pss = rss = 0
    for member in [pid, *descendants(pid)]:
        try:
            rollup = Path(f"/proc/{member}/smaps_rollup").read_text()
        except OSError:
            continue  # gone meanwhile
        fields = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in rollup.splitlines()[1:]}
        pss, rss = pss + fields.get("Pss", 0), rss + fields.get("Rss", 0)
    return pss, rss


def convert_speed(options):
    """build_store on the same recordings with 1 and 2 processes: windows per second."""
    for workers in (1, 2):
        with tempfile.TemporaryDirectory(prefix="har-store-") as scratch:
            _, seconds = run_in_repo([sys.executable, "-m", "data.build_store", options.src, "--out", scratch,
                                      "--workers", str(workers)])
            manifest = json.loads((Path(scratch) / "manifest.json").read_text())
            windows = sum(shard["windows"] for shard in manifest["shards"])
            print(f"{workers} process(es): {windows:,} windows in {seconds:.1f} s = {windows / seconds:,.0f} windows/s")
    return 0


if __name__ == "__main__":
    sys.exit(run_entry_point(main))
