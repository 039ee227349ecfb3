"""A run from start to end (train) and its assembly (Trainer.build); the rooms it calls hold the rest.

One batch from the command line to the checkpoint: main.py parses a RunConfig and calls train().
Trainer.build normalises the data read before it (run_inputs.py), builds the model and lets the
strategy wrap it, makes the loaders, restores the checkpoint's parts and builds the TrainStep.
loop/epochs.py's fit() runs each epoch's pass (train_epoch), where every micro-batch goes through
TrainStep.accumulate and every accumulation window ends in TrainStep.update (loop/step.py); between
steps the ranks check in (loop/stop_protocol.py); at the epoch's end it validates, and the
CheckpointManager (checkpoint/manager.py) writes the train state and every part to last.pt. When
training is done, reporting/final_report.py writes the run's reports.
"""
import dataclasses
import signal
import threading
import time
from dataclasses import dataclass

import torch

from data.loaders import split_loaders
from data.splits import HarData, Split, fit_normalization, normalize
from evaluation.figures import write_run_figures
from models import MODELS, count_parameters, feature_views_of, label_smoothing_of, resolve_size, training_bytes
from training.checkpoint import files as ckpt
from training.checkpoint.earlier_run import continues_its_folder, earlier_run_files, move_aside
from training.checkpoint.format import PER_GPU_RULE_KEY, SavedRun, run_metadata
from training.checkpoint.manager import CheckpointManager, restore_parts
from training.checkpoint.train_state import RandomStreams, TrainState
from training.config.cli import write_resolved_config
from training.config.settings import DEFAULT_LR, RunConfig
from training.distributed.lost_rank import explain_lost_rank
from training.distributed.strategy import Strategy, check_parallel_args, free_bytes, make_strategy
from training.errors import EXIT_PREEMPTED, RankLost, TrainingDiverged, UsageError
from training.loop.epochs import fit
from training.loop.evaluation import gather_predictions
from training.loop.recipe import build_augmenter, build_weight_average
from training.loop.ridge_head import NothingToStep, fit_head_by_ridge, resolve_head_fit
from training.loop.step import (
    Precision,
    TrainStep,
    build_adamw,
    build_scheduler,
    compile_for_training,
    global_batch_size,
    lr_line,
    scaled_lr,
    scaling_warning,
    skipped_steps,
    steps_per_epoch,
)
from training.loop.step_graph import records_step_graph
from training.pool.build import PoolPlan, build_feature_pool, feature_store_root, wants_feature_pool
from training.reporting.final_report import report_best_weights
from training.reporting.logger import GIB, INPUTS_LAP, SET_UP_LAP, PhaseClock, RunLogger
from training.run_inputs import read_run_inputs

EVAL_BATCH_MIN = 256
# Stop requests from the outside: SLURM and torchrun send SIGTERM/SIGUSR1 before they kill a job.
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGUSR1") if hasattr(signal, name))


class StopSignals:
    """While installed, a stop signal only sets `received`; the run finishes its optimizer step,
    saves, and exits with EXIT_PREEMPTED instead of dying mid-write."""

    def __init__(self):
        self.received = None  # the signal's name once one arrived
        self._previous = {}

    def install(self):
        if threading.current_thread() is not threading.main_thread():
            return self  # Python only lets the main thread set handlers (e.g. under a test runner)
        for number in STOP_SIGNALS:
            self._previous[number] = signal.signal(number, self._handle)
        return self

    def restore(self):
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()

    def _handle(self, number, frame):
        self.received = signal.Signals(number).name


def train(config):
    """Train as `config` (a RunConfig) says; returns the process exit code."""
    placement = check_parallel_args(config)  # first: a flag the machine cannot serve is named before the data
    clock = PhaseClock()
    inputs = read_run_inputs(config)  # before any process group, so bad input fails alike on every rank
    clock.lap(INPUTS_LAP)
    lock = inputs.lock
    try:
        strategy = make_strategy(config, placement)
    except BaseException:
        lock.release()  # a process group that cannot form leaves --save-dir as it found it
        raise
    stop_signals = StopSignals().install()
    trainer = None
    try:
        trainer = Trainer.build(config, strategy, stop_signals, inputs=inputs)
        clock.lap(SET_UP_LAP)
        outcome = fit_head_by_ridge(trainer) if trainer.head_pool is not None else fit(trainer)
        clock.lap("training")
        if outcome == "complete":
            report_best_weights(trainer)
            clock.lap("evaluation")
        # A preempted job's grace time is for saving.
        if outcome != "preempted" and strategy.is_main and config.output.figures:
            write_run_figures(config.save_dir, trainer.log.warn, use_test=not config.data.no_test)
            clock.lap("figures")
        trainer.log.info(clock.line())
        trainer.log.info(f"{config.save_dir} holds: {', '.join(_run_files(config.save_dir))}")
        trainer.log.close()
        return EXIT_PREEMPTED if outcome == "preempted" else 0
    except (TrainingDiverged, RankLost):
        raise
    except RuntimeError as exc:
        if strategy.world_size > 1:
            explain_lost_rank(exc, strategy.rank, config.hardware.dist_timeout)
        raise
    finally:
        trainer = None  # the wrapped model goes before its process group (strategy.close)
        stop_signals.restore()
        strategy.close()
        lock.release()


@dataclass(kw_only=True)
class Trainer:
    """One run's data, model, training step, train state and checkpoints, assembled by build(), with
    what the epoch loop and the final report share: evaluate() and save()."""
    config: RunConfig
    strategy: Strategy
    log: RunLogger
    data: HarData  # normalised splits
    model: torch.nn.Module  # the bare model: what checkpoints hold
    precision: Precision
    loaders: dict  # split name -> this rank's batches
    loader_batch: int  # samples per micro-batch drawn by each process
    global_batch: int  # samples per optimizer step, all replicas and micro-batches together
    # The ranks a training batch is dealt over: the world size, or 1 when every rank steps the whole
    # batch (a replicated head, DistributedStrategy.replicate_model).
    batch_ranks: int
    step: TrainStep
    state: TrainState
    rng: RandomStreams
    checkpoints: CheckpointManager
    stop_signals: StopSignals
    exact_resume: bool = False  # the first epoch continues a mid-epoch checkpoint bit for bit
    first_epoch: int = 0  # the first epoch this invocation trains
    pool_figures: dict = None  # the feature pool's build (pool.build.pool_figures); None without a pool
    head_pool: Split = None  # the training windows' pooled counts when --head-fit resolves to ridge, else None
    epochs: int = 0  # the epochs this run trains: --epochs, or one when the head is solved by ridge

    @classmethod
    def build(cls, config, strategy, stop_signals=None, quiet=False, inputs=None):
        """Everything a run needs, resumed from its checkpoint when there is one. Under DDP every rank
        builds the same, so every rank must call this. `inputs`: what train() read before the process
        group (run_inputs.py); a tool's run reads them here, holding no lock. `quiet` keeps the run's
        console lines and TensorBoard off (a tool that only times the step)."""
        data, resume_from, checkpoint, warnings = (inputs or read_run_inputs(config, hold_lock=False)).take()
        save_dir, optim = config.save_dir, config.optim
        if strategy.is_main:
            ckpt.remove_partial_saves(save_dir)  # run_inputs.py checked the folder
        log = RunLogger(save_dir, strategy.is_main and not quiet)
        for warning in warnings:
            log.warn(warning)
        data, normalization = _normalize_data(data, checkpoint, log)
        head_fit, augment = _head_fit_and_augmenter(config, data, normalization, strategy, log)
        replicated = _replicates_the_head(config, strategy, head_fit, log)
        model, train_model, precision, ema = _build_model(config, data, strategy, log, checkpoint)
        global_batch = global_batch_size(optim.batch_size, strategy.data_parallel_size, optim.grad_accum_steps)
        batch_ranks, loader_batch = _training_batches(optim.batch_size, strategy, replicated)
        loaders, augment, pool_figures, pool = _build_loaders(config, data, model, augment, loader_batch, strategy,
                                                              log, replicated)

        peak_lr, per_gpu_rule = _peak_lr(optim, checkpoint, strategy.data_parallel_size, head_fit, log)
        record_graph = records_step_graph(config.hardware.cuda_graphs, model, strategy, precision,
                                          config.optim.grad_accum_steps, config.hardware.compile, log.warn)
        optimizer = NothingToStep() if head_fit == "ridge" else build_adamw(model, peak_lr, optim.weight_decay,
                                                                            strategy.device, capturable=record_graph)
        grad_scaler = precision.make_grad_scaler()
        state, rng = TrainState(), RandomStreams(strategy, replicas=replicated)
        parts = {"model": strategy.module_state(model), "optimizer": strategy.optimizer_state(model, optimizer),
                 "scaler": grad_scaler, "ema": ema, "rng": rng}
        layout = {"world_size": batch_ranks, "loader_batch": loader_batch,
                  "grad_accum_steps": optim.grad_accum_steps}
        exact_resume = checkpoint is not None and _resume(checkpoint, resume_from, state, parts, layout, global_batch,
                                                          len(data.train), config.parallel.grad_compression, log)
        strategy.check_same_on_all_ranks(state.step, "the optimizer steps already taken")

        scheduler = optimizer if head_fit == "ridge" else _position_schedule(
            optimizer, optim, len(loaders["train"]), state, global_batch, log)
        smoothing = label_smoothing_of(config.model.name, config.recipe.label_smoothing)
        step = TrainStep(model=train_model, parameters=[p for p in model.parameters() if p.requires_grad],
                         strategy=strategy, precision=precision, optimizer=optimizer, scheduler=scheduler,
                         grad_scaler=grad_scaler, grad_accum_steps=optim.grad_accum_steps,
                         max_grad_norm=optim.max_grad_norm, label_smoothing=smoothing, augment=augment, ema=ema,
                         skips=skipped_steps(model, precision, grad_scaler), record_graph=record_graph,
                         warn=log.warn)
        epochs = 1 if head_fit == "ridge" else optim.epochs  # a head solved by ridge: one 'epoch' of no step
        metadata = {**_checkpoint_metadata(config, data, normalization, strategy, global_batch, layout, epochs),
                    PER_GPU_RULE_KEY: per_gpu_rule}
        checkpoints = CheckpointManager(save_dir=save_dir, keep_last=config.output.keep_last, strategy=strategy,
                                        state=state, parts={**parts, "scheduler": scheduler}, metadata=metadata,
                                        resumed=resume_from is not None,
                                        before_first_save=_first_save(config, strategy, resume_from, checkpoint, log))
        return cls(config=config, strategy=strategy, log=log, data=data, model=model, precision=precision,
                   loaders=loaders, loader_batch=loader_batch, global_batch=global_batch, step=step, state=state,
                   rng=rng, checkpoints=checkpoints, stop_signals=stop_signals or StopSignals(),
                   batch_ranks=batch_ranks, exact_resume=exact_resume, pool_figures=pool_figures,
                   head_pool=pool["train"] if head_fit == "ridge" else None, epochs=epochs)

    def evaluate(self, split, model=None):
        """(labels, logits, mean loss) of "val" or "test" over every rank, by `model` or else the
        validation weights (the average when kept)."""
        self._sync_buffers()
        return gather_predictions(model or self.validation_model(), self.loaders[split], self.strategy,
                                  self.precision, len(self.data.class_names))

    @property
    def has_validation(self):
        """False under --val-fraction 0: every epoch's weights become best.pt, none is validated."""
        return len(self.data.val) > 0

    def validation_model(self):
        """The weights validation, best.pt's choice and the test judge: the average when kept."""
        return self.step.ema.module if self.step.ema else self.strategy.eval_model(self.model)

    @property
    def micro_batch_samples(self):
        """Samples of the epoch one micro-batch covers: each process's loader batch, over the ranks it is dealt to."""
        return self.loader_batch * self.batch_ranks

    @property
    def replicated(self):
        """Whether every rank steps the whole global batch on a replica of its own."""
        return self.batch_ranks < self.strategy.world_size

    def align_replicas(self):
        """A replicated head's weights, optimizer moments and average made rank 0's on every rank: the
        same steps on the same batches keep replicas equal on one kind of hardware, and this keeps
        them one model on mixed nodes too (once an epoch, a few small broadcasts)."""
        if not self.replicated:
            return
        moments = [value for state in self.step.optimizer.state.values() for value in state.values()
                   if torch.is_tensor(value)]
        average = list(self.step.ema.module.parameters()) if self.step.ema else []
        self.strategy.align_with_rank0([*self.model.parameters(), *moments, *average])

    def save(self, is_best):
        """A checkpoint of where the run stands; every rank takes part (buffers and random streams)."""
        self._sync_buffers()
        self.checkpoints.save(is_best)

    def _sync_buffers(self):
        """Give every rank rank 0's buffers (DDP does not broadcast them each step), in the model and
        in its average, before anything reads them: evaluation, or a checkpoint every rank resumes from.
        Buffers no step changes (FIXED_BUFFERS: MiniRocket's fitted kernels and statistics) are rank 0's
        since the model was wrapped, so nothing is sent (for MiniRocket 28 broadcasts an epoch: 7 buffers,
        model and average, before validation and before the save)."""
        if self.model.FIXED_BUFFERS:
            return
        self.strategy.sync_buffers(self.model)
        if self.step.ema is not None:
            self.strategy.sync_buffers(self.step.ema.module)

def _run_files(save_dir):
    """What a run leaves in its folder, folders marked with a slash; hidden files left out."""
    return [path.name + ("/" if path.is_dir() else "") for path in sorted(save_dir.iterdir())
            if not path.name.startswith(".")]


def _first_save(config, strategy, resume_from, checkpoint, log):
    """What rank 0 does with the run's first save: move an earlier run's files aside (unless this run
    continues the folder's own checkpoint), then write config.yaml with the settings the weights were
    trained with: a run that trains nothing records its checkpoint's, not this command's."""
    save_dir = config.save_dir
    continues = continues_its_folder(resume_from, save_dir)
    earlier = earlier_run_files(save_dir) if strategy.is_main and not continues else []
    saved_flags = SavedRun(checkpoint).flags if checkpoint is not None else None

    def first_save(trained):
        move_aside(save_dir, earlier, log.info)
        settings = config if trained or saved_flags is None else RunConfig.from_flags({**config.flags(), **saved_flags})
        write_resolved_config(settings, save_dir)
    return first_save


def _normalize_data(data, checkpoint, log):
    """The splits, normalised with the training split's statistics (a resumed run keeps its own)."""
    log.info(data.description)
    if checkpoint is not None:  # held against this run by run_inputs.py (checkpoint/judge.py)
        saved = SavedRun.of(checkpoint).normalization
        mean, std = saved["mean"].numpy(), saved["std"].numpy()
    elif data.normalization is not None:
        mean, std = data.normalization  # a store's, gathered when it was built: no pass over the data here
    else:
        mean, std = fit_normalization(data.train.signals, data.padded)
    data = dataclasses.replace(data, **{name: normalize(getattr(data, name), mean, std)
                                        for name in ("train", "val", "test")})
    return data, {"mean": torch.from_numpy(mean), "std": torch.from_numpy(std)}


def head_fit_of(config, train_windows, strategy):
    """How a run of `config` fits its head: 'ridge' or 'adamw', --head-fit resolved for a training split
    of `train_windows` (the profiler asks too: it times steps, which a head solved by ridge never takes)."""
    return resolve_head_fit(config.optim.head_fit, MODELS[config.model.name],
                            feature_views_of(config.model.name, config.recipe.feature_views) > 0, train_windows,
                            strategy)


def _head_fit_and_augmenter(config, data, normalization, strategy, log):
    """How the head is fitted ('ridge' or 'adamw', --head-fit resolved for this data) and the batch
    augmenter: none for a head solved by ridge, which sees the windows as they are in one view."""
    head_fit = head_fit_of(config, len(data.train), strategy)
    if head_fit == "ridge":
        return head_fit, None
    return head_fit, build_augmenter(config.recipe, normalization, data.channel_names, data.class_names,
                                     strategy.device, log.warn, data.sensor_triples(), data.padded)


def replicates_the_head(config, head_fit):
    """Whether DDP's ranks would train replicas of this run's model, each stepping the whole global
    batch (--pool-head replicated): a head trained by steps over a feature pool, which every rank
    holds whole."""
    model_class, views = MODELS[config.model.name], feature_views_of(config.model.name, config.recipe.feature_views)
    return config.parallel.pool_head == "replicated" and head_fit == "adamw" and wants_feature_pool(model_class, views)


def _replicates_the_head(config, strategy, head_fit, log):
    """replicates_the_head under DDP on 2+ ranks; tells the strategy before it wraps the model."""
    if not (strategy.name == "ddp" and strategy.world_size > 1 and replicates_the_head(config, head_fit)):
        return False
    strategy.replicate_model()
    if config.parallel.grad_compression != "none":
        log.warn(f"--grad-compression {config.parallel.grad_compression} compresses nothing here: the head's "
                 "replicas exchange no gradients (--pool-head ddp all-reduces them)")
    return True


def _training_batches(batch_size, strategy, replicated):
    """(the ranks a training batch is dealt over, the samples each process loads per micro-batch).
    DataParallel splits one loader batch over its GPUs; DDP ranks each load their own share of the
    global batch, or all of it when each steps it (a replicated head)."""
    batch_ranks = 1 if replicated else strategy.world_size
    return batch_ranks, batch_size * strategy.data_parallel_size // batch_ranks


def _build_loaders(config, data, model, augment, loader_batch, strategy, log, replicated=False):
    """The splits' loaders, over a feature pool where the model's features are fixed, the augmenter
    the step applies (None when the pool's views carry the augmentation), the pool's build figures
    (None without a pool), and the splits the loaders read (the pool's, or the windows).
    `replicated`: every rank draws the whole training batches (a replicated head)."""
    optim = config.optim
    splits, train_views, figures = {"train": data.train, "val": data.val, "test": data.test}, 1, None
    views = feature_views_of(config.model.name, config.recipe.feature_views)
    if wants_feature_pool(model, views):
        # Epoch e trains on view e mod V, so a run of fewer epochs than views never reaches the
        # last ones: they are not built.
        views = min(views, optim.epochs)
        figures = {}
        plan = PoolPlan(views=views, augment=augment, seed=optim.seed,
                        store_root=feature_store_root(config.save_dir, splits))
        splits, train_views = build_feature_pool(model, splits, plan, strategy, log, figures)
        augment = None
    # On a CPU a pool on disk reaches the step as features, turned from counts by the store's reader
    # thread: the step's first operation, done beside it (about an eighth of a step, docs/performance.md).
    # A GPU takes the counts, a quarter of the features' bytes, and turns them itself in microseconds.
    convert = model.from_counts if figures is not None and strategy.device.type == "cpu" else None
    loaders, data_path = split_loaders(splits, loader_batch, max(EVAL_BATCH_MIN, loader_batch), strategy.device,
                                       strategy.world_size, strategy.rank, optim.seed, config.hardware.data_path,
                                       config.hardware.num_workers, train_views, whole_training_batches=replicated,
                                       convert=convert)
    log.info(f"data path: {data_path}")
    return loaders, augment, figures, splits


def _build_model(config, data, strategy, log, checkpoint=None):
    """The bare model (what checkpoints hold), the same wrapped and maybe compiled (what the step
    calls), the run's precision, and the weight average (None when off), copied before the strategy
    lays the model out and then laid out the same way. A model fitted to data takes a resumed run's
    fitted parts from its `checkpoint`."""
    settings, sizes = config.model, config.model.size()
    _, channels, window_steps = data.train.signals.shape
    # Sizes whose model cannot fit are refused before anything that size is allocated.
    need = training_bytes(settings.name, channels, len(data.class_names), window_steps=window_steps, **sizes)
    free = free_bytes(strategy.device)
    if free is not None and need > free:
        given = "".join(f" --{knob} {value}" for knob, value in sizes.items() if value is not None)
        raise UsageError(f"--model {settings.name}{given} needs about {need / GIB:,.1f} GiB to train "
                         f"(weights, gradients and AdamW's state) and {strategy.device} has {free / GIB:,.1f} GiB "
                         "free; use smaller size flags")
    torch.manual_seed(config.optim.seed)  # identical initial weights on every rank
    # Built and fitted on the host, then moved: a fit is a few hundred small operations on 512 windows
    # (0.2 s on the host against 1.2 to 3.9 s on an H200, which tuned a convolution per dilation first).
    model = settings.build(channels, len(data.class_names), window_steps)
    if model.FITS_TO_DATA and checkpoint is not None:
        # A resumed run's own fixed parts, before anything is computed from them (the feature pool):
        # fitted again, they would differ wherever this run's training windows differ from its.
        saved = SavedRun.of(checkpoint).weights
        model.load_state_dict({name: saved[name] for name, _ in model.named_buffers() if name in saved}, strict=False)
        log.info(f"took {settings.name}'s fixed parts from the checkpoint")
    elif model.FITS_TO_DATA:
        # Fixed parts that depend on the data (MiniRocket's biases), set once from the training
        # windows (in memory or a store's), before the weight average copies the model.
        started = time.perf_counter()
        model.fit(data.train.signals, padded=data.padded)
        log.info(f"fitted {settings.name}'s fixed parts to the training windows in "
                 f"{time.perf_counter() - started:.1f} s")
    model = model.to(strategy.device)
    gradient_mb = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad) / 2**20
    size = ", ".join(f"{knob} {value}" for knob, value in resolve_size(settings.name, **sizes).items())
    ema = build_weight_average(config.recipe, model)
    precision = Precision(strategy.device, config.optim.amp, config.optim.amp_dtype)
    train_model = compile_for_training(strategy.wrap(model, precision), config.hardware)
    if ema is not None:
        strategy.shard_like(ema.module)
        ema.weights = strategy.module_state(ema.module)
    log.info(f"run: {strategy.describe()} | model {config.model.name} ({size}): {count_parameters(model):,} "
             f"parameters, {gradient_mb:.2f} MB of gradients per step | {precision.describe()}"
             f"{' | deterministic algorithms' if config.hardware.deterministic else ''}")
    return model, train_model, precision, ema


def _position_schedule(optimizer, optim, micro_batches_per_epoch, state, global_batch, log):
    """Warmup then cosine, a pure function of the step, positioned from the train state: a resumed run
    that changed the global batch re-lays it in its own steps, said in the log."""
    steps_each_epoch = steps_per_epoch(micro_batches_per_epoch, optim.grad_accum_steps)
    total_steps = steps_each_epoch * optim.epochs
    warmup_steps = round(optim.planned_warmup_epochs * steps_each_epoch)
    log.info(f"lr schedule: warmup {warmup_steps} of {total_steps} steps ({steps_each_epoch} per epoch), then "
             "cosine to 0")
    return build_scheduler(optimizer, warmup_steps, total_steps, state.schedule_step(steps_each_epoch, global_batch))


# A run begun before --lr-reference-batch keeps scaling its LR against its per-GPU batch to its end
# (its checkpoints say so under PER_GPU_RULE_KEY), so no running schedule changes.
PER_GPU_RULE_NOTE = (" (this run began before --lr-reference-batch: its LR keeps scaling against its per-GPU batch, "
                     "as it did then)")


def _peak_lr(optim, checkpoint, replicas, head_fit, log):
    """(the peak LR, whether it follows the per-GPU rule of a run begun before the reference batch), with
    its arithmetic in the log (and a warning far above the default's); a head solved by ridge has none."""
    reference_batch, per_gpu_rule = _lr_reference_batch(optim, checkpoint)
    split = (optim.batch_size, replicas, optim.grad_accum_steps)
    global_batch = global_batch_size(*split)
    peak_lr = scaled_lr(optim.lr, optim.lr_scaling, global_batch, reference_batch)
    lr_warning = scaling_warning(optim.lr, optim.lr_scaling, global_batch, reference_batch, DEFAULT_LR)
    if lr_warning:
        log.warn(lr_warning)
    if head_fit != "ridge":
        log.info("lr: " + lr_line(optim.lr, optim.lr_scaling, reference_batch, peak_lr, split)
                 + (PER_GPU_RULE_NOTE if per_gpu_rule else ""))
    return peak_lr, per_gpu_rule


def _lr_reference_batch(optim, checkpoint):
    """(the global batch --lr is meant for, whether that is the per-GPU batch of a run begun before the
    reference batch existed)."""
    per_gpu_rule = checkpoint is not None and SavedRun(checkpoint).lr_scales_by_per_gpu_batch()
    return (optim.batch_size if per_gpu_rule else optim.lr_reference_batch), per_gpu_rule


def _resume(checkpoint, path, state, parts, layout, global_batch, train_windows, grad_compression, log):
    """Restore the checkpoint's parts and say where the run resumes and what starts afresh; True when a
    mid-epoch resume can continue bit for bit (the same ranks and batch layout, and every rank's
    random streams saved)."""
    saved = SavedRun(checkpoint)
    restore_parts(saved, state, parts)
    log.keep_epochs_up_to(state.epoch)  # an earlier checkpoint than the log's last line: one line an epoch
    where = (f"epoch {state.epoch + 1}, sample {state.epoch_position} of {train_windows}"
             if state.epoch_position else f"{state.epoch} epochs")
    log.info(f"\n*** RESUMING from {path}: {where} / {state.step} steps done, best val macro-F1 "
             f"{state.best_metric:.4f}. Pass --no-resume to start over. ***\n")
    if saved.global_batch_size != global_batch:
        log.warn(f"global batch changes from {saved.global_batch_size} to {global_batch} on resume: the "
                 "peak LR and the steps per epoch (so the schedule's length) follow the new value, and the "
                 f"schedule continues from epoch {state.epoch + 1}")
    exact = saved.batch_layout == layout and parts["rng"].covers_every_rank()
    if state.epoch_position and not exact:
        log.warn(f"resuming mid-epoch with another layout ({saved.batch_layout} -> {layout}): the epoch "
                 f"continues at sample {state.epoch_position} of the same order, so no sample is skipped or "
                 "repeated, but accumulation windows and random streams restart, so the weights will differ "
                 "from an uninterrupted run")
    if grad_compression == "powersgd":
        log.warn("PowerSGD's error feedback is not in the checkpoint: the resumed run starts it afresh, "
                 "so it does not continue bit for bit")
    if parts["ema"] is not None and not saved.part("ema"):
        log.info("the checkpoint has no weight average: it starts from the resumed weights")
        parts["ema"].restart()
    return bool(state.epoch_position) and exact


def _checkpoint_metadata(config, data, normalization, strategy, global_batch, layout, epochs):
    """What a checkpoint carries beside the state (checkpoint/format.py: run_metadata): enough to use it
    without the trainer, and the epochs its run trains (`epochs`: --epochs, or one for a head solved by ridge)."""
    return run_metadata(config=config, data=data, normalization=normalization, world_size=strategy.world_size,
                        global_batch=global_batch, batch_layout=layout, planned_epochs=epochs)
