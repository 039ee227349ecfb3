"""The epoch loop around the training step: resume position, validation, checkpoints, stop requests."""
import math
import time

import torch

from training.checkpoint import files as ckpt
from training import faults
from training.checkpoint import rng_state
from training.errors import TrainingDiverged
from training.loop.step import EpochPlan, predict, train_one_epoch
from training.reporting.report import summary_metrics
from training.loop.tally import NO_NONFINITE_STEP, EpochTally


def train_epochs(run):
    """Train until --epochs, early stopping, --stop-after-epochs or a stop signal.

    Returns "complete" (evaluate the test split next), "paused" (--stop-after-epochs) or
    "preempted" (a signal arrived; a checkpoint was saved)."""
    config, log, progress = run.config, run.log, run.progress
    if progress.epoch >= config.optim.epochs:
        log.info(f"already trained for {progress.epoch} of {config.optim.epochs} epochs; evaluating the test split")
        return "complete"
    if patience_exhausted(config.optim, progress):
        log.info(f"this run already stopped early ({progress.epochs_since_best} epochs without a better "
                 "validation macro-F1); evaluating the test split")
        return "complete"
    first_epoch = progress.epoch
    for epoch in range(first_epoch, config.optim.epochs):
        if not _run_epoch(run, epoch) or _stop_requested(run):
            _report_preemption(run)
            return "preempted"
        if patience_exhausted(config.optim, progress):
            log.info(f"early stopping: no better validation macro-F1 for {progress.epochs_since_best} epochs")
            return "complete"
        if epoch + 1 - first_epoch == config.output.stop_after_epochs and epoch + 1 < config.optim.epochs:
            log.info(f"stopping after {config.output.stop_after_epochs} epoch(s) as asked; run the same command again "
                     f"to continue from epoch {epoch + 2}")
            return "paused"
    return "complete"


def patience_exhausted(optim, progress):
    return bool(optim.early_stopping_patience) and progress.epochs_since_best >= optim.early_stopping_patience


def _run_epoch(run, epoch):
    """Train one epoch (or what is left of it), validate, checkpoint and log the epoch record.

    Returns False when a stop signal ended the epoch early (after saving where it stood)."""
    config, strategy, log, progress = run.config, run.strategy, run.log, run.progress
    epoch_start = time.perf_counter()
    loader = run.loaders["train"]
    loader.sampler.set_epoch(epoch, start=0)
    batches_in_epoch = len(loader)
    loader.sampler.set_epoch(epoch, start=progress.epoch_position)
    plan = EpochPlan(first_batch=0, batches_in_epoch=batches_in_epoch, first_step=progress.step)
    tally = EpochTally(strategy.device)
    resumed = run.take_resume_state()
    if resumed is not None and strategy.is_main:
        tally = EpochTally(strategy.device, resumed["loss_sum"], resumed["samples"])  # global sums so far
    if resumed is not None and resumed["exact"]:
        # The same ranks and batch layout: continue inside the epoch exactly where it stopped.
        plan = EpochPlan(progress.batch_in_epoch, batches_in_epoch, progress.step)
        rng_state.restore(resumed["rng"][strategy.rank], strategy.device)
    else:
        if resumed is not None:
            # Another layout: same samples from the same position, but new windows and seeds.
            plan = EpochPlan(0, len(loader), progress.step)
        rng_state.seed_epoch(config.optim.seed, epoch, strategy.rank)
    steps_left = math.ceil((plan.batches_in_epoch - plan.first_batch) / config.optim.grad_accum_steps)
    bar = log.progress(steps_left, f"epoch {epoch + 1}/{config.optim.epochs}")
    hook = _StepHook(run, epoch, plan, tally, bar)
    batches = faults.wrap_batches(loader, epoch * batches_in_epoch + plan.first_batch, strategy.rank)
    result = train_one_epoch(run.train_model, batches, run.opt, strategy, run.precision, plan, tally, hook)
    hook.finish()
    bar.close()
    if result.stopped_early:
        return False
    _check_finite(run, tally)
    loss_sum, samples = _global_tally(strategy, tally)
    train_time_s = float(strategy.max_over_ranks(torch.tensor(result.train_time_s, dtype=torch.float64,
                                                              device=strategy.device)))
    _sync_buffers(run)
    labels, predictions, val_loss = predict(run.validation_model(), run.loaders["val"], strategy, run.precision)
    metrics = summary_metrics(labels, predictions, len(run.data.class_names))
    is_best = metrics["macro_f1"] > progress.best_metric
    progress.epoch, progress.step = epoch + 1, plan.first_step + result.steps
    progress.epoch_position = progress.batch_in_epoch = 0
    progress.best_metric = max(progress.best_metric, metrics["macro_f1"])
    progress.epochs_since_best = 0 if is_best else progress.epochs_since_best + 1
    _save(run, is_best)
    trained_samples = (plan.batches_in_epoch - plan.first_batch) * run.loader_batch * strategy.world_size
    record = {"epoch": epoch + 1, "epochs": config.optim.epochs, "step": progress.step,
              "train_loss": loss_sum / max(1, samples), "train_samples": samples, "val_loss": val_loss, "val_acc": metrics["acc"],
              "val_macro_f1": metrics["macro_f1"], "lr": run.opt.scheduler.get_last_lr()[0],
              "samples_per_s": trained_samples / train_time_s if train_time_s > 0 else 0.0,
              "train_time_s": train_time_s, "epoch_time_s": time.perf_counter() - epoch_start,
              "world_size": strategy.world_size, "global_batch_size": run.global_batch,
              "memory": strategy.memory_report()}
    log.log_epoch(record, is_best)
    strategy.reset_memory_peaks()  # each epoch record reports its own peak
    return True


class _StepHook:
    """What happens between optimizer steps: progress, logging, mid-epoch saves, stop requests."""

    def __init__(self, run, epoch, plan, tally, bar):
        self.run, self.epoch, self.plan, self.tally, self.bar = run, epoch, plan, tally, bar
        self.start_position = run.progress.epoch_position
        self.steps_before = plan.first_step
        self.in_flight = None  # the last check-in's message between ranks, not yet waited for

    def __call__(self, step):
        run, config = self.run, self.run.config
        self.bar.update(1)
        batches_done = self.plan.first_batch + (step - self.steps_before) * config.optim.grad_accum_steps
        if batches_done >= self.plan.batches_in_epoch:
            return False  # the epoch's own end follows: validation, save, then any stop request
        if step % config.output.log_interval == 0:
            stop = self._check_in()
            if run.strategy.is_main:
                loss, lr = self.tally.mean_loss(), run.opt.scheduler.get_last_lr()[0]
                self.bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}")
                run.log.log_step(step, loss, lr)
        else:
            # One process needs no agreement, so it stops at once; ranks wait for the next check-in.
            stop = run.strategy.world_size == 1 and run.stop_signals.received is not None
        if stop or (config.output.save_every_steps and step % config.output.save_every_steps == 0):
            self._save_mid_epoch(step, batches_done)
        return stop

    def _check_in(self):
        """At log points: stop the run if a loss on any rank was NaN/inf, and return whether any rank
        received a stop signal. Ranks send one small message per check-in and act on the previous
        one, which has had --log-interval steps to arrive, so no rank waits for the others here and
        all act at the same step. A stop request is therefore acted on within two check-ins; the
        saves check the losses themselves, so a bad step is never saved."""
        run = self.run
        received = run.stop_signals.received is not None
        message = run.strategy.start_max_ints([int(received), -int(self.tally.earliest_nonfinite_step())])
        if run.strategy.world_size == 1:
            decision = message.wait()  # nothing was sent: act on it now
        else:
            decision, self.in_flight = (self.in_flight.wait() if self.in_flight else None), message
        if decision is None:
            return False
        stop, negative_earliest = decision
        _raise_if_diverged(run, -negative_earliest)
        return bool(stop)

    def finish(self):
        """Wait for the message still in flight (its news is checked again at the epoch's end)."""
        if self.in_flight is not None:
            self.in_flight.wait()
            self.in_flight = None

    def _save_mid_epoch(self, step, batches_done):
        run = self.run
        _check_finite(run, self.tally)
        trained = (batches_done - self.plan.first_batch) * run.loader_batch * run.strategy.world_size
        progress = run.progress
        progress.step, progress.batch_in_epoch = step, batches_done
        progress.epoch_position = min(len(run.data.train), self.start_position + trained)
        _save(run, is_best=False, tally=_global_tally(run.strategy, self.tally))


def _sync_buffers(run):
    """Give every rank rank 0's buffers (DDP no longer broadcasts them each step), in the model and
    in its average, before anything reads them: evaluation, or a checkpoint every rank resumes from."""
    run.strategy.sync_buffers(run.model)
    if run.opt.ema is not None:
        run.strategy.sync_buffers(run.opt.ema.module)


def _save(run, is_best, tally=(0.0, 0)):
    """Checkpoint on rank 0; every rank takes part, since each rank's RNG state goes in it."""
    _sync_buffers(run)
    rng_states = run.strategy.gather_objects(rng_state.capture(run.strategy.device, run.strategy.other_gpus))
    if run.strategy.is_main:
        state = run.checkpoint_state(rng_states, tally)
        ckpt.save_run_checkpoint(state, run.save_dir, run.config.output.keep_last, is_best)


def _global_tally(strategy, tally):
    """(sum of per-sample losses, samples) over all ranks, as Python numbers."""
    totals = strategy.sum_over_ranks(torch.stack([tally.loss_sum(), torch.tensor(
        float(tally.samples), dtype=torch.float64, device=strategy.device)]))
    loss_sum, samples = totals.tolist()
    return loss_sum, int(samples)


def _check_finite(run, tally):
    """Stop, before anything is saved, once a loss on any rank was NaN or inf."""
    _raise_if_diverged(run, -run.strategy.max_ints([-int(tally.earliest_nonfinite_step())])[0])


def _raise_if_diverged(run, earliest):
    if earliest != NO_NONFINITE_STEP:
        last = run.save_dir / ckpt.LAST
        kept = f"{last} still holds the last good state" if last.exists() else "nothing was saved"
        raise TrainingDiverged(f"the training loss became NaN/inf at step {earliest} (epoch {run.progress.epoch + 1}); "
                               f"{kept}. Lower --lr, keep --max-grad-norm on, or check the data for extreme values")


def _stop_requested(run):
    """True on every rank once any rank received SIGTERM/SIGUSR1, so all stop at the same step."""
    return bool(run.strategy.max_ints([int(run.stop_signals.received is not None)])[0])


def _report_preemption(run):
    run.log.info(f"received {run.stop_signals.received or 'a stop signal on another rank'}: stopped after step "
                 f"{run.progress.step} (epoch {run.progress.epoch + 1}) and saved {run.save_dir / ckpt.LAST}; "
                 "run the same command again to resume")
