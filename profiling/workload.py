"""The thing being measured: data, model, optimizer and the optimizer step, as the trainer builds them."""
import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from data.loaders import ShardedSampler, make_loader
from data.resident import DeviceResidentLoader, keep_on_device, split_bytes
from data.splits import fit_normalization, load_har_data, normalize
from models import build_model, count_parameters
from training.errors import UsageError
from training.loop.step import build_adamw, compile_for_training
from training.loop.precision import Precision
from training.loop.schedule import steps_per_epoch


@dataclass
class Workload:
    strategy: object
    model: torch.nn.Module  # bare: parameter count and gradient bytes
    train_model: torch.nn.Module  # wrapped (DDP) and maybe compiled: what the step calls
    optimizer: torch.optim.Optimizer
    grad_scaler: torch.amp.GradScaler
    precision: Precision
    batches: object  # endless iterator over this rank's shard
    batch_size: int  # per GPU / process
    grad_accum_steps: int
    max_grad_norm: float
    train_windows: int  # the whole training split, for the epoch-time estimate
    data_source: str

    @property
    def global_samples_per_step(self):
        return self.batch_size * self.grad_accum_steps * self.strategy.world_size

    @property
    def num_parameters(self):
        return count_parameters(self.model)

    @property
    def gradient_bytes(self):
        """What DDP all-reduces each step: one gradient per trainable parameter, in its dtype."""
        return sum(p.numel() * p.element_size() for p in self.model.parameters() if p.requires_grad)

    @property
    def steps_per_epoch(self):
        """Optimizer steps of one epoch of the full training split, with the sampler's padding."""
        per_rank = math.ceil(self.train_windows / self.strategy.world_size)
        return steps_per_epoch(math.ceil(per_rank / self.batch_size), self.grad_accum_steps)


def build_workload(args, strategy):
    """Data, model and optimizer as training/trainer.py builds them (constant LR: it does not
    change the cost of a step)."""
    data = load_har_data(args.dataset, args.data_dir, args.mode, args.val_fraction, split_seed=args.seed,
                         synthetic_seed=args.synthetic_seed,
                         synthetic_windows_per_subject=args.synthetic_windows_per_subject)
    train = normalize(data.train, *fit_normalization(data.train.signals))
    device = strategy.device
    torch.manual_seed(args.seed)  # identical initial weights on every rank
    model = build_model(args.model, train.signals.shape[1], len(data.class_names), dropout=args.dropout,
                        norm=args.norm).to(device)
    precision = Precision(device, args.amp, args.amp_dtype)
    train_model = strategy.wrap(model, precision)
    train_model = compile_for_training(train_model, args.run.hardware)
    optimizer = build_adamw(model, args.lr, args.weight_decay, device)
    sampler = ShardedSampler(len(train), world_size=strategy.world_size, rank=strategy.rank, shuffle=True,
                             seed=args.seed, pad=True)
    # The data path training would take with these flags, so the data wait is training's.
    if keep_on_device(args.data_path, args.num_workers, device, split_bytes(data.train, data.val, data.test)):
        loader = DeviceResidentLoader(train, args.batch_size, sampler, device)
    else:
        loader = make_loader(train, args.batch_size, sampler, args.num_workers, pin_memory=device.type == "cuda")
    return Workload(strategy, model, train_model, optimizer, precision.make_grad_scaler(), precision,
                    _endless(loader, sampler, args.batch_size), args.batch_size, args.grad_accum_steps,
                    args.max_grad_norm,
                    len(train), data.source)


def _endless(loader, sampler, batch_size):
    """Full batches across epoch boundaries, reshuffled each epoch like training; the restart cost
    lands in the data wait of the step that crosses it, as it would in training. An epoch's
    shorter last batch is left out: samples/s counts every step as a full batch, and a new shape
    would be autotuned (cuDNN) inside the timed steps."""
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        full = 0
        for batch in loader:
            if len(batch[1]) == batch_size:
                full += 1
                yield batch
        if not full:
            raise UsageError(f"--batch-size {batch_size} is more than one process's share of the training split "
                             f"({len(sampler)} windows): lower it, or profile with more data")
        epoch += 1


def optimizer_step(work, sync_gradients, timer):
    """One optimizer step as training/loop/step.py takes it. sync_gradients=False runs every
    micro-batch under DDP's no_sync(), i.e. the same step without the gradient all-reduce."""
    device, strategy = work.strategy.device, work.strategy
    for micro in range(work.grad_accum_steps):
        signals, labels = next(work.batches)
        signals = signals.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        timer.lap("data")
        reduce_now = sync_gradients and micro == work.grad_accum_steps - 1
        with contextlib.nullcontext() if reduce_now else strategy.no_sync():
            with work.precision.autocast():
                loss = F.cross_entropy(work.train_model(signals), labels)
            timer.lap("forward")
            work.grad_scaler.scale(loss / work.grad_accum_steps).backward()
            timer.lap("backward")
    if work.max_grad_norm > 0:
        work.grad_scaler.unscale_(work.optimizer)
        torch.nn.utils.clip_grad_norm_(work.model.parameters(), work.max_grad_norm)
    work.grad_scaler.step(work.optimizer)
    work.grad_scaler.update()
    work.optimizer.zero_grad(set_to_none=True)
    timer.lap("optimizer")

