"""The training step: what the trainer, the profiler and the benchmarks all run (the evaluation pass is
evaluation.py's); with AdamW and the step's arithmetic as pure functions: the LR scaled with the global batch,
the accumulation windows, warmup and cosine decay; and mixed precision: the autocast dtype for the
device and the matching GradScaler."""
import contextlib
import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.optim.lr_scheduler import LambdaLR

from training.errors import UsageError
from training.loop.step_graph import WholeStepGraph


class NoTimer:
    """Stands in where nobody times the step's phases (the trainer): lap() does nothing."""

    def lap(self, phase):
        pass


NO_TIMER = NoTimer()


@dataclass(kw_only=True)
class TrainStep:
    """One optimizer step, as every caller takes it.

    accumulate() takes one micro-batch: to the device, augmentation, forward under autocast, the
    label-smoothed loss, backward of the micro-batch's share of its accumulation window (under
    no_sync unless it closes the window) and the loss into the tally. update() closes the window:
    unscale and clip, the GradScaler's optimizer step, zero_grad, the LR schedule and the weight
    average. Neither reads a value back from the device or talks to other ranks beyond DDP's
    gradient all-reduce, so the host never waits for the GPU here."""
    model: torch.nn.Module  # wrapped (DDP, DataParallel) and maybe compiled: what the step calls
    parameters: list  # the trainable parameters of the bare model, clipped together
    strategy: object
    precision: object  # a Precision (below)
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    grad_scaler: torch.amp.GradScaler
    grad_accum_steps: int
    max_grad_norm: float
    label_smoothing: float = 0.0
    augment: object = None  # a data.augment.BatchAugmenter, or None
    ema: object = None  # a training.loop.recipe.WeightAverage, or None
    skips: object = None  # a SkippedSteps (below) under fp16, or None
    record_graph: bool = False  # replay each full batch's step as one CUDA graph (step_graph.py)
    warn: object = print  # where the step says that recording failed and it runs eagerly
    _window_open: bool = False
    _replayed: bool = False  # the last accumulate() was a replay: its optimizer step is taken

    def __post_init__(self):
        self.graph = WholeStepGraph(self, self.warn) if self.record_graph else None

    @property
    def watches_nonfinite(self):
        """Whether the tally watches losses for NaN/inf: under fp16 the GradScaler skips such steps
        and `skips` counts them."""
        return not self.grad_scaler.is_enabled()

    def accumulate(self, signals, labels, window_size, sync, tally=None, step_number=None, timer=NO_TIMER):
        """One micro-batch of a window of `window_size`; `sync`: it ends the window, so DDP all-reduces.
        `step_number` is the optimizer step it belongs to, for the tally's NaN report. Returns the
        detached loss."""
        if self.graph is not None:
            if sync and self.graph.takes(signals, labels, window_size):
                return self._replay(signals, labels, tally, step_number, timer)
            self.graph.before_eager_step()
        device = self.strategy.device
        signals = signals.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        timer.lap("data")
        if self.augment is not None:
            signals = self.augment(signals, labels)
        if self.skips is not None and not self._window_open:
            self.skips.open_window()
            self._window_open = True
        # Only the micro-batch that ends an accumulation window all-reduces its gradients.
        with contextlib.nullcontext() if sync else self.strategy.no_sync():
            with self.precision.autocast():
                loss = F.cross_entropy(self.model(signals), labels, label_smoothing=self.label_smoothing)
            timer.lap("forward")
            self.grad_scaler.scale(loss / window_size if window_size > 1 else loss).backward()
        timer.lap("backward")
        loss = loss.detach()
        if tally is not None:
            tally.add(loss, labels.shape[0], step_number if self.watches_nonfinite else None)
        return loss

    def _replay(self, signals, labels, tally, step_number, timer):
        timer.lap("data")
        loss = self.graph.run(signals, labels)
        if loss is None:  # recording failed: this and every later step run eagerly
            return self.accumulate(signals, labels, 1, True, tally, step_number, timer)
        timer.lap("forward")  # the whole step, one replay: a phase timer sees it all as the forward
        timer.lap("backward")
        self._replayed = True
        if tally is not None:
            tally.add(loss, labels.shape[0], step_number if self.watches_nonfinite else None)
        return loss

    def update(self, timer=NO_TIMER):
        """The optimizer step that closes the window (a replay took it already: only the schedule moves)."""
        if self._replayed:
            self._replayed = False
            self.scheduler.step()
            timer.lap("optimizer")
            return
        if self.max_grad_norm > 0:
            self.grad_scaler.unscale_(self.optimizer)  # clip the true gradients, not scaled ones
            self.strategy.clip_grad_norm_(self.parameters, self.max_grad_norm)
        if self.skips is not None:
            self.skips.before_step()
        self.grad_scaler.step(self.optimizer)
        self.grad_scaler.update()
        if self.skips is not None:
            self.skips.after_step()  # a step the scaler skipped leaves no trace in the buffers either
            self._window_open = False
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        if self.ema is not None:
            self.ema.update()
        timer.lap("optimizer")

    def last_lr(self):
        return float(self.scheduler.get_last_lr()[0])  # a device scalar where AdamW is capturable


class RunAdamW(torch.optim.AdamW):
    """AdamW whose resumed moments come back while the LR, weight decay and kernel follow this run:
    a resumed run may change the flags, and a CPU checkpoint resumed on CUDA (or back) must use
    this device's kernel, not the `fused` flag its groups were saved with."""

    def load_state_dict(self, state_dict):
        now = [{key: group[key] for key in ("lr", "initial_lr", "weight_decay")} for group in self.param_groups]
        kernel = {key: self.defaults[key] for key in ("fused", "capturable")}
        super().load_state_dict({**state_dict, "param_groups": [{**group, **kernel}
                                                                for group in state_dict["param_groups"]]})
        for group, settings in zip(self.param_groups, now, strict=True):
            group.update(settings)


def build_adamw(model, lr, weight_decay, device, capturable=False):
    """AdamW that decays only weight matrices and kernels (ndim >= 2), not biases or norm scales;
    `capturable`: its step can be recorded in a CUDA graph, the LR a device scalar the schedule fills.

    The group order (decayed, then not) is what a resumed run relies on to keep each decay."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay, "initial_lr": lr},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0, "initial_lr": lr}]
    # The fused kernel takes one pass over each tensor: on a CPU it halves the step of a small model
    # (MiniRocket's head), and on CUDA it also lets an fp16 GradScaler skip its per-step host sync.
    fused = True if device.type in ("cpu", "cuda") else None
    if capturable:
        return RunAdamW(groups, lr=torch.tensor(float(lr), device=device), fused=fused, capturable=True)
    return RunAdamW(groups, lr=lr, fused=fused)


def global_batch_size(batch_size, data_parallel_size, grad_accum_steps):
    """Samples per optimizer step: per-GPU batch x replicas (DDP ranks or DP GPUs) x accumulation."""
    return batch_size * data_parallel_size * grad_accum_steps


def scaled_lr(reference_lr, rule, global_batch, reference_batch):
    """The peak LR: `reference_lr` is meant for a global batch of `reference_batch`, and scales with the
    global batch against it (Goyal et al.'s linear rule, or its square root), however the batch is split
    into GPUs and accumulated micro-batches."""
    ratio = global_batch / reference_batch
    if rule == "linear":
        return reference_lr * ratio
    if rule == "sqrt":
        return reference_lr * math.sqrt(ratio)
    if rule == "none":
        return reference_lr
    raise ValueError(f"unknown lr scaling rule {rule!r}")


# A peak LR this many times the default's is far enough above what the models were tuned with
# to say so: with linear scaling, a global batch over 4 times the reference at the default --lr, or
# an --lr already multiplied for the layout and then scaled again.
FAR_ABOVE_DEFAULT = 4.0


def scaling_warning(reference_lr, rule, global_batch, reference_batch, default_lr):
    """One line when scaling lifts the peak LR far above the default's (None otherwise): --lr is
    meant for the reference batch, and a value already multiplied for a larger global batch is
    multiplied again unless the reference says so or scaling is off."""
    peak_lr = scaled_lr(reference_lr, rule, global_batch, reference_batch)
    if rule == "none" or global_batch <= reference_batch or peak_lr <= FAR_ABOVE_DEFAULT * default_lr:
        return None
    return (f"peak LR {peak_lr:.2e} is {peak_lr / default_lr:.0f}x the default's {default_lr:.0e}: --lr "
            f"{reference_lr:.2e} is meant for a global batch of {reference_batch} (--lr-reference-batch), and "
            f"{rule} scaling multiplies it by {peak_lr / reference_lr:.3g} for a global batch of {global_batch}; "
            f"if --lr is already meant for this global batch, pass --lr-reference-batch {global_batch} "
            "(or --lr-scaling none)")


def lr_line(lr, rule, reference_batch, peak_lr, split):
    """How the peak LR was reached, for the run's log; `split`: (per-GPU batch, replicas, accumulation)."""
    batch_size, replicas, accumulation = split
    global_batch = batch_size * replicas * accumulation
    scaled = {"linear": f"x {global_batch}/{reference_batch}", "sqrt": f"x sqrt({global_batch}/{reference_batch})",
              "none": "unscaled"}[rule]
    return (f"--lr {lr:.2e} for a global batch of {reference_batch} (--lr-reference-batch), {rule} scaling: "
            f"global batch {global_batch} ({batch_size} per GPU x {replicas} replicas x {accumulation} accumulation), "
            f"{scaled} -> peak {peak_lr:.2e}")


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


def compile_for_training(train_model, hardware):
    """torch.compile around the wrapped model (around DDP, so no_sync stays on the DDP module),
    or the model itself without --compile."""
    if not hardware.compile:
        return train_model
    mode = hardware.compile_mode
    return torch.compile(train_model, mode=None if mode in (None, "default") else mode)


# Mixed precision: which autocast dtype to use on this device, and the matching GradScaler.
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class Precision:
    """Resolved AMP settings. fp16 needs a GradScaler; bf16 has fp32's range and does not."""

    def __init__(self, device, amp_flag, amp_dtype_flag):
        self.device_type = device.type
        self.enabled = amp_flag if amp_flag is not None else device.type == "cuda"
        if amp_dtype_flag is not None and not self.enabled:
            raise UsageError(f"--amp-dtype {amp_dtype_flag} only applies with mixed precision on; add --amp "
                             "or drop --amp-dtype")
        if device.type == "cpu" and amp_dtype_flag == "fp16" and self.enabled:
            raise UsageError("--amp-dtype fp16 needs CUDA; on CPU --amp uses bf16 (drop --amp-dtype)")
        if amp_dtype_flag is None:
            # Native bf16 needs compute capability 8.0 (Ampere); older GPUs would emulate it slowly.
            use_bf16 = device.type == "cpu" or torch.cuda.get_device_capability(device) >= (8, 0)
            amp_dtype_flag = "bf16" if use_bf16 else "fp16"
        self.dtype_name = amp_dtype_flag if self.enabled else "fp32"
        self.dtype = DTYPES.get(amp_dtype_flag) if self.enabled else torch.float32

    @property
    def needs_grad_scaler(self):
        return self.enabled and self.dtype == torch.float16

    def autocast(self, cache_enabled=True):
        if not self.enabled:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype, cache_enabled=cache_enabled)

    def make_grad_scaler(self):
        return torch.amp.GradScaler(self.device_type, enabled=self.needs_grad_scaler)

    def describe(self):
        if not self.enabled:
            return "precision: fp32 (AMP off)"
        scaler = " with GradScaler" if self.needs_grad_scaler else ""
        return f"precision: AMP {self.dtype_name} autocast{scaler}"


# Consecutive optimizer steps an fp16 GradScaler may skip before the run counts as diverged. Each
# skip halves the loss scale, so by then it is 2^20 (about a million) times smaller than when the
# gradients last fit: what still overflows is not a scale problem but a NaN/inf loss or weights.
MAX_SKIPPED_STEPS = 20


class SkippedSteps:
    """The fp16 GradScaler's skipped steps, read from the scaler itself with no host sync: its scale
    falls only when it skips a step whose gradients overflowed.

    A skipped step leaves no trace: the forward passes of its window had already folded their
    batches into BatchNorm's running statistics (one NaN batch would leave them NaN for the rest
    of the run), so the float buffers are put back as they were when the window opened. And a run
    of skipped steps is counted, so a run whose every step overflows stops (MAX_SKIPPED_STEPS)
    instead of halving its scale forever."""

    def __init__(self, model, grad_scaler):
        self.grad_scaler = grad_scaler
        self.buffers = [buffer for buffer in model.buffers() if buffer.is_floating_point()]
        self.saved = [buffer.detach().clone() for buffer in self.buffers]
        self._scale_before = self.run = self.longest = None  # device tensors, made at the first step

    def open_window(self):
        if self.buffers:
            torch._foreach_copy_(self.saved, self.buffers)

    def before_step(self):
        """Call between the last backward of the window and the scaler's step and update."""
        scale = self.grad_scaler._scale  # the scaler's own tensor: reading it needs no host sync
        if self._scale_before is None:
            self._scale_before = torch.empty_like(scale)
            self.run = torch.zeros((), dtype=torch.int64, device=scale.device)
            self.longest = torch.zeros_like(self.run)
        self._scale_before.copy_(scale)

    def after_step(self):
        """Call after the scaler's update: undo a skipped step's buffers, count the run of skips."""
        skipped = self.grad_scaler._scale < self._scale_before
        for buffer, saved in zip(self.buffers, self.saved, strict=True):
            torch.where(skipped, saved, buffer, out=buffer)
        self.run.add_(1).mul_(skipped)
        torch.maximum(self.longest, self.run, out=self.longest)

    def longest_run(self):
        """The most consecutive steps skipped so far (reads the device)."""
        return 0 if self.longest is None else int(self.longest)


def skipped_steps(model, precision, grad_scaler):
    """The watch for fp16 runs, which a GradScaler steps; None where no step can be skipped."""
    return SkippedSteps(model, grad_scaler) if precision.needs_grad_scaler else None
