"""The training-step throughput of every model x per-GPU batch x precision, measured in one process (one
import of torch, one CUDA context) with the profiler's own workload and timed steps.

The --json file is rewritten after each configuration, so a run stopped part-way leaves what it measured.
A configuration that fails (out of memory, an unsupported kernel) is recorded with its one-line error
and the next one runs; one the project refuses on this device (fp16 on CPU) is recorded as skipped.
Exit code: 0 none failed, 1 some failed, 2 bad flags.
"""
import functools
import gc
import json
import statistics
import sys
import time
from collections import namedtuple
from pathlib import Path

import torch

from benchmarks.gpu_check.plan import BATCH_SIZES, FULL, PRECISIONS, QUICK
from data.sources import load_har_data
from data.synthetic import DEFAULT_WINDOWS_PER_SUBJECT
from models import MODELS  # every model of the registry is measured
from outputs.safety import write_atomic
from profiling import workload
from profiling.cli import parse_profiler_args
from profiling.entry_points import at_least, comma_choices, comma_counts, comma_names, entry_parser
from profiling.measure import timed_steps
from profiling.report import json_ready
from profiling.timing import mean_std
from training.distributed.strategy import make_strategy
from training.entry_point import run_entry_point
from training.errors import UsageError
from training.reporting.logger import GIB

WHAT = ("samples_per_s: samples the timed steps took (an epoch's shorter last batch counts its own size, not "
        "the batch size) per second of those steps, mean over repeats; warm-up: at least one epoch; "
        "step_graphed: the timed steps were replays of one recorded CUDA graph; "
        "peak_*_gib: CUDA allocator peaks from before the workload was built to the end of its timing, "
        "timed_peak_allocated_gib: over the timed steps alone, after the warm-up (null on CPU)")
# batch_size is per GPU; precision is a key of PRECISIONS; graphs: the whole step replayed as one CUDA graph.
Configuration = namedtuple("Configuration", "model batch_size precision graphs", defaults=(False,))
# Whole-step CUDA graphs are measured where a step is host-bound (small batches), in bf16, on CUDA only,
# for the models whose step records (STEP_RECORDS): this matrix runs in one process, and on an H200
# (torch 2.11) the graphed cnn_lstm configuration and every one after it failed with the CUDA random
# generator's "Offset increment outside graph capture", the mark a failed recording leaves on it.
GRAPH_BATCH_SIZES = (32,)


def matrix(models=MODELS, batch_sizes=BATCH_SIZES, precisions=tuple(PRECISIONS), graph_batch_sizes=()):
    """The configurations in running order: a model's smaller batches first, then its graphed steps."""
    return [Configuration(m, b, p) for m in models for b in batch_sizes for p in precisions] + [
        Configuration(m, b, "bf16", graphs=True) for m in models if m in MODELS and MODELS[m].STEP_RECORDS
        for b in graph_batch_sizes]


def configuration_name(config):
    return f"{config.model} bs{config.batch_size} {config.precision}" + (" graphs" if config.graphs else "")


def profiler_args(config, opts):
    """The configuration as profiler.py's flags, parsed and checked as profiler.py does."""
    return parse_profiler_args([
        "--model", config.model, "--batch-size", str(config.batch_size), "--device", opts.device,
        *PRECISIONS[config.precision], "--warmup-steps", str(opts.warmup_steps), "--steps", str(opts.steps),
        "--repeats", str(opts.repeats), "--phase-steps", "0", "--cuda-graphs" if config.graphs else "--no-cuda-graphs",
        "--synthetic-windows-per-subject", str(opts.synthetic_windows_per_subject)])


def measure(args, load_data):
    """One configuration: build the workload, warm up, time `repeats` runs of `steps` steps."""
    strategy = make_strategy(args.run)
    device = strategy.device
    cuda = device.type == "cuda"
    try:
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        work = workload.build_workload(args, strategy, data=load_data(**args.run.data_options()))
        # At least one whole epoch, so every batch shape (the shorter last one too) has had its
        # cuDNN autotuning before the clock starts.
        for _ in range(max(args.warmup_steps, work.steps_per_epoch)):
            workload.optimizer_step(work, sync_gradients=True)
        if cuda:  # the timed steps' own peak, apart from the warm-up's (cuDNN's algorithm search among them)
            warmup_peaks = torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)
            torch.cuda.reset_peak_memory_stats(device)
        taken = [0]
        work.batches = counted(work.batches, taken)
        runs, rates = [], []
        for _ in range(args.repeats):
            taken[0] = 0
            runs.append(timed_steps(work, args.steps, sync_gradients=True))
            rates.append(taken[0] / (runs[-1]["step_time_s"] * runs[-1]["steps"]))
        samples_per_s, samples_per_s_std = mean_std(rates)
        graph = work.step.graph
        return {"samples_per_s": samples_per_s, "samples_per_s_std": samples_per_s_std,
                "step_graphed": graph is not None and graph.graph is not None,
                "step_time_ms": statistics.mean(run["step_time_s"] for run in runs) * 1e3,
                "data_wait_share": statistics.mean(run["data_wait_share"] for run in runs),
                **(peaks(device, warmup_peaks) if cuda else dict.fromkeys(PEAK_KEYS))}
    finally:
        strategy.close()


PEAK_KEYS = ("peak_allocated_gib", "peak_reserved_gib", "timed_peak_allocated_gib")


def peaks(device, warmup_peaks):
    """The allocator's peaks over the whole configuration, and over its timed steps alone."""
    timed = torch.cuda.max_memory_allocated(device)
    whole = max(warmup_peaks[0], timed), max(warmup_peaks[1], torch.cuda.max_memory_reserved(device))
    return dict(zip(PEAK_KEYS, (whole[0] / GIB, whole[1] / GIB, timed / GIB), strict=True))


def counted(batches, taken):
    """The batches, adding each one's sample count to taken[0] (a shape: known without a device sync)."""
    for signals, labels in batches:
        taken[0] += signals.shape[0]
        yield signals, labels


def one_line(exc):
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300]


def run_matrix(configurations, opts, write):
    """Measure each configuration in turn; write(entries, finished) after each. Returns the entries."""
    entries = [{**config._asdict(), "status": "not run"} for config in configurations]
    # Every configuration trains on the same data: loaded and split once (about a second for UCI
    # HAR's size), not once per configuration.
    load_data = functools.lru_cache(maxsize=1)(load_har_data)
    write(entries, False)
    for entry, config in zip(entries, configurations, strict=True):
        started = time.perf_counter()
        try:
            entry.update(measure(profiler_args(config, opts), load_data), status="ok")
        except UsageError as exc:  # refused by design on this device, e.g. fp16 autocast on CPU
            entry.update(status="skipped", why=one_line(exc))
        except Exception as exc:  # out of memory, say: the rest of the matrix still runs
            entry.update(status="failed", why=one_line(exc))
        entry["wall_s"] = time.perf_counter() - started
        gc.collect()  # the last configuration's memory goes back before the next one is measured
        if opts.device == "cuda":
            torch.cuda.empty_cache()
        write(entries, False)
        name = configuration_name(config)
        if entry["status"] == "ok":
            print(f"{name}: {entry['samples_per_s']:,.0f} samples/s in {entry['wall_s']:.1f} s", flush=True)
        else:  # failures on stderr, so the tail of a failed step shows them
            print(f"{name}: {entry['status']}: {entry['why']}", flush=True,
                  file=sys.stderr if entry["status"] == "failed" else sys.stdout)
    write(entries, True)
    return entries


def json_writer(path, opts):
    header = {"device": opts.device, "torch": torch.__version__, "what": WHAT,
              **{name: getattr(opts, name) for name in ("warmup_steps", "steps", "repeats",
                                                        "synthetic_windows_per_subject")}}
    if opts.device == "cuda":
        header["gpu"] = torch.cuda.get_device_name(0)

    def write(entries, finished):
        text = json.dumps(json_ready({**header, "finished": finished, "configurations": entries}), indent=2,
                          allow_nan=False) + "\n"
        write_atomic(path, lambda partial: Path(partial).write_text(text))
    return write


def parse(argv):
    parser = entry_parser("benchmarks.gpu_check.throughput", __doc__)
    parser.add_argument("--json", required=True, help="the JSON file to write")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--quick", action="store_true", help="few steps: a smoke run")
    parser.add_argument("--models", type=comma_names, default=list(MODELS))
    parser.add_argument("--batch-sizes", type=comma_counts, default=list(BATCH_SIZES), help="per GPU")
    parser.add_argument("--precisions", type=comma_choices(PRECISIONS), default=list(PRECISIONS))
    parser.add_argument("--graph-batch-sizes", type=comma_counts, default=list(GRAPH_BATCH_SIZES),
                        help="batches also measured with --cuda-graphs, in bf16 (CUDA only)")
    parser.add_argument("--synthetic-windows-per-subject", type=at_least(1), default=DEFAULT_WINDOWS_PER_SUBJECT)
    parser.add_argument("--warmup-steps", type=int, default=None, help="default: 10, 2 with --quick")
    parser.add_argument("--steps", type=at_least(1), default=None,
                        help="steps timed per repeat; default: 30, 5 with --quick")
    parser.add_argument("--repeats", type=at_least(1), default=None, help="default: 2, 1 with --quick")
    opts = parser.parse_args(argv)
    defaults = (QUICK if opts.quick else FULL).profile
    for name, default in zip(("warmup_steps", "steps", "repeats"), defaults, strict=True):
        if getattr(opts, name) is None:
            setattr(opts, name, default)
    return opts


def main(argv=None):
    opts = parse(argv)
    configurations = matrix(opts.models, opts.batch_sizes, opts.precisions,
                            opts.graph_batch_sizes if opts.device == "cuda" else ())
    try:  # bad flags fail here, in one line, not as a matrix of skipped entries
        if opts.device == "cuda" and not torch.cuda.is_available():
            raise UsageError("--device cuda, but torch sees no CUDA GPU")
        if not configurations:
            raise UsageError("nothing to measure")
        for config in configurations:
            profiler_args(config, opts)
    except UsageError as exc:
        print(f"throughput: {exc}", file=sys.stderr)
        return 2
    Path(opts.json).parent.mkdir(parents=True, exist_ok=True)
    entries = run_matrix(configurations, opts, json_writer(opts.json, opts))
    return 1 if any(entry["status"] == "failed" for entry in entries) else 0


if __name__ == "__main__":
    sys.exit(run_entry_point(main))
