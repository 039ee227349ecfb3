"""A run from start to end (train) and its assembly (Trainer.build); the rooms it calls hold the rest.

One batch from the command line to the checkpoint: main.py parses a RunConfig and calls train().
Trainer.build normalises the data read before it (run_inputs.py), builds the model and lets the
strategy wrap it, makes the loaders (those parts: assembly.py), restores the checkpoint's parts and
builds the TrainStep.
loop/epochs.py's fit() runs each epoch's pass (train_epoch), where every micro-batch goes through
TrainStep.accumulate and every accumulation window ends in TrainStep.update (loop/step.py); between
steps the ranks check in (loop/stop_protocol.py); at the epoch's end it validates, and the
CheckpointManager (checkpoint/manager.py) writes the train state and every part to last.pt. When
training is done, reporting/final_report.py writes the run's reports.
"""
import signal
import threading
from dataclasses import dataclass

import torch

from data.splits import HarData, Split
from evaluation.figures import write_run_figures
from models import label_smoothing_of
from training.assembly import (
    augmentations_of,
    build_loaders,
    build_optimizer,
    build_run_model,
    first_weights,
    head_fit_and_augmenter,
    loader_request,
    normalize_data,
    peak_lr_of,
    pool_head_plan,
    position_schedule,
    replicates_under_ddp,
    training_batches,
)
from training.checkpoint import files as ckpt
from training.checkpoint.earlier_run import continues_its_folder, earlier_run_files, move_aside
from training.checkpoint.format import PER_GPU_RULE_KEY, SavedRun, run_metadata
from training.checkpoint.manager import CheckpointManager, restore_parts
from training.checkpoint.train_state import RandomStreams, TrainState
from training.config.cli import write_resolved_config
from training.config.settings import RunConfig
from training.distributed.lost_rank import explain_lost_rank
from training.distributed.strategy import Strategy, check_parallel_args, make_strategy
from training.errors import EXIT_PREEMPTED, RankLost, TrainingDiverged
from training.loop.epochs import fit
from training.loop.evaluation import gather_predictions
from training.loop.head_again import PoolHead
from training.loop.refit import finish
from training.loop.ridge_head import fit_head_by_ridge
from training.loop.step import (
    Precision,
    TrainStep,
    global_batch_size,
    skipped_steps,
)
from training.reporting.logger import INPUTS_LAP, SET_UP_LAP, PhaseClock, RunLogger
from training.run_inputs import read_run_inputs

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
            outcome = finish(trainer)
            clock.lap("recipe, final model and evaluation" if trainer.chooses or trainer.refits else "evaluation")
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
    # What a head trained again after the epochs needs (the recipe's candidate, the final model), or None.
    pool_head: PoolHead = None
    refits: bool = False  # the final model trains on every training person (training/loop/refit.py)
    chooses: bool = False  # the validation people choose the recipe (training/loop/recipe_choice.py)
    saving: bool = True  # False while the final model trains: its pass writes one checkpoint, at its end

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
        data, normalization = normalize_data(data, checkpoint, log)
        head_fit, augment = head_fit_and_augmenter(config, data, normalization, strategy, log)
        replicated = replicates_under_ddp(config, strategy, head_fit, log)
        model, train_model, precision, ema = build_run_model(config, data, strategy, log, checkpoint)
        global_batch = global_batch_size(optim.batch_size, strategy.data_parallel_size, optim.grad_accum_steps)
        batch_ranks, loader_batch = training_batches(optim.batch_size, strategy, replicated)
        refits, chooses = pool_head_plan(config, strategy, data, head_fit, augment, log, checkpoint)
        request, augmentations = loader_request(config, strategy, loader_batch, replicated), augmentations_of(augment)
        loaders, augment, pool_figures, pool = build_loaders(config, data, model, augment, request, strategy, log)
        pool_head = PoolHead(pool, first_weights(model), request, augmentations) if refits or chooses else None
        peak_lr, per_gpu_rule = peak_lr_of(optim, checkpoint, strategy.data_parallel_size, head_fit, log)
        optimizer, record_graph = build_optimizer(config, model, strategy, precision, head_fit, peak_lr, log)
        grad_scaler = precision.make_grad_scaler()
        state, rng = TrainState(), RandomStreams(strategy, replicas=replicated)
        parts = {"model": strategy.module_state(model), "optimizer": strategy.optimizer_state(model, optimizer),
                 "scaler": grad_scaler, "ema": ema, "rng": rng}
        layout = {"world_size": batch_ranks, "loader_batch": loader_batch,
                  "grad_accum_steps": optim.grad_accum_steps}
        saved = None if checkpoint is None else _restore_checkpoint(checkpoint, resume_from, state, parts,
                                                                    len(data.train), log)
        exact_resume = saved is not None and _resume_continuity(saved, state, parts, layout, global_batch,
                                                                config.parallel.grad_compression, log)
        strategy.check_same_on_all_ranks(state.step, "the optimizer steps already taken")

        scheduler = optimizer if head_fit == "ridge" else position_schedule(
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
        checkpoints = CheckpointManager(config=config, strategy=strategy, state=state,
                                        parts={**parts, "scheduler": scheduler}, metadata=metadata,
                                        resumed=resume_from is not None,
                                        before_first_save=_first_save(config, strategy, resume_from, checkpoint, log))
        return cls(config=config, strategy=strategy, log=log, data=data, model=model, precision=precision,
                   loaders=loaders, loader_batch=loader_batch, global_batch=global_batch, step=step, state=state,
                   rng=rng, checkpoints=checkpoints, stop_signals=stop_signals or StopSignals(),
                   batch_ranks=batch_ranks, exact_resume=exact_resume, pool_figures=pool_figures,
                   head_pool=pool["train"] if head_fit == "ridge" else None, epochs=epochs, pool_head=pool_head,
                   refits=refits, chooses=chooses)

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
        if not self.saving:
            return
        self._sync_buffers()
        self.checkpoints.save(is_best)

    def schedule(self, optimizer, micro_batches_per_epoch):
        """The LR schedule of `optimizer` over --epochs of this many micro-batches, from the train state."""
        return position_schedule(optimizer, self.config.optim, micro_batches_per_epoch, self.state, self.global_batch,
                                 self.log)

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


def _restore_checkpoint(checkpoint, path, state, parts, train_windows, log):
    """Restore the checkpoint's parts and say where the run resumes; returns the SavedRun it read."""
    saved = SavedRun(checkpoint)
    restore_parts(saved, state, parts)
    log.keep_epochs_up_to(state.epoch)  # an earlier checkpoint than the log's last line: one line an epoch
    where = (f"epoch {state.epoch + 1}, sample {state.epoch_position} of {train_windows}"
             if state.epoch_position else f"{state.epoch} epochs")
    log.info(f"\n*** RESUMING from {path}: {where} / {state.step} steps done, best val macro-F1 "
             f"{state.best_metric:.4f}. Pass --no-resume to start over. ***\n")
    return saved


def _resume_continuity(saved, state, parts, layout, global_batch, grad_compression, log):
    """Say what a resume from `saved` (restored by _restore_checkpoint) starts afresh; True when a
    mid-epoch resume can continue bit for bit (the same ranks and batch layout, and every rank's
    random streams saved)."""
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
