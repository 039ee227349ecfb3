"""The device-resident data path against the DataLoader path: whole training epochs and bare loader iteration."""
import functools
import sys

import torch

from benchmarks.common import (
    TRAINER_SIDE,
    add_run_flags,
    epoch_rates,
    format_rates,
    machine_line,
    median_ratio,
    paired_ratio,
    trainer_rates,
    trainer_runs,
)
from profiling.entry_points import entry_parser, write_json
from profiling.workload import RECIPE_OFF
from training.entry_point import run_entry_point


def iterate_loader(run, epoch):
    """One pass over the train loader as the loop draws it, copy to the device included, with no model."""
    loader, device = run.loaders["train"], run.strategy.device
    loader.sampler.set_epoch(epoch, start=0)
    batches = 0
    for signals, labels in loader:
        signals.to(device, non_blocking=True)
        labels.to(device, non_blocking=True)
        batches += 1
    return batches


def main(argv=None):
    parser = entry_parser("benchmarks.data_path", __doc__)
    add_run_flags(parser)
    parser.add_argument("--iteration-passes", type=int, default=20,
                        help="passes over the train loader per round of the bare-iteration figure")
    opts = parser.parse_args(argv)
    with trainer_runs(opts, "har-data-path-", {path: (path, RECIPE_OFF) for path in ("device", "dataloader")}) as runs:
        device = runs["device"].strategy.device
        print(f"both: {TRAINER_SIDE}\n"
              f"device: {type(runs['device'].loaders['train']).__name__} (splits on {device}, index_select "
              f"per batch); dataloader: {type(runs['dataloader'].loaders['train']).__name__} with "
              f"{runs['dataloader'].config.hardware.num_workers} worker(s), copied to {device} per batch", flush=True)
        print(machine_line(device), flush=True)
        # Bare iteration (batches/s), then training epochs (samples/s).
        iteration, iteration_others = epoch_rates({path: functools.partial(iterate_loader, run)
                                                   for path, run in runs.items()}, opts.rounds,
                                                  opts.iteration_passes, runs["device"].strategy.synchronize)
        training, training_others = trainer_rates(runs, opts)
    ratio = [("device", "dataloader")]
    print(f"bare loader iteration ({opts.iteration_passes} passes per round, no model):")
    print(format_rates(iteration, "batches/s", ratio, iteration_others))
    print(f"training epochs through the trainer ({opts.epochs_per_round} epoch(s) per round):")
    print(format_rates(training, "samples/s", ratio, training_others))
    print(f"device/dataloader = {median_ratio(training, 'device', 'dataloader'):.3f} training (per-round "
          f"{paired_ratio(training, 'device', 'dataloader'):.3f}), "
          f"{median_ratio(iteration, 'device', 'dataloader'):.3f} bare iteration (medians of {opts.rounds} "
          f"rounds, {opts.model}, batch {opts.batch_size}, {device}, {torch.get_num_threads()} threads)")
    write_json(opts.json, figures(opts, device, iteration, training))
    return 0


def figures(opts, device, iteration, training):
    """What the tables above show, for a program to read: per-round rates of each path and the
    device/dataloader ratios (median of each side's rates, and median of the per-round ratios)."""
    def side(rates, unit):
        return {"unit": unit, "rates": rates, "ratio": median_ratio(rates, "device", "dataloader"),
                "paired_ratio": paired_ratio(rates, "device", "dataloader")}
    return {"model": opts.model, "batch_size": opts.batch_size, "device": str(device),
            "threads": torch.get_num_threads(), "rounds": opts.rounds, "epochs_per_round": opts.epochs_per_round,
            "iteration_passes": opts.iteration_passes, "machine": machine_line(device),
            "iteration": side(iteration, "batches/s"), "training": side(training, "samples/s")}


if __name__ == "__main__":
    sys.exit(run_entry_point(main))
