"""The trainer: assembles data, model, strategy and optimizer, runs the epochs, reports the test split."""
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from data.loaders import ShardedSampler, make_loader
from data.splits import fit_normalization, load_har_data, normalize
from models import build_model, count_parameters
from training import checkpoint as ckpt
from training.cli import save_dir_of, warmup_epochs
from training.logger import RunLogger
from training.loop import Optimization, predict, train_one_epoch
from training.precision import Precision
from training.report import classification_report, format_report, summary_metrics
from training.schedule import build_scheduler, global_batch_size, scaled_lr, steps_per_epoch
from training.strategy import make_strategy

EVAL_BATCH_MIN = 256


@dataclass
class Progress:
    """What a checkpoint must carry for the run to continue where it stopped."""
    epoch: int = 0  # epochs completed
    step: int = 0  # optimizer steps completed
    best_metric: float = -math.inf  # best validation macro-F1 so far
    epochs_since_best: int = 0


@dataclass
class Run:
    args: object
    strategy: object
    log: RunLogger
    save_dir: Path
    data: object
    model: torch.nn.Module  # the bare model: what checkpoints hold
    train_model: torch.nn.Module  # the wrapped (and maybe compiled) model the loop calls
    precision: Precision
    opt: Optimization = None
    loaders: dict = field(default_factory=dict)
    normalization: dict = None
    global_batch: int = 0  # samples per optimizer step, all replicas and micro-batches together
    progress: Progress = field(default_factory=Progress)


def train(args):
    """Train as configured by the parsed CLI `args`; returns the process exit code."""
    strategy = make_strategy(args)
    try:
        run = _assemble(args, strategy)
        finished = _train_epochs(run)
        if finished:
            _evaluate_test(run)
        run.log.close()
        return 0
    finally:
        strategy.close()


def _assemble(args, strategy):
    save_dir = save_dir_of(args)
    if strategy.is_main:
        ckpt.prepare_save_dir(save_dir)
    log = RunLogger(save_dir, strategy.is_main)
    resume_from = ckpt.resume_path(args.resume, save_dir)
    checkpoint = ckpt.load_checkpoint(resume_from) if resume_from else None

    data = load_har_data(args.dataset, args.data_dir, args.mode, args.val_fraction, split_seed=args.seed,
                         synthetic_seed=args.synthetic_seed,
                         synthetic_windows_per_subject=args.synthetic_windows_per_subject)
    log.info(data.description)
    in_channels, num_classes = data.train.signals.shape[1], len(data.class_names)
    if checkpoint is not None:
        ckpt.check_compatible(checkpoint, {"model": args.model, "norm": args.norm, "mode": args.mode,
                                           "in_channels": in_channels, "num_classes": num_classes}, resume_from)
        mean, std = checkpoint["normalization"]["mean"].numpy(), checkpoint["normalization"]["std"].numpy()
    else:
        mean, std = fit_normalization(data.train.signals)
    for name in ("train", "val", "test"):
        setattr(data, name, normalize(getattr(data, name), mean, std))

    torch.manual_seed(args.seed)  # identical initial weights on every rank
    model = build_model(args.model, in_channels, num_classes, dropout=args.dropout, norm=args.norm)
    if checkpoint is not None:
        model.load_state_dict(checkpoint["model"])
    model.to(strategy.device)
    precision = Precision(strategy.device, args.amp, args.amp_dtype)
    train_model = strategy.wrap(model, precision)
    if args.compile:
        train_model = torch.compile(train_model)  # around DDP, so no_sync stays on the DDP module
    log.info(f"run: {strategy.describe()} | model {args.model}: {count_parameters(model):,} parameters | "
             f"{precision.describe()}")

    run = Run(args, strategy, log, save_dir, data, model, train_model, precision,
              normalization={"mean": torch.from_numpy(mean), "std": torch.from_numpy(std)},
              global_batch=global_batch_size(args.batch_size, strategy.data_parallel_size,
                                             args.grad_accum_steps))
    run.loaders = _make_loaders(run)
    if checkpoint is not None:
        _restore_progress(run, checkpoint, resume_from)
    strategy.check_same_on_all_ranks(run.progress.epoch, "the number of epochs already trained")
    run.opt = _make_optimization(run, checkpoint)
    return run


def _make_loaders(run):
    args, strategy = run.args, run.strategy
    # DataParallel splits one loader batch over its GPUs; DDP ranks each load their own.
    loader_batch = args.batch_size * strategy.data_parallel_size // strategy.world_size
    pin = strategy.device.type == "cuda"
    shards = dict(world_size=strategy.world_size, rank=strategy.rank)
    train_sampler = ShardedSampler(len(run.data.train), shuffle=True, seed=args.seed, pad=True, **shards)
    loaders = {"train": make_loader(run.data.train, loader_batch, train_sampler, args.num_workers, pin)}
    for name in ("val", "test"):
        sampler = ShardedSampler(len(getattr(run.data, name)), shuffle=False, pad=False, **shards)
        loaders[name] = make_loader(getattr(run.data, name), max(EVAL_BATCH_MIN, loader_batch), sampler,
                                    args.num_workers, pin)
    return loaders


def _make_optimization(run, checkpoint):
    """AdamW, the warmup-cosine schedule and the GradScaler; on resume the moments come back,
    while the LR, weight decay and schedule follow this run's flags from the epoch reached."""
    args, strategy = run.args, run.strategy
    peak_lr = scaled_lr(args.lr, args.lr_scaling, run.global_batch, args.batch_size)
    steps_each_epoch = steps_per_epoch(len(run.loaders["train"]), args.grad_accum_steps)
    total_steps = steps_each_epoch * args.epochs
    warmup_steps = round(warmup_epochs(args) * steps_each_epoch)
    # Decay only weight matrices and kernels; biases and norm scales are left alone.
    params = [p for p in run.model.parameters() if p.requires_grad]
    decays = (args.weight_decay, 0.0)
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": decays[0]},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": decays[1]}]
    # The fused CUDA kernel also lets an fp16 GradScaler skip its per-step host sync.
    optimizer = torch.optim.AdamW(groups, lr=peak_lr, fused=True if strategy.device.type == "cuda" else None)
    grad_scaler = run.precision.make_grad_scaler()
    start_step = 0
    if checkpoint is not None:
        optimizer.load_state_dict(checkpoint["optimizer"])
        for group, decay in zip(optimizer.param_groups, decays):
            group.update(lr=peak_lr, initial_lr=peak_lr, weight_decay=decay)
        start_step = run.progress.epoch * steps_each_epoch
        if checkpoint["scaler"] and grad_scaler.is_enabled():
            grad_scaler.load_state_dict(checkpoint["scaler"])
    run.log.info(f"lr: reference {args.lr:.2e}, {args.lr_scaling} scaling, global batch {run.global_batch} "
                 f"({args.batch_size} per GPU x {strategy.data_parallel_size} replicas x {args.grad_accum_steps} "
                 f"accumulation) -> peak {peak_lr:.2e}; warmup {warmup_steps} of {total_steps} steps "
                 f"({steps_each_epoch} per epoch), then cosine to 0")
    return Optimization(optimizer, build_scheduler(optimizer, warmup_steps, total_steps, start_step),
                        grad_scaler, args.grad_accum_steps, args.max_grad_norm)


def _restore_progress(run, checkpoint, path):
    run.progress = Progress(checkpoint["epoch"], checkpoint["step"], checkpoint["best_metric"],
                            checkpoint.get("epochs_since_best", 0))
    run.log.info(f"\n*** RESUMING from {path}: {checkpoint['epoch']} epochs / {checkpoint['step']} steps done, "
                 f"best val macro-F1 {checkpoint['best_metric']:.4f}. Pass --no-resume to start over. ***\n")
    if checkpoint["global_batch_size"] != run.global_batch:
        run.log.warn(f"global batch changes from {checkpoint['global_batch_size']} to {run.global_batch} on "
                     "resume: the peak LR and steps per epoch follow the new value, and the schedule "
                     f"continues from epoch {checkpoint['epoch']}")


def _train_epochs(run):
    """Train until --epochs, early stopping or --stop-after-epochs; True when the run is complete."""
    args, log, progress = run.args, run.log, run.progress
    if progress.epoch >= args.epochs:
        log.info(f"already trained for {progress.epoch} of {args.epochs} epochs; evaluating the test split")
        return True
    if _patience_exhausted(args, progress):
        log.info(f"this run already stopped early ({progress.epochs_since_best} epochs without a better "
                 "validation macro-F1); evaluating the test split")
        return True
    first_epoch = progress.epoch
    for epoch in range(first_epoch, args.epochs):
        _run_epoch(run, epoch)
        if _patience_exhausted(args, progress):
            log.info(f"early stopping: no better validation macro-F1 for {progress.epochs_since_best} epochs")
            return True
        if epoch + 1 - first_epoch == args.stop_after_epochs and epoch + 1 < args.epochs:
            log.info(f"stopping after {args.stop_after_epochs} epoch(s) as asked; run the same command again "
                     f"to continue from epoch {epoch + 2}")
            return False
    return True


def _patience_exhausted(args, progress):
    return bool(args.early_stopping_patience) and progress.epochs_since_best >= args.early_stopping_patience


def _run_epoch(run, epoch):
    """Train one epoch, validate, checkpoint (rank 0) and log the epoch record."""
    args, strategy, log, progress = run.args, run.strategy, run.log, run.progress
    epoch_start = time.perf_counter()
    run.loaders["train"].sampler.set_epoch(epoch)
    # Dropout masks depend only on (seed, epoch, rank), so resuming at an epoch is exact.
    torch.manual_seed(args.seed * 1_000_003 + epoch * 1_009 + strategy.rank)
    bar = log.progress(len(run.loaders["train"]), f"epoch {epoch + 1}/{args.epochs}")
    step_base = progress.step

    def on_log(steps, loss, lr):
        bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}")
        log.log_step(step_base + steps, loss, lr)

    result = train_one_epoch(run.train_model, run.loaders["train"], run.opt, strategy, run.precision,
                             bar, args.log_interval, on_log if strategy.is_main else None)
    bar.close()
    labels, predictions, val_loss = predict(strategy.eval_model(run.model), run.loaders["val"], strategy,
                                            run.precision)
    metrics = summary_metrics(labels, predictions, len(run.data.class_names))
    is_best = metrics["macro_f1"] > progress.best_metric
    progress.epoch, progress.step = epoch + 1, progress.step + result.steps
    progress.best_metric = max(progress.best_metric, metrics["macro_f1"])
    progress.epochs_since_best = 0 if is_best else progress.epochs_since_best + 1
    if strategy.is_main:
        state = _checkpoint_state(run)
        ckpt.save_checkpoint(state, run.save_dir / ckpt.LAST)
        if is_best:
            ckpt.save_checkpoint(state, run.save_dir / ckpt.BEST)
    record = {"epoch": epoch + 1, "epochs": args.epochs, "step": progress.step,
              "train_loss": result.train_loss, "val_loss": val_loss, "val_acc": metrics["acc"],
              "val_macro_f1": metrics["macro_f1"], "lr": run.opt.scheduler.get_last_lr()[0],
              "samples_per_s": result.samples_per_s, "train_time_s": result.train_time_s,
              "epoch_time_s": time.perf_counter() - epoch_start, "world_size": strategy.world_size,
              "global_batch_size": run.global_batch, "memory": strategy.memory_report()}
    log.log_epoch(record, is_best)


def _checkpoint_state(run):
    return {
        "model": run.model.state_dict(),  # the bare module: no module./_orig_mod. prefixes
        "optimizer": run.opt.optimizer.state_dict(),
        "scheduler": run.opt.scheduler.state_dict(),  # for inspection; resume rebuilds it from the epoch
        "scaler": run.opt.grad_scaler.state_dict(),
        "epoch": run.progress.epoch,
        "step": run.progress.step,
        "best_metric": run.progress.best_metric,
        "epochs_since_best": run.progress.epochs_since_best,
        "config": {key: value for key, value in vars(run.args).items()},
        "normalization": run.normalization,
        "world_size": run.strategy.world_size,
        "global_batch_size": run.global_batch,
        "in_channels": run.data.train.signals.shape[1],
        "num_classes": len(run.data.class_names),
        "class_names": list(run.data.class_names),
        "channel_names": list(run.data.channel_names),
    }


def _evaluate_test(run):
    """Reload the best weights and report the test split, seen here for the first time."""
    best_path = run.save_dir / ckpt.BEST
    if run.strategy.is_main:
        if best_path.is_file():
            run.model.load_state_dict(ckpt.load_checkpoint(best_path)["model"])
        else:
            run.log.warn(f"{best_path} not found; reporting the test split with the current weights")
    run.strategy.broadcast_module(run.model)  # ranks on other nodes may not see rank 0's files
    labels, predictions, test_loss = predict(run.strategy.eval_model(run.model), run.loaders["test"],
                                             run.strategy, run.precision)
    report = {**classification_report(labels, predictions, run.data.class_names), "loss": test_loss,
              "checkpoint": str(best_path)}
    run.log.write_json("test_report.json", report)
    run.log.info("test split (best checkpoint by validation macro-F1):\n" + format_report(report))
    run.log.info(f"wrote {run.save_dir / 'test_report.json'}")
