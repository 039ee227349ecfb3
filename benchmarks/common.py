"""What the benchmarks share: a run built by the trainer, its training epoch, timing in turn and the table."""
import contextlib
import functools
import io
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from data.synthetic import DEFAULT_WINDOWS_PER_SUBJECT
from models import MODELS
from profiling.entry_points import at_least, json_file
from profiling.interleave import interleave, per_side
from profiling.workload import RECIPE_OFF
from training.config.settings import COMPILE_MODES, RunConfig
from training.distributed.strategy import make_strategy
from training.entry_point import launched_by_torchrun
from training.loop.epochs import train_epoch
from training.trainer import Trainer

TRAINER_SIDE = ("train_epoch: the run's TrainStep over its loader, with the progress bar, loss read and "
                "TensorBoard scalars every --log-interval steps, NaN check and stop-request check; what fit() "
                "does minus validation, checkpoints and the epoch record")


def add_run_flags(parser):
    """The flags that shape the run every benchmark builds."""
    parser.add_argument("--model", choices=tuple(MODELS), default="cnn1d")
    parser.add_argument("--batch-size", type=at_least(1), default=32)
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--rounds", type=at_least(1), default=3, help="timed rounds per side, taken in turn")
    parser.add_argument("--epochs-per-round", type=at_least(1), default=1)
    parser.add_argument("--synthetic-windows-per-subject", type=at_least(1), default=DEFAULT_WINDOWS_PER_SUBJECT,
                        help="30 subjects; the default matches UCI HAR's size")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model on every side")
    parser.add_argument("--compile-mode", choices=COMPILE_MODES, default=None, help="as training's (implies --compile)")
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="every side records its whole step as one CUDA graph (off otherwise, whatever "
                             "training's default: the benchmarks compare like with like)")
    parser.add_argument("--json", type=json_file, default=None, help="also write the figures to this JSON file")


def build_run(opts, save_dir, data_path, recipe=RECIPE_OFF):
    """A Trainer built from the RunConfig `python main.py` would get with these settings (under
    torchrun, `main_multi_gpu.py --multi-gpu ddp`'s). The generalisation recipe (augmentation, weight
    average, label smoothing) is off unless a benchmark asks for it (`recipe`: settings by flag name):
    the overhead comparisons are about the loop. Its stop signals are left uninstalled, so the
    benchmark keeps the default handlers."""
    config = RunConfig().replace(
        dataset="synthetic", synthetic_windows_per_subject=opts.synthetic_windows_per_subject, model=opts.model,
        batch_size=opts.batch_size, device=opts.device, data_path=data_path, save_dir=str(save_dir),
        epochs=1 + opts.rounds * opts.epochs_per_round,  # one warm-up, then the rounds: the LR schedule spans all
        resume=None, save_every_steps=0, compile=opts.compile, compile_mode=opts.compile_mode,
        cuda_graphs=opts.cuda_graphs,
        multi_gpu="ddp" if launched_by_torchrun() else "none", **recipe).validate()
    return Trainer.build(config, make_strategy(config))


@contextlib.contextmanager
def trainer_runs(opts, prefix, sides):
    """{name: Trainer} of build_run for each side's (data path, recipe settings), in one scratch folder;
    their logs are closed on the way out."""
    runs = {}
    with tempfile.TemporaryDirectory(prefix=prefix) as scratch:
        try:
            for name, (data_path, recipe) in sides.items():
                runs[name] = build_run(opts, Path(scratch) / name, data_path, recipe)
            yield runs
        finally:
            for run in runs.values():
                run.log.close()


def trainer_rates(runs, opts):
    """epoch_rates of every run's training epoch."""
    sides = {name: functools.partial(train_trainer_epoch, run) for name, run in runs.items()}
    return epoch_rates(sides, opts.rounds, opts.epochs_per_round, next(iter(runs.values())).strategy.synchronize)


def train_trainer_epoch(trainer, epoch):
    """One training epoch as fit() runs it, without validation or checkpoints; returns the samples
    all ranks trained on. The progress bar is the logger's own, built while stderr is not a
    terminal, so it disables itself as in a job log."""
    with contextlib.redirect_stderr(io.StringIO()):
        return train_epoch(trainer, epoch).samples


def epoch_rates(sides, rounds, epochs_per_round, synchronize, watch_other_processes=True):
    """Warm each side up for one epoch, then time them in turn (profiling.interleave: A B, B A, ...).

    `sides` maps a name to train(epoch) -> items done. Returns (name -> items per second, one per
    round; CPU cores other processes kept busy during each round, None where unknown or not
    watched: under torchrun the other ranks are such processes)."""
    for train in sides.values():
        train(0)  # first-call costs (allocator growth, kernel choice, lazy imports) stay out of the figures

    def timed(train):
        def one_round(round_index):
            first_epoch = 1 + round_index * epochs_per_round
            synchronize()
            start_s = time.perf_counter()
            items = sum(train(epoch) for epoch in range(first_epoch, first_epoch + epochs_per_round))
            synchronize()
            return items / (time.perf_counter() - start_s)
        return one_round

    rounds_results = list(interleave({name: timed(train) for name, train in sides.items()}, rounds))
    other_cores = [others if watch_other_processes else None for _, others in rounds_results]
    return per_side(rounds_results), other_cores


def format_rates(rates, unit, ratios, other_cores):
    """A table: one row per round and a median row, each side's rate, each (a, b) of `ratios` as a/b,
    and the cores other processes used in that round."""
    names = list(rates)
    columns = [f"{name} {unit}" for name in names] + [f"{a}/{b}" for a, b in ratios]
    width = max(len(column) for column in columns) + 2
    lines = ["round " + "".join(f"{column:>{width}}" for column in columns) + "  other procs (cores)"]
    rows = [(str(index + 1), {name: rates[name][index] for name in names}, other_cores[index])
            for index in range(len(other_cores))]
    rows.append(("median", {name: statistics.median(rates[name]) for name in names}, None))
    for label, by_name, others in rows:
        line = f"{label:<6}" + "".join(f"{by_name[name]:>{width},.0f}" for name in names)
        line += "".join(f"{by_name[a] / by_name[b]:>{width}.3f}" for a, b in ratios)
        lines.append(line + (f"{others:>21.2f}" if others is not None else ""))
    return "\n".join(lines)


def median_ratio(rates, name, reference):
    return statistics.median(rates[name]) / statistics.median(rates[reference])


def paired_ratio(rates, name, reference):
    """Median of the per-round ratios: each pairs two neighbouring timings, so slow drift cancels."""
    return statistics.median(a / b for a, b in zip(rates[name], rates[reference], strict=True))


def machine_line(device):
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{os.cpu_count()} CPU cores"
    return f"machine: {where}, torch {torch.__version__}, {torch.get_num_threads()} intra-op threads"
