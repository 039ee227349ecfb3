"""The ranks' stop-and-health protocol: when a run stops for a signal or a NaN, and what it may save.

Its promise: every rank stops at the same step, and a bad step is never saved. The ranks agree
through one small message at each check-in (--log-interval), carrying whether a stop signal
arrived (trainer.py's StopSignals records it) and each rank's health (the first step with a
NaN/inf loss, the longest run of steps the fp16 GradScaler skipped, as the previous log point read
them without waiting for the device: training/loop/readout.py); every rank acts on the same
message, so all stop at the same step, and one process alone acts on its own at once. A message
has --log-interval steps to arrive, so a stop request is acted on within two check-ins; at the
epoch's end stop_requested() agrees again. Every save reads the loss totals through
checked_totals(), which raises TrainingDiverged first when any rank's losses went bad (NaN/inf,
or MAX_SKIPPED_STEPS fp16 skips in a row), so no checkpoint ever holds a bad step."""
import torch

from training.errors import TrainingDiverged
from training.loop.step import MAX_SKIPPED_STEPS
from training.loop.tally import NO_NONFINITE_STEP


def _health(trainer, tally):
    """This rank's news for the NaN check, as ints whose maximum over ranks is the worst: the first
    step with a NaN/inf loss (negated), and the longest run of steps the fp16 GradScaler skipped."""
    skips = trainer.step.skips
    return [-int(tally.earliest_nonfinite_step()), skips.longest_run() if skips is not None else 0]


def _raise_if_diverged(trainer, negative_earliest, longest_skip_run):
    if -negative_earliest != NO_NONFINITE_STEP:
        raise TrainingDiverged(f"the training loss became NaN/inf at step {-negative_earliest} {_where(trainer)}. "
                               "Lower --lr, keep --max-grad-norm on, or check the data for extreme values")
    if longest_skip_run >= MAX_SKIPPED_STEPS:
        raise TrainingDiverged(f"the fp16 GradScaler skipped {longest_skip_run} optimizer steps in a row, their "
                               f"gradients overflowing at every loss scale {_where(trainer)}. The loss or the weights "
                               "are not finite: lower --lr, keep --max-grad-norm on, or try --amp-dtype bf16")


def _where(trainer):
    """The epoch and the checkpoints kept, for a message: built only when one is raised, since the
    checks run at every check-in and the checkpoints' names come from the disk."""
    return f"(epoch {trainer.state.epoch + 1}); {trainer.checkpoints.kept()}"


def checked_totals(trainer, tally):
    """(sum of per-sample losses, samples) over all ranks, as Python numbers, after the health check
    that stops the run before anything is saved."""
    strategy = trainer.strategy
    _raise_if_diverged(trainer, *strategy.max_ints(_health(trainer, tally)))
    own = torch.stack([tally.loss_sum(), torch.tensor(float(tally.samples), dtype=torch.float64,
                                                        device=strategy.device)])
    if trainer.replicated and not strategy.is_main:
        own = torch.zeros_like(own)  # replicas all counted the same batches: rank 0's figures alone
    totals = strategy.sum_over_ranks(own)
    loss_sum, samples = totals.tolist()
    return loss_sum, int(samples)


def stop_requested(trainer):
    """True on every rank once any rank received SIGTERM/SIGUSR1, so all stop at the same step."""
    return bool(trainer.strategy.max_ints([int(trainer.stop_signals.received is not None)])[0])


class CheckIns:
    """The check-ins of one pass over the training split."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.in_flight = None  # the last check-in's message between ranks, not yet waited for

    def __call__(self, health):
        """At a log point, with this rank's `health` as _health gives it (the last log point's read,
        training/loop/readout.py): raise once any rank's losses went bad; True once any rank received
        a stop signal. Ranks act on the previous check-in's message, so none waits for the others here."""
        trainer = self.trainer
        received = trainer.stop_signals.received is not None
        message = trainer.strategy.start_max_ints([int(received), *health])
        if trainer.strategy.world_size == 1:
            decision = message.wait()  # nothing was sent: act on it now
        else:
            decision, self.in_flight = (self.in_flight.wait() if self.in_flight else None), message
        if decision is None:
            return False
        stop, *worst = decision
        _raise_if_diverged(trainer, *worst)
        return bool(stop)

    def finish(self):
        """Wait for the message still in flight (its news is checked again at the epoch's end)."""
        if self.in_flight is not None:
            self.in_flight.wait()
            self.in_flight = None

    def alone_and_asked_to_stop(self):
        """Between check-ins: one process needs no agreement; ranks wait for the next check-in."""
        return self.trainer.strategy.world_size == 1 and self.trainer.stop_signals.received is not None
