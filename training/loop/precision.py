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

    @property
    def needs_grad_scaler(self):
        return self.enabled and self.dtype == torch.float16

    def autocast(self):
        if not self.enabled:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def make_grad_scaler(self):
        return torch.amp.GradScaler(self.device_type, enabled=self.needs_grad_scaler)

    def describe(self):
        if not self.enabled:
            return "precision: fp32 (AMP off)"
        scaler = " with GradScaler" if self.needs_grad_scaler else ""
        return f"precision: AMP {self.dtype_name} autocast{scaler}"


class SkippedStepBuffers:
    """Under fp16 the GradScaler skips a step whose gradients overflowed, but the forward passes
    have already folded the window's batches into BatchNorm's running statistics, so one NaN batch
    would leave them NaN for the rest of the run. This keeps the float buffers as they were when
    the accumulation window opened and puts them back if a loss of the window was not finite,
    with no host sync."""

    def __init__(self, model):
        self.buffers = [buffer for buffer in model.buffers() if buffer.is_floating_point()]
        self.saved = [buffer.detach().clone() for buffer in self.buffers]
        self.finite = None  # a device bool: every loss of the open window was finite

    def open_window(self):
        torch._foreach_copy_(self.saved, self.buffers)
        self.finite = None

    def watch(self, loss):
        finite = torch.isfinite(loss)
        self.finite = finite if self.finite is None else self.finite & finite

    def close_window(self):
        for buffer, saved in zip(self.buffers, self.saved):
            torch.where(self.finite, buffer, saved, out=buffer)


def skipped_step_buffers(model, precision):
    """The guard for fp16 runs of models with float buffers; None where nothing needs guarding."""
    if not precision.needs_grad_scaler or not any(b.is_floating_point() for b in model.buffers()):
        return None
    return SkippedStepBuffers(model)
