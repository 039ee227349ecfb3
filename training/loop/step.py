"""The training step and evaluation pass, identical for one device, DataParallel and DDP."""
import contextlib
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from training.loop.schedule import micro_step_plan


@dataclass
class Optimization:
    """The objects one optimizer step touches, and the knobs that shape it."""
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    grad_scaler: torch.amp.GradScaler
    grad_accum_steps: int
    max_grad_norm: float
    label_smoothing: float = 0.0
    augment: object = None  # a data.augment.BatchAugmenter, or None
    ema: object = None  # a training.loop.ema.WeightAverage updated after every step, or None
    buffer_guard: object = None  # a training.loop.precision.SkippedStepBuffers under fp16, or None


def build_adamw(model, lr, weight_decay, device):
    """AdamW that decays only weight matrices and kernels (ndim >= 2), not biases or norm scales.

    The group order (decayed, then not) is what a resumed run relies on to reset each decay."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    # The fused CUDA kernel also lets an fp16 GradScaler skip its per-step host sync.
    return torch.optim.AdamW(groups, lr=lr, fused=True if device.type == "cuda" else None)


def compile_for_training(train_model, hardware):
    """torch.compile around the wrapped model (around DDP, so no_sync stays on the DDP module),
    or the model itself without --compile."""
    if not hardware.compile:
        return train_model
    mode = hardware.compile_mode
    return torch.compile(train_model, mode=None if mode in (None, "default") else mode)


@dataclass
class EpochPlan:
    """Where this call starts inside the epoch; a resumed epoch starts past its first batches."""
    first_batch: int  # micro-batches of the epoch this rank already did before this call
    batches_in_epoch: int  # micro-batches of the whole epoch on this rank: fixes the accumulation windows
    first_step: int  # optimizer steps taken before this call, over the whole run


@dataclass
class EpochResult:
    steps: int  # optimizer steps taken in this call
    train_time_s: float  # this rank's training time in this call
    stopped_early: bool  # after_step asked to stop (preemption)


def train_one_epoch(model, loader, opt, strategy, precision, plan, tally, after_step):
    """Train over this rank's shard of the epoch from `plan.first_batch` on.

    after_step(step) runs after every optimizer step with the run's step count; it logs,
    saves and may return True to leave the epoch at that step boundary. Nothing here reads a
    value back from the device or talks to other ranks (beyond DDP's gradient all-reduce), so
    the host never waits on the GPU inside the loop; `tally` adds no kernel either."""
    model.train()
    device = strategy.device
    watch_nonfinite = not opt.grad_scaler.is_enabled()  # an fp16 GradScaler skips such steps itself
    parameters = [p for p in model.parameters() if p.requires_grad]
    guard = opt.buffer_guard
    window_open = False
    steps = 0
    start = time.perf_counter()
    for batch_index, (signals, labels) in enumerate(loader, start=plan.first_batch):
        signals = signals.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        if opt.augment is not None:
            signals = opt.augment(signals)
        window_size, steps_now = micro_step_plan(batch_index, plan.batches_in_epoch, opt.grad_accum_steps)
        if guard is not None and not window_open:
            guard.open_window()
            window_open = True
        # Only the micro-batch that ends an accumulation window all-reduces its gradients.
        with strategy.no_sync() if not steps_now else contextlib.nullcontext():
            with precision.autocast():
                loss = F.cross_entropy(model(signals), labels, label_smoothing=opt.label_smoothing)
            opt.grad_scaler.scale(loss / window_size if window_size > 1 else loss).backward()
        loss = loss.detach()
        tally.add(loss, labels.shape[0], plan.first_step + steps + 1 if watch_nonfinite else None)
        if guard is not None:
            guard.watch(loss)
        if not steps_now:
            continue
        if opt.max_grad_norm > 0:
            opt.grad_scaler.unscale_(opt.optimizer)  # clip the true gradients, not scaled ones
            torch.nn.utils.clip_grad_norm_(parameters, opt.max_grad_norm)
        opt.grad_scaler.step(opt.optimizer)
        opt.grad_scaler.update()
        if guard is not None:
            guard.close_window()  # a step the scaler skipped leaves no trace in the buffers either
            window_open = False
        opt.optimizer.zero_grad(set_to_none=True)
        opt.scheduler.step()
        if opt.ema is not None:
            opt.ema.update()
        steps += 1
        if after_step(plan.first_step + steps):
            return EpochResult(steps, time.perf_counter() - start, stopped_early=True)
    strategy.synchronize()  # one sync per epoch so the time covers the queued GPU work
    return EpochResult(steps, time.perf_counter() - start, stopped_early=False)


@torch.no_grad()
def predict(model, loader, strategy, precision):
    """(labels, predictions, mean loss) over the whole split, gathered from every rank."""
    model.eval()
    device = strategy.device
    labels_seen, predictions = [], []
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    for signals, labels in loader:
        signals = signals.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        with precision.autocast():
            logits = model(signals)
        loss_sum += F.cross_entropy(logits.float(), labels, reduction="sum")
        labels_seen.append(labels)
        predictions.append(logits.argmax(dim=1))
    labels_all = strategy.gather_concat(_cat(labels_seen, device))
    predictions_all = strategy.gather_concat(_cat(predictions, device))
    total_loss = float(strategy.sum_over_ranks(loss_sum))
    return labels_all.cpu().numpy(), predictions_all.cpu().numpy(), total_loss / max(1, len(labels_all))


def _cat(tensors, device):
    return torch.cat(tensors) if tensors else torch.zeros(0, dtype=torch.long, device=device)
