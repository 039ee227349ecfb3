"""Mixed precision: which autocast dtype to use on this device, and the matching GradScaler."""
import contextlib

import torch

from training.errors import UsageError

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
        self.in_model = False  # the model casts itself (FSDP's mixed-precision policy): no autocast

    def delegate_to_model(self):
        self.in_model = True

    @property
    def needs_grad_scaler(self):
        return self.enabled and self.dtype == torch.float16

    def autocast(self):
        if not self.enabled or self.in_model:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def make_grad_scaler(self):
        return torch.amp.GradScaler(self.device_type, enabled=self.needs_grad_scaler)

    def describe(self):
        if not self.enabled:
            return "precision: fp32 (AMP off)"
        scaler = " with GradScaler" if self.needs_grad_scaler else ""
        how = "through FSDP's mixed-precision policy" if self.in_model else "autocast"
        return f"precision: AMP {self.dtype_name} {how}{scaler}"


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
