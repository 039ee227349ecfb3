"""The trainer: build() assembles a run, fit() trains it epoch by epoch, evaluate() judges a split.

One batch from the command line to the checkpoint: main.py parses a RunConfig and calls train().
Trainer.build normalises the data read before it (run_inputs.py), builds the model and lets the
strategy wrap it, makes the loaders, restores the checkpoint's parts and builds the TrainStep.
fit() runs each epoch's pass (train_epoch), where every micro-batch goes through
TrainStep.accumulate and every accumulation window through TrainStep.update (loop/step.py); at the
epoch's end it validates, and the CheckpointManager (checkpoint/manager.py) writes the train state
and every part to last.pt.
"""
import dataclasses
import math
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from data.loaders import gathered_order, split_loaders
from data.splits import HarData, fit_normalization, normalize
from evaluation.calibration import CALIBRATION_FILE, calibration_fields, fit_temperature, format_calibration
from evaluation.figures import write_run_figures
from evaluation.metrics import (
    classification_report,
    format_people,
    format_report,
    per_subject_accuracy,
    summary_metrics,
)
from models import count_parameters, feature_views_of, label_smoothing_of, resolve_size, training_bytes
from training import faults
from training.checkpoint import files as ckpt
from training.checkpoint.earlier_run import earlier_run_files, move_aside
from training.checkpoint.manager import CheckpointManager, restore_parts
from training.checkpoint.train_state import RandomStreams, TrainState
from training.config.cli import write_resolved_config
from training.config.settings import DEFAULT_LR, RunConfig
from training.distributed.lost_rank import explain_lost_rank
from training.distributed.strategy import Strategy, check_parallel_args, free_bytes, make_strategy
from training.errors import EXIT_PREEMPTED, RankLost, TrainingDiverged, UsageError
from training.loop.evaluation import gather_predictions
from training.loop.recipe import (
    build_augmenter,
    build_feature_pool,
    build_weight_average,
    feature_store_root,
    wants_feature_pool,
)
from training.loop.step import (
    MAX_SKIPPED_STEPS,
    Precision,
    TrainStep,
    build_adamw,
    build_scheduler,
    compile_for_training,
    global_batch_size,
    micro_step_plan,
    scaled_lr,
    scaling_warning,
    skipped_steps,
    steps_per_epoch,
)
from training.loop.tally import NO_NONFINITE_STEP, EpochTally
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
    strategy = make_strategy(config, placement)
    stop_signals = StopSignals().install()
    trainer = None
    try:
        trainer = Trainer.build(config, strategy, stop_signals, inputs=inputs)
        clock.lap(SET_UP_LAP)
        outcome = trainer.fit()
        clock.lap("training")
        if outcome == "complete":
            trainer.report_best_weights()
            clock.lap("evaluation")
        # A preempted job's grace time is for saving.
        if outcome != "preempted" and strategy.is_main and config.output.figures:
            write_run_figures(trainer.save_dir, trainer.log.warn, use_test=not config.data.no_test)
            clock.lap("figures")
        trainer.log.info(clock.line())
        trainer.log.info(f"{trainer.save_dir} holds: {', '.join(_run_files(trainer.save_dir))}")
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


@dataclass
class Trainer:
    """One run's data, model, training step, train state and checkpoints, assembled by build()."""
    config: RunConfig
    strategy: Strategy
    log: RunLogger
    save_dir: Path
    data: HarData  # normalised splits
    model: torch.nn.Module  # the bare model: what checkpoints hold
    precision: Precision
    loaders: dict  # split name -> this rank's batches
    loader_batch: int  # samples per micro-batch drawn by each process
    global_batch: int  # samples per optimizer step, all replicas and micro-batches together
    step: TrainStep
    state: TrainState
    rng: RandomStreams
    checkpoints: CheckpointManager
    stop_signals: StopSignals
    exact_resume: bool = False  # the first epoch continues a mid-epoch checkpoint bit for bit
    first_epoch: int = 0  # the first epoch this invocation trains

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
        augment = build_augmenter(config.recipe, normalization, data.channel_names, data.class_names, strategy.device,
                                  log.warn)
        model, train_model, precision, ema = _build_model(config, data, strategy, log)
        global_batch = global_batch_size(optim.batch_size, strategy.data_parallel_size, optim.grad_accum_steps)
        # DataParallel splits one loader batch over its GPUs; DDP ranks each load their own.
        loader_batch = optim.batch_size * strategy.data_parallel_size // strategy.world_size
        loaders, augment = _build_loaders(config, data, model, augment, loader_batch, strategy, log)

        peak_lr = scaled_lr(optim.lr, optim.lr_scaling, global_batch, optim.batch_size)
        lr_warning = scaling_warning(optim.lr, optim.lr_scaling, global_batch, optim.batch_size, DEFAULT_LR)
        if lr_warning:
            log.warn(lr_warning)
        optimizer = build_adamw(model, peak_lr, optim.weight_decay, strategy.device)
        grad_scaler = precision.make_grad_scaler()
        state, rng = TrainState(), RandomStreams(strategy)
        parts = {"model": strategy.module_state(model), "optimizer": strategy.optimizer_state(model, optimizer),
                 "scaler": grad_scaler, "ema": ema, "rng": rng}
        layout = {"world_size": strategy.world_size, "loader_batch": loader_batch,
                  "grad_accum_steps": optim.grad_accum_steps}
        exact_resume = False
        if checkpoint is not None:
            restore_parts(checkpoint, state, parts)
            exact_resume = _announce_resume(checkpoint, resume_from, state, layout, rng, global_batch,
                                            len(data.train), log)
            if config.parallel.grad_compression == "powersgd":
                log.warn("PowerSGD's error feedback is not in the checkpoint: the resumed run starts it afresh, "
                         "so it does not continue bit for bit")
            if ema is not None and not checkpoint.get("ema"):
                log.info("the checkpoint has no weight average: it starts from the resumed weights")
                ema.restart()
        strategy.check_same_on_all_ranks(state.step, "the optimizer steps already taken")

        scheduler = _position_schedule(optimizer, optim, len(loaders["train"]), state, global_batch, peak_lr,
                                       strategy.data_parallel_size, log)
        smoothing = label_smoothing_of(config.model.name, config.recipe.label_smoothing)
        step = TrainStep(train_model, [p for p in model.parameters() if p.requires_grad], strategy, precision,
                         optimizer, scheduler, grad_scaler, optim.grad_accum_steps, optim.max_grad_norm,
                         smoothing, augment, ema, skipped_steps(model, precision, grad_scaler))
        metadata = _checkpoint_metadata(config, data, normalization, strategy, global_batch, layout)
        checkpoints = CheckpointManager(save_dir, config.output.keep_last, strategy, state,
                                        {**parts, "scheduler": scheduler}, metadata, resumed=resume_from is not None,
                                        before_first_save=_first_save(config, strategy, resume_from, checkpoint, log))
        return cls(config, strategy, log, save_dir, data, model, precision, loaders, loader_batch, global_batch,
                   step, state, rng, checkpoints, stop_signals or StopSignals(), exact_resume)

    def fit(self):
        """Train until --epochs, early stopping, --stop-after-epochs or a stop signal. Returns "complete"
        (evaluate the test split next), "paused" (--stop-after-epochs) or "preempted" (a signal
        arrived; a checkpoint was saved)."""
        optim, log, state = self.config.optim, self.log, self.state
        if state.epoch >= optim.epochs:
            log.info(f"already trained for {state.epoch} of {optim.epochs} epochs; evaluating the test split")
            return "complete"
        if self._patience_exhausted():
            log.info(f"this run already stopped early ({state.epochs_since_best} epochs without a better "
                     "validation macro-F1); evaluating the test split")
            return "complete"
        self.first_epoch = first_epoch = state.epoch
        stop_after = self.config.output.stop_after_epochs
        for epoch in range(first_epoch, optim.epochs):
            epoch_start = time.perf_counter()
            result = self.train_epoch(epoch)
            if result.stopped_early:
                self._report_preemption()
                return "preempted"
            self._end_epoch(epoch, result, epoch_start)
            if self._stop_requested():
                self._report_preemption()
                return "preempted"
            if self._patience_exhausted():
                log.info(f"early stopping: no better validation macro-F1 for {state.epochs_since_best} epochs")
                return "complete"
            if epoch + 1 - first_epoch == stop_after and epoch + 1 < optim.epochs:
                log.info(f"stopping after {stop_after} epoch(s) as asked; run the same command again "
                         f"to continue from epoch {epoch + 2}")
                return "paused"
        return "complete"

    def train_epoch(self, epoch):
        """Train over this rank's shard of `epoch` from where the train state stands in it; the state's
        step count follows."""
        config, strategy, state = self.config, self.strategy, self.state
        loader = self.loaders["train"]
        plan = self._plan_epoch(epoch, loader)
        tally = EpochTally(strategy.device, *((state.epoch_loss_sum, state.epoch_samples) if strategy.is_main else ()))
        steps_left = math.ceil((plan.batches_in_epoch - plan.first_batch) / config.optim.grad_accum_steps)
        bar = self.log.progress(steps_left, f"epoch {epoch + 1}/{config.optim.epochs}")
        hook = _StepHook(self, plan, tally, bar)
        batches = faults.wrap_batches(loader, epoch * plan.batches_in_epoch + plan.first_batch, strategy.rank)
        step, accum, steps = self.step, config.optim.grad_accum_steps, 0
        start = time.perf_counter()
        stopped = False
        for batch_index, (signals, labels) in enumerate(batches, start=plan.first_batch):
            window_size, closes_window = micro_step_plan(batch_index, plan.batches_in_epoch, accum)
            step.accumulate(signals, labels, window_size, sync=closes_window, tally=tally,
                            step_number=plan.first_step + steps + 1)
            if not closes_window:
                continue
            step.update()
            steps += 1
            if hook(plan.first_step + steps):
                stopped = True
                break
        strategy.synchronize()  # one sync per pass, so the time covers the queued GPU work
        train_time_s = time.perf_counter() - start
        hook.finish()
        bar.close()
        loss_sum, loss_samples = (0.0, 0) if stopped else self._global_tally(tally)
        trained = (plan.batches_in_epoch - plan.first_batch) * self.loader_batch * strategy.world_size
        slowest_s = float(strategy.max_over_ranks(torch.tensor(train_time_s, dtype=torch.float64,
                                                               device=strategy.device)))
        state.step = plan.first_step + steps
        return EpochResult(steps, trained, slowest_s, loss_sum, loss_samples, stopped)

    def _plan_epoch(self, epoch, loader):
        """Position the epoch's order and random streams from the train state; a mid-epoch resume in
        the same layout continues bit for bit, in another layout at the same sample with new streams."""
        state, strategy = self.state, self.strategy
        loader.sampler.set_epoch(epoch, start=0)
        batches_in_epoch = len(loader)
        loader.sampler.set_epoch(epoch, start=state.epoch_position)
        exact, self.exact_resume = self.exact_resume, False  # once: only the resumed epoch continues bit for bit
        self.rng.start_epoch(self.config.optim.seed, epoch, resume_exactly=exact)
        if exact:
            first_batch = state.epoch_position // (self.loader_batch * strategy.world_size)
            return EpochPlan(first_batch, batches_in_epoch, state.step)
        if state.epoch_position:  # another layout: the remaining samples make a shorter epoch of their own
            return EpochPlan(0, len(loader), state.step)
        return EpochPlan(0, batches_in_epoch, state.step)

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

    def save(self, is_best):
        """A checkpoint of where the run stands; every rank takes part (buffers and random streams)."""
        self._sync_buffers()
        self.checkpoints.save(is_best)

    def report_best_weights(self):
        """Reload best.pt's weights and report the validation split and, unless --no-test, the test
        split, seen here for the first time."""
        self.checkpoints.write_pending()  # still pending only where this invocation trained nothing
        best_path = self.checkpoints.best_path
        best = None
        if self.strategy.is_main:
            if best_path.is_file():
                best = ckpt.inference_weights(ckpt.load_checkpoint(best_path))
            else:
                self.log.warn(f"{best_path} not found; reporting with the current weights")
        # Only rank 0 may see the file (other nodes); it tells every rank whether they load together.
        if self.strategy.max_ints([int(best is not None)])[0]:
            self.strategy.load_from_rank0(self.model, best)
        no_test = self.config.data.no_test
        splits = [split for split in ("val", "test") if (split != "val" or self.has_validation)
                  and (split != "test" or not no_test)]
        temperature, fitted = 1.0, None  # until the validation split gives one
        if not self.has_validation and self.strategy.is_main:
            # An earlier run's temperature in this folder was fitted for other weights.
            (self.save_dir / CALIBRATION_FILE).unlink(missing_ok=True)
        for split in splits:
            started = time.perf_counter()
            labels, logits, loss = self.evaluate(split, self.strategy.eval_model(self.model))
            self.log.info(f"evaluated the {split} split ({len(labels)} windows) in "
                          f"{time.perf_counter() - started:.1f} s")
            probabilities = torch.softmax(torch.from_numpy(logits).double(), dim=1).numpy()
            if split == "val":
                temperature, fitted = self._fit_temperature(probabilities, labels, best_path), {"windows": len(labels)}
            split_subjects = getattr(self.data, split).subjects
            in_order = split_subjects[gathered_order(len(split_subjects), self.strategy.world_size)]
            predictions = logits.argmax(axis=1)
            people, worst = per_subject_accuracy(labels, predictions, in_order)
            report = {**classification_report(labels, predictions, self.data.class_names), "loss": loss,
                      "checkpoint": str(best_path), "subjects": sorted(int(subject) for subject in set(split_subjects)),
                      "per_subject": people, "worst_subject": worst,
                      **calibration_fields(probabilities, labels, in_order, temperature)}
            self.log.write_json(f"{split}_report.json", report)
        if no_test:
            self.log.info("--no-test: the test split was not evaluated; " + (
                f"wrote {self.save_dir / 'val_report.json'}" if "val" in splits
                else "no validation split either (--val-fraction 0), so no report was written"))
            return
        chosen = "best checkpoint by validation macro-F1" if self.has_validation else \
            "last epoch's weights: no validation split"
        self.log.info(f"test split ({chosen}):\n" + format_report(report) + "\n" + format_people(report) + "\n"
                      + format_calibration(report, fitted))
        self.log.info(f"wrote {self.save_dir / 'test_report.json'}")

    def _fit_temperature(self, probabilities, labels, best_path):
        """The temperature that calibrates best.pt's probabilities on the validation split, written to
        calibration.json beside it, where predict.py finds it."""
        temperature = fit_temperature(probabilities, labels)
        self.log.write_json(CALIBRATION_FILE, {"temperature": temperature, "checkpoint": best_path.name,
                                               "fitted_on": "the run's validation split", "windows": len(labels)})
        return temperature

    def _end_epoch(self, epoch, result, epoch_start):
        """Validate, update the train state, checkpoint and log the epoch's record."""
        if self.has_validation:
            labels, logits, val_loss = self.evaluate("val")
            metrics = summary_metrics(labels, logits.argmax(axis=1), len(self.data.class_names))
        else:
            val_loss, metrics = None, {"acc": None, "macro_f1": None}
        is_best = self.state.end_epoch(metrics["macro_f1"])
        self.save(is_best)
        strategy = self.strategy
        record = {"epoch": epoch + 1, "epochs": self.config.optim.epochs, "step": self.state.step,
                  "train_loss": result.loss_sum / max(1, result.loss_samples), "train_samples": result.loss_samples,
                  "val_loss": val_loss, "val_acc": metrics["acc"], "val_macro_f1": metrics["macro_f1"],
                  "lr": self.step.last_lr(),
                  "samples_per_s": result.samples / result.train_time_s if result.train_time_s > 0 else 0.0,
                  "train_time_s": result.train_time_s, "epoch_time_s": time.perf_counter() - epoch_start,
                  "world_size": strategy.world_size, "global_batch_size": self.global_batch,
                  "memory": strategy.memory_report(),
                  "model_state": strategy.model_state_report(self.model, self.step.optimizer)}
        self.log.log_epoch(record, is_best)
        if epoch == self.first_epoch:
            self.log.info("model state per rank (MB, parameters / gradients / optimizer): " + ", ".join(
                f"rank {rank} {row['parameters_mb']:.2f} / {row['gradients_mb']:.2f} / {row['optimizer_mb']:.2f}"
                for rank, row in enumerate(record["model_state"])))
        strategy.reset_memory_peaks()  # each epoch record reports its own peak

    def _sync_buffers(self):
        """Give every rank rank 0's buffers (DDP does not broadcast them each step), in the model and
        in its average, before anything reads them: evaluation, or a checkpoint every rank resumes from."""
        self.strategy.sync_buffers(self.model)
        if self.step.ema is not None:
            self.strategy.sync_buffers(self.step.ema.module)

    def _patience_exhausted(self):
        patience = self.config.optim.early_stopping_patience
        return bool(patience) and self.state.epochs_since_best >= patience

    def _stop_requested(self):
        """True on every rank once any rank received SIGTERM/SIGUSR1, so all stop at the same step."""
        return bool(self.strategy.max_ints([int(self.stop_signals.received is not None)])[0])

    def _report_preemption(self):
        self.log.info(f"received {self.stop_signals.received or 'a stop signal on another rank'}: stopped after "
                      f"step {self.state.step} (epoch {self.state.epoch + 1}) and saved "
                      f"{self.checkpoints.last_path}; run the same command again to resume")

    def _global_tally(self, tally):
        """(sum of per-sample losses, samples) over all ranks, as Python numbers, after the NaN check."""
        self._check_finite(tally)
        strategy = self.strategy
        totals = strategy.sum_over_ranks(torch.stack([tally.loss_sum(), torch.tensor(
            float(tally.samples), dtype=torch.float64, device=strategy.device)]))
        loss_sum, samples = totals.tolist()
        return loss_sum, int(samples)

    def _health(self, tally):
        """This rank's news for the NaN check, as ints whose maximum over ranks is the worst: the first
        step with a NaN/inf loss (negated), and the longest run of steps the fp16 GradScaler skipped."""
        skips = self.step.skips
        return [-int(tally.earliest_nonfinite_step()), skips.longest_run() if skips is not None else 0]

    def _check_finite(self, tally):
        """Stop, before anything is saved, once a loss on any rank was NaN or inf, or fp16 skipped
        MAX_SKIPPED_STEPS steps in a row."""
        self._raise_if_diverged(*self.strategy.max_ints(self._health(tally)))

    def _raise_if_diverged(self, negative_earliest, longest_skip_run):
        where = f"(epoch {self.state.epoch + 1}); {self.checkpoints.kept()}"
        if -negative_earliest != NO_NONFINITE_STEP:
            raise TrainingDiverged(f"the training loss became NaN/inf at step {-negative_earliest} {where}. Lower "
                                   "--lr, keep --max-grad-norm on, or check the data for extreme values")
        if longest_skip_run >= MAX_SKIPPED_STEPS:
            raise TrainingDiverged(f"the fp16 GradScaler skipped {longest_skip_run} optimizer steps in a row, their "
                                   f"gradients overflowing at every loss scale {where}. The loss or the weights are "
                                   "not finite: lower --lr, keep --max-grad-norm on, or try --amp-dtype bf16")


@dataclass
class EpochPlan:
    """Where this pass starts inside the epoch; a resumed epoch starts past its first batches."""
    first_batch: int  # micro-batches of the epoch this rank already did before this pass
    batches_in_epoch: int  # micro-batches of the whole epoch on this rank: fixes the accumulation windows
    first_step: int  # optimizer steps taken before this pass, over the whole run


@dataclass
class EpochResult:
    steps: int  # optimizer steps taken in this pass
    samples: int  # samples trained on in this pass, all ranks together
    train_time_s: float  # the slowest rank's training time in this pass
    loss_sum: float  # the epoch's summed training loss over all ranks, resumed part included
    loss_samples: int  # ... and the samples it sums over
    stopped_early: bool  # a stop request ended the pass (after a checkpoint)


class _StepHook:
    """What happens between optimizer steps: progress, logging, mid-epoch saves, stop requests."""

    def __init__(self, trainer, plan, tally, bar):
        self.trainer, self.plan, self.tally, self.bar = trainer, plan, tally, bar
        self.start_position = trainer.state.epoch_position
        self.in_flight = None  # the last check-in's message between ranks, not yet waited for

    def __call__(self, step):
        """After optimizer step `step` (counted over the run); True asks the pass to stop here."""
        trainer, output = self.trainer, self.trainer.config.output
        self.bar.update(1)
        batches_done = self.plan.first_batch + (step - self.plan.first_step) * trainer.config.optim.grad_accum_steps
        if batches_done >= self.plan.batches_in_epoch:
            return False  # the epoch's own end follows: validation, save, then any stop request
        if step % output.log_interval == 0:
            stop = self._check_in()
            if trainer.strategy.is_main:
                loss, lr = self.tally.mean_loss(), trainer.step.last_lr()
                self.bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}")
                trainer.log.log_step(step, loss, lr)
        else:
            # One process needs no agreement, so it stops at once; ranks wait for the next check-in.
            stop = trainer.strategy.world_size == 1 and trainer.stop_signals.received is not None
        if stop or (output.save_every_steps and step % output.save_every_steps == 0):
            self._save_mid_epoch(step, batches_done)
        return stop

    def _check_in(self):
        """At log points: stop the run if a loss on any rank was NaN/inf (or fp16 skipped too many steps
        in a row), and return whether any rank received a stop signal. Ranks send one small message
        per check-in and act on the previous one, which has had --log-interval steps to arrive, so no
        rank waits for the others here and all act at the same step. A stop request is therefore acted
        on within two check-ins; the saves check the losses themselves, so a bad step is never saved."""
        trainer = self.trainer
        received = trainer.stop_signals.received is not None
        message = trainer.strategy.start_max_ints([int(received), *trainer._health(self.tally)])
        if trainer.strategy.world_size == 1:
            decision = message.wait()  # nothing was sent: act on it now
        else:
            decision, self.in_flight = (self.in_flight.wait() if self.in_flight else None), message
        if decision is None:
            return False
        stop, *worst = decision
        trainer._raise_if_diverged(*worst)
        return bool(stop)

    def finish(self):
        """Wait for the message still in flight (its news is checked again at the epoch's end)."""
        if self.in_flight is not None:
            self.in_flight.wait()
            self.in_flight = None

    def _save_mid_epoch(self, step, batches_done):
        trainer = self.trainer
        trained = (batches_done - self.plan.first_batch) * trainer.loader_batch * trainer.strategy.world_size
        state = trainer.state
        state.step = step
        state.epoch_position = min(len(trainer.data.train), self.start_position + trained)
        state.epoch_loss_sum, state.epoch_samples = trainer._global_tally(self.tally)
        trainer.save(is_best=False)


def _run_files(save_dir):
    """What a run leaves in its folder, folders marked with a slash; hidden files left out."""
    return [path.name + ("/" if path.is_dir() else "") for path in sorted(save_dir.iterdir())
            if not path.name.startswith(".")]


def _first_save(config, strategy, resume_from, checkpoint, log):
    """What rank 0 does with the run's first save: move an earlier run's files aside (unless this run
    continues the folder's own checkpoint), then write config.yaml with the settings the weights were
    trained with: a run that trains nothing records its checkpoint's, not this command's."""
    save_dir = config.save_dir
    continues = resume_from is not None and Path(resume_from).resolve().parent == save_dir.resolve()
    earlier = earlier_run_files(save_dir) if strategy.is_main and not continues else []
    saved_flags = checkpoint["config"] if checkpoint is not None else None

    def first_save(trained):
        move_aside(save_dir, earlier, log.info)
        settings = config if trained or saved_flags is None else RunConfig.from_flags({**config.flags(), **saved_flags})
        write_resolved_config(settings, save_dir)
    return first_save


def _normalize_data(data, checkpoint, log):
    """The splits, normalised with the training split's statistics (a resumed run keeps its own)."""
    log.info(data.description)
    if checkpoint is not None:  # held against this run by run_inputs.py (checkpoint/judge.py)
        mean, std = checkpoint["normalization"]["mean"].numpy(), checkpoint["normalization"]["std"].numpy()
    elif data.normalization is not None:
        mean, std = data.normalization  # a store's, gathered when it was built: no pass over the data here
    else:
        mean, std = fit_normalization(data.train.signals)
    data = dataclasses.replace(data, **{name: normalize(getattr(data, name), mean, std)
                                        for name in ("train", "val", "test")})
    return data, {"mean": torch.from_numpy(mean), "std": torch.from_numpy(std)}


def _build_loaders(config, data, model, augment, loader_batch, strategy, log):
    """The splits' loaders, over a feature pool where the model's features are fixed, and the
    augmenter the step applies (None when the pool's views carry the augmentation)."""
    optim = config.optim
    splits, train_views = {"train": data.train, "val": data.val, "test": data.test}, 1
    views = feature_views_of(config.model.name, config.recipe.feature_views)
    if wants_feature_pool(model, views):
        # Epoch e trains on view e mod V, so a run of fewer epochs than views never reaches the
        # last ones: they are not built.
        views = min(views, optim.epochs)
        splits, train_views = build_feature_pool(model, splits, views, augment, optim.seed, strategy, log,
                                                 feature_store_root(config.save_dir, splits))
        augment = None
    loaders, data_path = split_loaders(splits, loader_batch, max(EVAL_BATCH_MIN, loader_batch), strategy.device,
                                       strategy.world_size, strategy.rank, optim.seed, config.hardware.data_path,
                                       config.hardware.num_workers, train_views)
    log.info(f"data path: {data_path}")
    return loaders, augment


def _build_model(config, data, strategy, log):
    """The bare model (what checkpoints hold), the same wrapped and maybe compiled (what the step
    calls), the run's precision, and the weight average (None when off), copied before the strategy
    lays the model out and then laid out the same way."""
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
    model = settings.build(channels, len(data.class_names), window_steps).to(strategy.device)
    if model.FITS_TO_DATA:
        # Fixed parts that depend on the data (MiniRocket's biases), set once from the training
        # windows (in memory or a store's), before the weight average copies the model; a resumed
        # run then loads its own.
        started = time.perf_counter()
        model.fit(data.train.signals)
        log.info(f"fitted {settings.name}'s fixed parts to the training windows in "
                 f"{time.perf_counter() - started:.1f} s")
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


def _position_schedule(optimizer, optim, micro_batches_per_epoch, state, global_batch, peak_lr, replicas, log):
    """Warmup then cosine, a pure function of the step, positioned from the train state: a resumed run
    that changed the global batch re-lays it in its own steps."""
    steps_each_epoch = steps_per_epoch(micro_batches_per_epoch, optim.grad_accum_steps)
    total_steps = steps_each_epoch * optim.epochs
    warmup_steps = round(optim.planned_warmup_epochs * steps_each_epoch)
    log.info(f"lr: reference {optim.lr:.2e}, {optim.lr_scaling} scaling, global batch {global_batch} "
             f"({optim.batch_size} per GPU x {replicas} replicas x {optim.grad_accum_steps} accumulation) -> "
             f"peak {peak_lr:.2e}; warmup {warmup_steps} of {total_steps} steps ({steps_each_epoch} per epoch), "
             "then cosine to 0")
    return build_scheduler(optimizer, warmup_steps, total_steps, state.schedule_step(steps_each_epoch, global_batch))


def _announce_resume(checkpoint, path, state, layout, rng, global_batch, train_windows, log):
    """Say where the run resumes; True when a mid-epoch resume can continue bit for bit (the same
    ranks and batch layout, and every rank's random streams saved)."""
    where = (f"epoch {state.epoch + 1}, sample {state.epoch_position} of {train_windows}"
             if state.epoch_position else f"{state.epoch} epochs")
    log.info(f"\n*** RESUMING from {path}: {where} / {state.step} steps done, best val macro-F1 "
             f"{state.best_metric:.4f}. Pass --no-resume to start over. ***\n")
    if checkpoint["global_batch_size"] != global_batch:
        log.warn(f"global batch changes from {checkpoint['global_batch_size']} to {global_batch} on resume: the "
                 "peak LR and the steps per epoch (so the schedule's length) follow the new value, and the "
                 f"schedule continues from epoch {state.epoch + 1}")
    exact = checkpoint.get("layout") == layout and rng.covers_every_rank()
    if state.epoch_position and not exact:
        log.warn(f"resuming mid-epoch with another layout ({checkpoint.get('layout')} -> {layout}): the epoch "
                 f"continues at sample {state.epoch_position} of the same order, so no sample is skipped or "
                 "repeated, but accumulation windows and random streams restart, so the weights will differ "
                 "from an uninterrupted run")
    return bool(state.epoch_position) and exact


def _checkpoint_metadata(config, data, normalization, strategy, global_batch, layout):
    """What a checkpoint carries beside the state: enough to use it without the trainer."""
    return {"config": config.flags(), "normalization": normalization, "world_size": strategy.world_size,
            "global_batch_size": global_batch, "layout": layout, "in_channels": data.train.signals.shape[1],
            "num_classes": len(data.class_names), "class_names": list(data.class_names),
            "channel_names": list(data.channel_names),
            # What predict.py needs to rebuild windows from a recording.
            "sample_rate_hz": float(data.sample_rate_hz), "window_steps": data.train.signals.shape[2],
            "preprocessing": data.preprocessing,
            "data_identity": data.identity}  # what the data is, for a resume to compare (run_inputs.py)
