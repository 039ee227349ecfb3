"""The trainer's training step against a minimal hand-written PyTorch loop on the same model, data and batch.

Under torchrun (--nproc_per_node=N) both sides are DDP: the trainer as main_multi_gpu.py runs
it, the minimal loop as a DistributedDataParallel model fed a per-rank slice of each epoch.
"""
import functools
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.optim.lr_scheduler import LambdaLR

from benchmarks.common import (
    TRAINER_SIDE,
    add_run_flags,
    build_run,
    epoch_rates,
    format_rates,
    machine_line,
    median_ratio,
    paired_ratio,
    train_trainer_epoch,
)
from profiling.entry_points import entry_parser, write_json
from training.distributed.ddp import ddp_module
from training.entry_point import run_entry_point
from training.errors import UsageError
from training.loop.step import compile_for_training

# Below these the trainer costs more than noise explains on CPU.
TARGET_RATIO = {"single": 0.97, "ddp": 0.95}


class MinimalLoop:
    """The textbook loop: shuffle the tensors once per epoch, take contiguous slices, forward, loss,
    backward, step. With `features` it also clips and steps the trainer's LR schedule, so the
    comparison measures the trainer's overhead rather than what it does on top."""

    def __init__(self, run, features):
        config, device = run.config, run.strategy.device
        if run.precision.needs_grad_scaler:
            raise UsageError("the minimal loop has no GradScaler: run on CPU or a bf16-capable GPU")
        torch.manual_seed(config.optim.seed)  # the seed the trainer builds its model under: the same initial weights
        train = run.data.train  # already normalised by the trainer
        _, channels, window_steps = train.signals.shape
        model = config.model.build(channels, len(run.data.class_names), window_steps).to(device)
        self.rank, self.world_size = run.strategy.rank, run.strategy.world_size
        if self.world_size > 1:
            # Built as the trainer builds it, without DDP's per-forward buffer broadcast, so the
            # ratio is the trainer's own overhead and not that choice.
            model = ddp_module(model, device)
        self.train_model = compile_for_training(model, config.hardware)
        self.model = model
        self.signals = torch.from_numpy(train.signals).to(device)
        self.labels = torch.from_numpy(train.labels).to(device)
        self.parameters = [p for p in self.model.parameters() if p.requires_grad]
        trainer_groups = run.step.optimizer.param_groups
        groups = [{"params": [p for p in self.parameters if p.ndim >= 2], "weight_decay": config.optim.weight_decay},
                  {"params": [p for p in self.parameters if p.ndim < 2], "weight_decay": 0.0}]
        self.graph = None if run.step.graph is None else MinimalGraph(self)
        lr = trainer_groups[0]["initial_lr"]
        self.optimizer = torch.optim.AdamW(
            groups, fused=run.step.optimizer.defaults["fused"],
            **({"lr": torch.tensor(lr, device=device), "capturable": True} if self.graph else {"lr": lr}))
        self.scheduler = LambdaLR(self.optimizer, run.step.scheduler.lr_lambdas[0]) if features else None
        self.max_grad_norm = config.optim.max_grad_norm if features else 0.0
        self.autocast = functools.partial(torch.autocast, device.type, dtype=run.precision.dtype,
                                          enabled=run.precision.enabled)
        self.batch_size, self.seed, self.device = run.loader_batch, config.optim.seed, device

    def train_epoch(self, epoch):
        self.model.train()
        torch.manual_seed(self.seed + epoch)  # a fresh order and dropout masks each epoch, as the trainer has
        order = torch.randperm(len(self.labels), device=self.device)
        # Each rank takes every world_size-th sample, cut to the same count so the ranks step together.
        order = order[self.rank::self.world_size][:len(order) // self.world_size]
        signals, labels = self.signals[order], self.labels[order]
        for first in range(0, len(labels), self.batch_size):
            last = first + self.batch_size
            if self.graph is not None and len(labels[first:last]) == self.batch_size:
                self.graph.replay(signals[first:last], labels[first:last])
            else:
                self.optimizer.zero_grad(set_to_none=True)
                self.step(signals[first:last], labels[first:last])
            if self.scheduler is not None:
                self.scheduler.step()
        return len(labels) * self.world_size

    def step(self, signals, labels):
        with self.autocast(cache_enabled=self.graph is None):
            loss = F.cross_entropy(self.train_model(signals), labels)
        loss.backward()
        if self.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.parameters, self.max_grad_norm)
        self.optimizer.step()


class MinimalGraph:
    """The textbook whole-network capture (PyTorch's CUDA semantics notes): warm up on a side stream,
    record one step on static input tensors, then copy each full batch in and replay."""

    def __init__(self, loop):
        self.loop, self.graph = loop, None

    def replay(self, signals, labels):
        if self.graph is None:
            self.signals, self.labels = signals.clone(), labels.clone()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    self.loop.optimizer.zero_grad(set_to_none=True)
                    self.loop.step(self.signals, self.labels)
            torch.cuda.current_stream().wait_stream(side)
            self.loop.optimizer.zero_grad(set_to_none=True)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.loop.step(self.signals, self.labels)
        self.signals.copy_(signals)
        self.labels.copy_(labels)
        self.graph.replay()


def describe_sides(run, bare):
    loader = type(run.loaders["train"]).__name__
    ddp = (f"; both sides DDP over {run.strategy.world_size} ranks ({run.strategy.describe()})"
           if run.strategy.world_size > 1 else "")
    lines = [f"trainer: {TRAINER_SIDE}; batches from {loader}{ddp}",
             "minimal: same model class and initial weights, same normalised train tensors and batch (under "
             "torchrun: DDP as the trainer builds it, without the per-forward buffer broadcast), a seeded "
             "randperm per epoch with contiguous slices, F.cross_entropy, backward, AdamW with the same param "
             f"groups, clip_grad_norm_ {run.config.optim.max_grad_norm:g} and the same per-step LambdaLR schedule, "
             f"{run.precision.describe()}"]
    if run.config.hardware.compile:
        lines.append(f"both sides torch.compile'd, mode {run.config.hardware.compile_mode or 'default'}")
    if run.config.hardware.cuda_graphs:
        lines.append("both sides replay their whole step as one CUDA graph for each full batch (capturable AdamW)")
    if bare:
        lines.append("bare: the minimal loop without clipping and LR schedule (AdamW at the peak LR)")
    return "\n".join(lines)


def main(argv=None):
    parser = entry_parser("benchmarks.overhead", __doc__)
    add_run_flags(parser)
    parser.add_argument("--data-path", choices=("auto", "device", "dataloader"), default="auto",
                        help="the trainer's data path (the minimal loop always slices tensors)")
    parser.add_argument("--bare-minimal", action="store_true",
                        help="also time a minimal loop without clipping and LR schedule")
    opts = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="har-overhead-") as scratch:
        run = build_run(opts, Path(scratch) / "run", opts.data_path)
        try:
            sides = {"trainer": functools.partial(train_trainer_epoch, run),
                     "minimal": MinimalLoop(run, features=True).train_epoch}
            if opts.bare_minimal:
                sides["bare"] = MinimalLoop(run, features=False).train_epoch
            speak = print if run.strategy.is_main else (lambda *_, **__: None)
            speak(describe_sides(run, opts.bare_minimal), flush=True)
            speak(machine_line(run.strategy.device), flush=True)
            rates, other_cores = epoch_rates(sides, opts.rounds, opts.epochs_per_round, run.strategy.synchronize,
                                            watch_other_processes=run.strategy.world_size == 1)
            graphed = run.step.graph is not None and run.step.graph.graph is not None
        finally:
            sides, run.step = None, None  # every DDP model goes before the process group
            run.log.close()
            run.strategy.close()
    if run.strategy.is_main:
        report(opts, run, rates, other_cores, graphed)
    return 0


def report(opts, run, rates, other_cores, graphed):
    mode = "ddp" if run.strategy.world_size > 1 else "single"
    ratios = [("trainer", "minimal")] + ([("trainer", "bare")] if opts.bare_minimal else [])
    print(format_rates(rates, "samples/s", ratios, other_cores))
    figures = {"mode": mode, "world_size": run.strategy.world_size, "model": opts.model,
               "batch_size_per_rank": opts.batch_size, "device": str(run.strategy.device),
               "precision": run.precision.dtype_name,
               "compile_mode": (opts.compile_mode or "default") if run.config.hardware.compile else None,
               "cuda_graphs": run.config.hardware.cuda_graphs, "trainer_step_graphed": graphed,
               "threads": torch.get_num_threads(), "windows": len(run.data.train), "rounds": opts.rounds,
               "epochs_per_round": opts.epochs_per_round, "machine": machine_line(run.strategy.device),
               "rates": rates, "ratio": median_ratio(rates, "trainer", "minimal"),
               "paired_ratio": paired_ratio(rates, "trainer", "minimal"), "target": TARGET_RATIO[mode]}
    print(f"trainer/minimal = {figures['ratio']:.3f} (median of {opts.rounds} rounds of {opts.epochs_per_round} "
          f"epoch(s); median of per-round ratios {figures['paired_ratio']:.3f}; {figures['windows']} windows, "
          f"{opts.model}, batch {opts.batch_size} per rank, {run.strategy.world_size} rank(s), "
          f"{run.strategy.device}, {figures['threads']} threads per rank; target >= {TARGET_RATIO[mode]})")
    if opts.bare_minimal:
        print(f"trainer/bare = {median_ratio(rates, 'trainer', 'bare'):.3f} (the overhead plus what clipping and "
              "the schedule cost)")
    write_json(opts.json, figures)


if __name__ == "__main__":
    sys.exit(run_entry_point(main))
