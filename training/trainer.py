"""The trainer: assembles data, model, strategy and optimizer, runs the epochs, reports the test split."""
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from data.loaders import ShardedSampler, make_loader
from data.resident import DeviceResidentLoader, keep_on_device, split_bytes
from data.splits import fit_normalization, load_har_data, normalize
from models import build_model, count_parameters
from training.checkpoint import files as ckpt
from training.config.cli import data_options, save_dir_of, warmup_epochs
from training.loop.epoch import train_epochs
from training.errors import EXIT_PREEMPTED, RankLost, TrainingDiverged
from training.reporting.figures import write_run_figures
from training.reporting.logger import RunLogger
from training.loop.step import Optimization, build_adamw, compile_for_training
from training.loop.precision import Precision, skipped_step_buffers
from training.loop.preemption import StopSignals
from training.distributed.preflight import check_before_training
from training.loop.recipe import final_reports, generalisation_aids
from training.config.files import record_run_config
from training.loop.schedule import build_scheduler, global_batch_size, scaled_lr, steps_per_epoch
from training.distributed.strategy import make_strategy

EVAL_BATCH_MIN = 256


@dataclass
class Progress:
    """What a checkpoint must carry for the run to continue where it stopped."""
    epoch: int = 0  # epochs completed
    step: int = 0  # optimizer steps completed
    best_metric: float = -math.inf  # best validation macro-F1 so far
    epochs_since_best: int = 0
    epoch_position: int = 0  # samples of the current epoch's order already trained on, all ranks
    batch_in_epoch: int = 0  # micro-batches of the current epoch each rank already trained on


@dataclass
class Run:
    config: object  # the RunConfig
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
    loader_batch: int = 0  # samples per micro-batch drawn by each process
    progress: Progress = field(default_factory=Progress)
    stop_signals: StopSignals = None
    resume_state: dict = None  # mid-epoch state of a resumed run, used by its first epoch

    def take_resume_state(self):
        state, self.resume_state = self.resume_state, None
        return state

    def validation_model(self):
        """The weights validation, best.pt's choice and the test judge: the average when kept."""
        return self.opt.ema.module if self.opt.ema else self.strategy.eval_model(self.model)

    def layout(self):
        """What must match for a mid-epoch resume to continue bit for bit."""
        return {"world_size": self.strategy.world_size, "loader_batch": self.loader_batch,
                "grad_accum_steps": self.config.optim.grad_accum_steps}

    def checkpoint_state(self, rng_states, epoch_tally):
        progress = self.progress
        return {
            "model": self.model.state_dict(),  # the bare module: no module./_orig_mod. prefixes
            "optimizer": self.opt.optimizer.state_dict(),
            "scheduler": self.opt.scheduler.state_dict(),  # for inspection; resume rebuilds it
            "scaler": self.opt.grad_scaler.state_dict(),
            "ema": self.opt.ema.state() if self.opt.ema else None,
            "epoch": progress.epoch, "step": progress.step,
            "epoch_position": progress.epoch_position, "batch_in_epoch": progress.batch_in_epoch,
            "epoch_loss_sum": epoch_tally[0], "epoch_samples": epoch_tally[1],
            "best_metric": progress.best_metric, "epochs_since_best": progress.epochs_since_best,
            "rng": rng_states,  # one entry per rank
            "layout": self.layout(),
            "config": self.config.flags(),  # plain data, named as the flags
            "normalization": self.normalization,
            "world_size": self.strategy.world_size,
            "global_batch_size": self.global_batch,
            "in_channels": self.data.train.signals.shape[1],
            "num_classes": len(self.data.class_names),
            "class_names": list(self.data.class_names),
            "channel_names": list(self.data.channel_names),
            # What predict.py needs to rebuild windows from a recording.
            "sample_rate_hz": float(self.data.sample_rate_hz),
            "window_steps": self.data.train.signals.shape[2],
            "preprocessing": self.data.preprocessing,
        }


def train(config):
    """Train as `config` (a RunConfig) says; returns the process exit code."""
    lock = check_before_training(config)  # before any process group, so bad input fails alike on every rank
    strategy = make_strategy(config)
    stop_signals = StopSignals().install()
    try:
        run = _assemble(config, strategy)
        run.stop_signals = stop_signals
        outcome = train_epochs(run)
        if outcome == "complete":
            final_reports(run)
        if outcome != "preempted" and strategy.is_main:  # a preempted job's grace time is for saving
            write_run_figures(run.save_dir, run.log.warn, use_test=not config.data.no_test)
        run.log.close()
        return EXIT_PREEMPTED if outcome == "preempted" else 0
    except (TrainingDiverged, RankLost):
        raise
    except RuntimeError as exc:
        if strategy.world_size > 1:
            _explain_lost_rank(exc, strategy.rank, config.hardware.dist_timeout)
        raise
    finally:
        stop_signals.restore()
        strategy.close()
        lock.release()


def _explain_lost_rank(exc, rank, timeout_s):
    """Turn the backends' reports of a dead or stuck peer into one line that says what to do."""
    text = str(exc).lower()
    if "timed out" in text or "timeout" in text:
        raise RankLost(f"rank {rank} waited more than --dist-timeout {timeout_s:g} s for the other ranks: one "
                       "is stuck or has died. Check the other ranks' output; raise --dist-timeout only if a "
                       "step is legitimately that slow") from None
    if "connection closed by peer" in text or "connection reset by peer" in text:
        raise RankLost(f"rank {rank} lost its connection to another rank, which has most likely crashed (see its "
                       "output). With torchrun --max-restarts the group restarts and resumes from the last "
                       "checkpoint; otherwise run the same command again") from None


def _assemble(config, strategy):
    save_dir = save_dir_of(config)
    if strategy.is_main:
        ckpt.prepare_save_dir(save_dir)
    log = RunLogger(save_dir, strategy.is_main)
    resume_from, checkpoint = ckpt.load_resume_checkpoint(config.output.resume, save_dir, log.warn)

    data = load_har_data(**data_options(config))
    log.info(data.description)
    in_channels, num_classes = data.train.signals.shape[1], len(data.class_names)
    if checkpoint is not None:
        ckpt.check_compatible(checkpoint, {"model": config.model.name, "norm": config.model.norm, "mode": config.data.mode,
                                           "in_channels": in_channels, "num_classes": num_classes}, resume_from)
        mean, std = checkpoint["normalization"]["mean"].numpy(), checkpoint["normalization"]["std"].numpy()
    else:
        mean, std = fit_normalization(data.train.signals)
    for name in ("train", "val", "test"):
        setattr(data, name, normalize(getattr(data, name), mean, std))

    torch.manual_seed(config.optim.seed)  # identical initial weights on every rank
    model = build_model(config.model.name, in_channels, num_classes, dropout=config.model.dropout, norm=config.model.norm)
    if checkpoint is not None:
        model.load_state_dict(checkpoint["model"])
    model.to(strategy.device)
    precision = Precision(strategy.device, config.optim.amp, config.optim.amp_dtype)
    train_model = strategy.wrap(model, precision)
    train_model = compile_for_training(train_model, config.hardware)
    log.info(f"run: {strategy.describe()} | model {config.model.name}: {count_parameters(model):,} parameters | "
             f"{precision.describe()}")

    run = Run(config, strategy, log, save_dir, data, model, train_model, precision,
              normalization={"mean": torch.from_numpy(mean), "std": torch.from_numpy(std)},
              global_batch=global_batch_size(config.optim.batch_size, strategy.data_parallel_size,
                                             config.optim.grad_accum_steps))
    # DataParallel splits one loader batch over its GPUs; DDP ranks each load their own.
    run.loader_batch = config.optim.batch_size * strategy.data_parallel_size // strategy.world_size
    run.loaders = _make_loaders(run)
    if checkpoint is not None:
        _restore_progress(run, checkpoint, resume_from)
    strategy.check_same_on_all_ranks(run.progress.step, "the optimizer steps already taken")
    record_run_config(config, save_dir, checkpoint, log, strategy.is_main)
    run.opt = _make_optimization(run, checkpoint)
    return run


def _make_loaders(run):
    config, strategy = run.config, run.strategy
    splits = {"train": run.data.train, "val": run.data.val, "test": run.data.test}
    on_device = keep_on_device(config.hardware.data_path, config.hardware.num_workers, strategy.device, split_bytes(*splits.values()))
    run.log.info("data path: " + ("splits kept on the device, batches cut there" if on_device else
                                  f"DataLoader with {config.hardware.num_workers} worker(s)"))
    shards = dict(world_size=strategy.world_size, rank=strategy.rank)
    loaders = {}
    for name, split in splits.items():
        training = name == "train"
        sampler = ShardedSampler(len(split), shuffle=training, seed=config.optim.seed, pad=training, **shards)
        batch = run.loader_batch if training else max(EVAL_BATCH_MIN, run.loader_batch)
        loaders[name] = (DeviceResidentLoader(split, batch, sampler, strategy.device) if on_device else
                         make_loader(split, batch, sampler, config.hardware.num_workers, strategy.device.type == "cuda"))
    return loaders


def _make_optimization(run, checkpoint):
    """AdamW, the warmup-cosine schedule and the GradScaler; on resume the moments come back,
    while the LR, weight decay and schedule follow this run's flags from the epoch reached."""
    config, strategy = run.config, run.strategy
    peak_lr = scaled_lr(config.optim.lr, config.optim.lr_scaling, run.global_batch, config.optim.batch_size)
    steps_each_epoch = steps_per_epoch(len(run.loaders["train"]), config.optim.grad_accum_steps)
    total_steps = steps_each_epoch * config.optim.epochs
    warmup_steps = round(warmup_epochs(config.optim) * steps_each_epoch)
    # Decay only weight matrices and kernels; biases and norm scales are left alone.
    optimizer = build_adamw(run.model, peak_lr, config.optim.weight_decay, strategy.device)
    grad_scaler = run.precision.make_grad_scaler()
    start_step = 0
    if checkpoint is not None:
        # The saved groups carry the saving device's `fused` flag, which load_state_dict would
        # restore: a CPU checkpoint resumed on CUDA (or back) must use this device's kernel.
        saved = checkpoint["optimizer"]
        optimizer.load_state_dict({**saved, "param_groups": [{**group, "fused": optimizer.defaults["fused"]}
                                                             for group in saved["param_groups"]]})
        for group, decay in zip(optimizer.param_groups, (config.optim.weight_decay, 0.0)):
            group.update(lr=peak_lr, initial_lr=peak_lr, weight_decay=decay)
        start_step = run.progress.epoch * steps_each_epoch + _steps_into_epoch(run)
        if checkpoint["scaler"] and grad_scaler.is_enabled():
            grad_scaler.load_state_dict(checkpoint["scaler"])
    run.log.info(f"lr: reference {config.optim.lr:.2e}, {config.optim.lr_scaling} scaling, global batch {run.global_batch} "
                 f"({config.optim.batch_size} per GPU x {strategy.data_parallel_size} replicas x {config.optim.grad_accum_steps} "
                 f"accumulation) -> peak {peak_lr:.2e}; warmup {warmup_steps} of {total_steps} steps "
                 f"({steps_each_epoch} per epoch), then cosine to 0")
    augment, ema = generalisation_aids(run, checkpoint)
    return Optimization(optimizer, build_scheduler(optimizer, warmup_steps, total_steps, start_step),
                        grad_scaler, config.optim.grad_accum_steps, config.optim.max_grad_norm, config.recipe.label_smoothing,
                        augment, ema, skipped_step_buffers(run.model, run.precision))


def _restore_progress(run, checkpoint, path):
    progress = run.progress = Progress(
        checkpoint["epoch"], checkpoint["step"], checkpoint["best_metric"], checkpoint.get("epochs_since_best", 0),
        checkpoint.get("epoch_position", 0), checkpoint.get("batch_in_epoch", 0))
    where = (f"epoch {progress.epoch + 1}, sample {progress.epoch_position} of {len(run.data.train)}"
             if progress.epoch_position else f"{progress.epoch} epochs")
    run.log.info(f"\n*** RESUMING from {path}: {where} / {progress.step} steps done, best val macro-F1 "
                 f"{progress.best_metric:.4f}. Pass --no-resume to start over. ***\n")
    saved_layout = checkpoint.get("layout")
    exact = saved_layout == run.layout() and len(checkpoint.get("rng") or ()) == run.strategy.world_size
    if checkpoint["global_batch_size"] != run.global_batch:
        run.log.warn(f"global batch changes from {checkpoint['global_batch_size']} to {run.global_batch} on "
                     "resume: the peak LR and the steps per epoch (so the schedule's length) follow the new "
                     f"value, and the schedule continues from epoch {progress.epoch + 1}")
    if progress.epoch_position:
        if not exact:
            run.log.warn(f"resuming mid-epoch with another layout ({saved_layout} -> {run.layout()}): the "
                         f"epoch continues at sample {progress.epoch_position} of the same order, so no sample "
                         "is skipped or repeated, but accumulation windows and random streams restart, so the "
                         "weights will differ from an uninterrupted run")
        run.resume_state = {"exact": exact, "rng": checkpoint.get("rng"),
                            "loss_sum": checkpoint.get("epoch_loss_sum", 0.0),
                            "samples": checkpoint.get("epoch_samples", 0)}


def _steps_into_epoch(run):
    """Optimizer steps the resumed epoch already took, measured in this run's steps."""
    progress = run.progress
    if run.resume_state is None:
        return 0
    if run.resume_state["exact"]:
        return progress.batch_in_epoch // run.config.optim.grad_accum_steps
    return round(progress.epoch_position / run.global_batch)
