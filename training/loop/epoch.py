"""One epoch's training pass: the training step over this rank's batches, and between optimizer
steps the progress bar, loss logging, mid-epoch checkpoints, stop requests and the NaN check."""
import math
import time
from dataclasses import dataclass

import torch

from training import faults
from training.errors import TrainingDiverged
from training.loop.precision import MAX_SKIPPED_STEPS
from training.loop.step import micro_step_plan
from training.loop.tally import NO_NONFINITE_STEP, EpochTally


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


def train_epoch(trainer, epoch):
    """Train over this rank's shard of `epoch` from where the train state stands in it; the state's
    step count follows."""
    config, strategy, state = trainer.config, trainer.strategy, trainer.state
    loader = trainer.loaders["train"]
    plan = _plan(trainer, epoch, loader)
    tally = EpochTally(strategy.device, *((state.epoch_loss_sum, state.epoch_samples) if strategy.is_main else ()))
    steps_left = math.ceil((plan.batches_in_epoch - plan.first_batch) / config.optim.grad_accum_steps)
    bar = trainer.log.progress(steps_left, f"epoch {epoch + 1}/{config.optim.epochs}")
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
    hook.finish()
    bar.close()
    loss_sum, loss_samples = (0.0, 0) if stopped else global_tally(trainer, tally)
    trained = (plan.batches_in_epoch - plan.first_batch) * trainer.loader_batch * strategy.world_size
    slowest_s = float(strategy.max_over_ranks(torch.tensor(train_time_s, dtype=torch.float64, device=strategy.device)))
    state.step = plan.first_step + steps
    return EpochResult(steps, trained, slowest_s, loss_sum, loss_samples, stopped)


def _plan(trainer, epoch, loader):
    """Position the epoch's order and random streams from the train state; a mid-epoch resume in
    the same layout continues bit for bit, in another layout at the same sample with new streams."""
    state, strategy = trainer.state, trainer.strategy
    loader.sampler.set_epoch(epoch, start=0)
    batches_in_epoch = len(loader)
    loader.sampler.set_epoch(epoch, start=state.epoch_position)
    exact = trainer.take_exact_resume()
    trainer.rng.start_epoch(trainer.config.optim.seed, epoch, resume_exactly=exact)
    if exact:
        first_batch = state.epoch_position // (trainer.loader_batch * strategy.world_size)
        return EpochPlan(first_batch, batches_in_epoch, state.step)
    if state.epoch_position:  # another layout: the remaining samples make a shorter epoch of their own
        return EpochPlan(0, len(loader), state.step)
    return EpochPlan(0, batches_in_epoch, state.step)


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
        in a row), and return whether any rank
        received a stop signal. Ranks send one small message per check-in and act on the previous
        one, which has had --log-interval steps to arrive, so no rank waits for the others here and
        all act at the same step. A stop request is therefore acted on within two check-ins; the
        saves check the losses themselves, so a bad step is never saved."""
        trainer = self.trainer
        received = trainer.stop_signals.received is not None
        message = trainer.strategy.start_max_ints([int(received), *health(trainer, self.tally)])
        if trainer.strategy.world_size == 1:
            decision = message.wait()  # nothing was sent: act on it now
        else:
            decision, self.in_flight = (self.in_flight.wait() if self.in_flight else None), message
        if decision is None:
            return False
        stop, *worst = decision
        raise_if_diverged(trainer, *worst)
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
        state.epoch_loss_sum, state.epoch_samples = global_tally(trainer, self.tally)
        trainer.save(is_best=False)


def global_tally(trainer, tally):
    """(sum of per-sample losses, samples) over all ranks, as Python numbers, after the NaN check."""
    check_finite(trainer, tally)
    strategy = trainer.strategy
    totals = strategy.sum_over_ranks(torch.stack([tally.loss_sum(), torch.tensor(
        float(tally.samples), dtype=torch.float64, device=strategy.device)]))
    loss_sum, samples = totals.tolist()
    return loss_sum, int(samples)


def health(trainer, tally):
    """This rank's news for the NaN check, as ints whose maximum over ranks is the worst: the first
    step with a NaN/inf loss (negated), and the longest run of steps the fp16 GradScaler skipped."""
    skips = trainer.step.skips
    return [-int(tally.earliest_nonfinite_step()), skips.longest_run() if skips is not None else 0]


def check_finite(trainer, tally):
    """Stop, before anything is saved, once a loss on any rank was NaN or inf, or fp16 skipped
    MAX_SKIPPED_STEPS steps in a row."""
    raise_if_diverged(trainer, *trainer.strategy.max_ints(health(trainer, tally)))


def raise_if_diverged(trainer, negative_earliest, longest_skip_run):
    last = trainer.checkpoints.last_path
    kept = f"{last} still holds the last good state" if last.exists() else "nothing was saved"
    where = f"(epoch {trainer.state.epoch + 1}); {kept}"
    if -negative_earliest != NO_NONFINITE_STEP:
        raise TrainingDiverged(f"the training loss became NaN/inf at step {-negative_earliest} {where}. Lower "
                               "--lr, keep --max-grad-norm on, or check the data for extreme values")
    if longest_skip_run >= MAX_SKIPPED_STEPS:
        raise TrainingDiverged(f"the fp16 GradScaler skipped {longest_skip_run} optimizer steps in a row, their "
                               f"gradients overflowing at every loss scale {where}. The loss or the weights are "
                               "not finite: lower --lr, keep --max-grad-norm on, or try --amp-dtype bf16")
