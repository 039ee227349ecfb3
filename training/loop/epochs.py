"""The epoch loop: fit() trains a built Trainer epoch by epoch, train_epoch() makes one pass over the
training split, and between optimizer steps the step hook logs, saves mid-epoch and checks in with
the other ranks (stop_protocol.py); at the epoch's end the run validates and saves."""
import contextlib
import math
import time
from dataclasses import dataclass

import torch

from evaluation.metrics import summary_metrics
from training import faults
from training.loop.readout import NO_NEWS, LogReadout
from training.loop.step import micro_step_plan
from training.loop.stop_protocol import CheckIns, checked_totals, stop_requested
from training.loop.tally import EpochTally


def fit(trainer):
    """Train until --epochs, early stopping, --stop-after-epochs or a stop signal. Returns "complete"
    (evaluate the test split next), "paused" (--stop-after-epochs) or "preempted" (a signal
    arrived; a checkpoint was saved)."""
    optim, log, state = trainer.config.optim, trainer.log, trainer.state
    if state.epoch >= optim.epochs or state.refitted or state.recipe:
        done = ("the final model was trained" if state.refitted
                else f"already trained for {state.epoch} of {optim.epochs} epochs")
        log.info(f"{done}; evaluating the test split")
        return "complete"
    if _patience_exhausted(trainer):
        log.info(f"this run already stopped early ({state.epochs_since_best} epochs without a better "
                 "validation macro-F1); evaluating the test split")
        return "complete"
    trainer.first_epoch = state.epoch
    with threads_for_the_step(trainer):
        return _train_epochs(trainer)


@contextlib.contextmanager
def threads_for_the_step(trainer):
    """One intra-op thread on a CPU for a head trained over a feature pool, as many as before after it.
    Its step is some tens of operations on [batch, features] tensors, each too small to share out:
    spread over threads, every one waited for the slowest to wake (and for a store's reader thread
    to leave a core), and the head trained at about half the samples/s on the 2-core development
    machine (docs/performance.md). One thread also sums in the same order whatever a machine's cores."""
    if trainer.strategy.device.type != "cpu" or trainer.pool_figures is None:
        yield
        return
    with one_intra_op_thread():
        yield


@contextlib.contextmanager
def one_intra_op_thread():
    """torch computes on one intra-op thread inside the block; the count it had afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _train_epochs(trainer):
    """fit()'s epochs from trainer.first_epoch on; the same returns."""
    optim, log, state = trainer.config.optim, trainer.log, trainer.state
    first_epoch = trainer.first_epoch
    stop_after = trainer.config.output.stop_after_epochs
    for epoch in range(first_epoch, optim.epochs):
        epoch_start = time.perf_counter()
        result = train_epoch(trainer, epoch)
        if not result.stopped_early:  # a pass stopped early saved its checkpoint already
            end_epoch(trainer, epoch, result, epoch_start)
        if result.stopped_early or stop_requested(trainer):
            log.info(f"received {trainer.stop_signals.received or 'a stop signal on another rank'}: stopped after "
                     f"step {state.step} (epoch {state.epoch + 1}) and saved {trainer.checkpoints.last_path}; "
                     f"{how_to_continue(trainer.config)} to resume")
            return "preempted"
        if _patience_exhausted(trainer):
            log.info(f"early stopping: no better validation macro-F1 for {state.epochs_since_best} epochs")
            return "complete"
        if epoch + 1 - first_epoch == stop_after and epoch + 1 < optim.epochs:
            log.info(f"stopping after {stop_after} epoch(s) as asked; {how_to_continue(trainer.config)} "
                     f"to continue from epoch {epoch + 2}")
            return "paused"
    return "complete"


def how_to_continue(config):
    """How a stopped run goes on: the same command, whose --resume auto finds its checkpoint; a command
    that named --no-resume or another checkpoint would start over or from that one again."""
    resume = config.output.resume
    if resume == "auto":
        return "run the same command again"
    flag = "--no-resume" if resume is None else f"--resume {resume}"
    return f"run the same command without {flag} (it then resumes from {config.save_dir})"


def train_epoch(trainer, epoch):
    """Train over this rank's shard of `epoch` from where the train state stands in it; the state's
    step count follows."""
    config, strategy, state = trainer.config, trainer.strategy, trainer.state
    loader = trainer.loaders["train"]
    plan = _plan_epoch(trainer, epoch, loader)
    tally = EpochTally(strategy.device, *((state.epoch_loss_sum, state.epoch_samples) if strategy.is_main else ()))
    steps_left = math.ceil((plan.batches_in_epoch - plan.first_batch) / config.optim.grad_accum_steps)
    bar = trainer.log.progress(steps_left, f"epoch {epoch + 1}/{trainer.epochs}")
    hook = _StepHook(trainer, plan, tally, bar)
    batches = faults.wrap_batches(loader, epoch * plan.batches_in_epoch + plan.first_batch, strategy.rank)
    step, accum, steps = trainer.step, config.optim.grad_accum_steps, 0
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
    hook.check_ins.finish()
    hook.log(hook.readout.flush())
    bar.close()
    loss_sum, loss_samples = (0.0, 0) if stopped else checked_totals(trainer, tally)
    trained = (plan.batches_in_epoch - plan.first_batch) * trainer.micro_batch_samples
    slowest_s = float(strategy.max_over_ranks(torch.tensor(train_time_s, dtype=torch.float64,
                                                           device=strategy.device)))
    state.step = plan.first_step + steps
    return EpochResult(steps=steps, samples=trained, train_time_s=slowest_s, loss_sum=loss_sum,
                       loss_samples=loss_samples, stopped_early=stopped)


def _plan_epoch(trainer, epoch, loader):
    """Position the epoch's order and random streams from the train state; a mid-epoch resume in
    the same layout continues bit for bit, in another layout at the same sample with new streams."""
    state = trainer.state
    loader.sampler.set_epoch(epoch, start=0)
    batches_in_epoch = len(loader)
    loader.sampler.set_epoch(epoch, start=state.epoch_position)
    exact, trainer.exact_resume = trainer.exact_resume, False  # once: only the resumed epoch continues bit for bit
    trainer.rng.start_epoch(trainer.config.optim.seed, epoch, resume_exactly=exact)
    if exact:
        first_batch = state.epoch_position // trainer.micro_batch_samples
        return EpochPlan(first_batch, batches_in_epoch, state.step)
    # In another layout the remaining samples make a shorter epoch of their own (from 0: the whole epoch).
    return EpochPlan(0, len(loader), state.step)


def end_epoch(trainer, epoch, result, epoch_start):
    """Validate, update the train state, checkpoint and log the epoch's record."""
    trainer.align_replicas()
    if trainer.has_validation:
        labels, logits, val_loss = trainer.evaluate("val")
        metrics = summary_metrics(labels, logits.argmax(axis=1), len(trainer.data.class_names))
    else:
        val_loss, metrics = None, {"acc": None, "macro_f1": None}
    is_best = trainer.state.end_epoch(metrics["macro_f1"])
    trainer.save(is_best)
    strategy = trainer.strategy
    record = {"epoch": epoch + 1, "epochs": trainer.epochs, "step": trainer.state.step,
              "train_loss": result.loss_sum / max(1, result.loss_samples), "train_samples": result.loss_samples,
              "val_loss": val_loss, "val_acc": metrics["acc"], "val_macro_f1": metrics["macro_f1"],
              "lr": trainer.step.last_lr() if result.steps else 0.0,  # a solved head took no step at any LR
              "samples_per_s": result.samples / result.train_time_s if result.train_time_s > 0 else 0.0,
              "train_time_s": result.train_time_s, "epoch_time_s": time.perf_counter() - epoch_start,
              "world_size": strategy.world_size, "global_batch_size": trainer.global_batch,
              "memory": strategy.memory_report(),
              "model_state": strategy.model_state_report(trainer.model, trainer.step.optimizer)}
    trainer.log.log_epoch(record, is_best)
    if epoch == trainer.first_epoch:
        trainer.log.info("model state per rank (MB, parameters / gradients / optimizer): " + ", ".join(
            f"rank {rank} {row['parameters_mb']:.2f} / {row['gradients_mb']:.2f} / {row['optimizer_mb']:.2f}"
            for rank, row in enumerate(record["model_state"])))
    strategy.reset_memory_peaks()  # each epoch record reports its own peak


def _patience_exhausted(trainer):
    patience = trainer.config.optim.early_stopping_patience
    return bool(patience) and trainer.state.epochs_since_best >= patience


@dataclass
class EpochPlan:
    """Where this pass starts inside the epoch; a resumed epoch starts past its first batches."""
    first_batch: int  # micro-batches of the epoch this rank already did before this pass
    batches_in_epoch: int  # micro-batches of the whole epoch on this rank: fixes the accumulation windows
    first_step: int  # optimizer steps taken before this pass, over the whole run


@dataclass(kw_only=True)
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
        self.check_ins = CheckIns(trainer)
        self.readout = LogReadout(tally, trainer.step)

    def __call__(self, step):
        """After optimizer step `step` (counted over the run); True asks the pass to stop here."""
        trainer, output = self.trainer, self.trainer.config.output
        self.bar.update(1)
        batches_done = self.plan.first_batch + (step - self.plan.first_step) * trainer.config.optim.grad_accum_steps
        if batches_done >= self.plan.batches_in_epoch:
            return False  # the epoch's own end follows: validation, save, then any stop request
        if step % output.log_interval == 0:
            previous = self.readout.take(step)
            stop = self.check_ins(previous.health() if previous else NO_NEWS)
            self.log(previous)
        else:
            stop = self.check_ins.alone_and_asked_to_stop()
        if stop or (output.save_every_steps and step % output.save_every_steps == 0):
            self._save_mid_epoch(step, batches_done)
        return stop

    def log(self, point):
        """The progress bar's and TensorBoard's figures of a log point (None: nothing read yet)."""
        if point is not None and self.trainer.strategy.is_main:
            self.bar.set_postfix(loss=f"{point.mean_loss:.4f}", lr=f"{point.lr:.2e}")
            self.trainer.log.log_step(point.step, point.mean_loss, point.lr)

    def _save_mid_epoch(self, step, batches_done):
        trainer = self.trainer
        trained = (batches_done - self.plan.first_batch) * trainer.micro_batch_samples
        state = trainer.state
        state.step = step
        state.epoch_position = min(len(trainer.data.train), self.start_position + trained)
        state.epoch_loss_sum, state.epoch_samples = checked_totals(trainer, self.tally)
        trainer.save(is_best=False)
