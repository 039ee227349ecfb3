"""Learning-rate arithmetic: scaling with the global batch, warmup and cosine decay (pure functions)."""
import functools
import math

from torch.optim.lr_scheduler import LambdaLR


def global_batch_size(batch_size, data_parallel_size, grad_accum_steps):
    """Samples per optimizer step: per-GPU batch x replicas (DDP ranks or DP GPUs) x accumulation."""
    return batch_size * data_parallel_size * grad_accum_steps


def scaled_lr(reference_lr, rule, global_batch, batch_size):
    """The peak LR: the reference LR (one device, no accumulation) scaled by global/batch_size."""
    ratio = global_batch / batch_size
    if rule == "linear":
        return reference_lr * ratio
    if rule == "sqrt":
        return reference_lr * math.sqrt(ratio)
    if rule == "none":
        return reference_lr
    raise ValueError(f"unknown lr scaling rule {rule!r}")


# A peak LR this many times the default's is far enough above what the models were tuned with
# to say so: with linear scaling, more than 4 GPUs (or 4 accumulated micro-batches) at the default
# --lr, or an --lr already multiplied for the layout and then scaled again.
FAR_ABOVE_DEFAULT = 4.0


def scaling_warning(reference_lr, rule, global_batch, batch_size, default_lr):
    """One line when scaling lifts the peak LR far above the default's (None otherwise): the
    reference --lr is meant for one device, and a value already multiplied for several is
    multiplied again unless scaling is off."""
    peak_lr = scaled_lr(reference_lr, rule, global_batch, batch_size)
    if rule == "none" or global_batch <= batch_size or peak_lr <= FAR_ABOVE_DEFAULT * default_lr:
        return None
    return (f"peak LR {peak_lr:.2e} is {peak_lr / default_lr:.0f}x the default's {default_lr:.0e}: --lr "
            f"{reference_lr:.2e} is the LR of one device, and {rule} scaling multiplies it by "
            f"{peak_lr / reference_lr:.3g} for a global batch of {global_batch} ({global_batch / batch_size:g}x "
            f"--batch-size {batch_size}); "
            "if --lr is already meant for this global batch, pass --lr-scaling none")


def steps_per_epoch(micro_batches_per_epoch, grad_accum_steps):
    """Optimizer steps in one epoch: a last partial accumulation window still steps."""
    return math.ceil(micro_batches_per_epoch / grad_accum_steps)


def micro_step_plan(batch_index, micro_batches_per_epoch, grad_accum_steps):
    """For a micro-batch: (size of its accumulation window, whether the optimizer steps after it).

    Windows are grad_accum_steps long except possibly the last of the epoch, which is shorter;
    dividing each micro-batch loss by its window size keeps the step's gradient a mean.
    """
    window_start = (batch_index // grad_accum_steps) * grad_accum_steps
    window_size = min(grad_accum_steps, micro_batches_per_epoch - window_start)
    return window_size, batch_index == window_start + window_size - 1


def warmup_cosine(step, warmup_steps, total_steps):
    """LR multiplier for optimizer step `step` (0-based): linear ramp to 1, then cosine to 0."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps  # the first step already moves: never a zero LR
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(optimizer, warmup_steps, total_steps, start_step=0):
    """A LambdaLR over `warmup_cosine`, stepped once per optimizer step, positioned at start_step.

    The schedule is a pure function of the step, so a resumed run rebuilds it at its position
    (each param group then needs "initial_lr") rather than trusting a saved one."""
    return LambdaLR(optimizer, functools.partial(warmup_cosine, warmup_steps=warmup_steps,
                                                 total_steps=total_steps), last_epoch=start_step - 1)
