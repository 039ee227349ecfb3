"""The training step and evaluation pass, identical for one device, DataParallel and DDP."""
import contextlib
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from training.schedule import micro_step_plan


@dataclass
class Optimization:
    """The objects one optimizer step touches, and the knobs that shape it."""
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    grad_scaler: torch.amp.GradScaler
    grad_accum_steps: int
    max_grad_norm: float


@dataclass
class EpochResult:
    train_loss: float
    samples: int  # global: summed over ranks
    train_time_s: float  # slowest rank, training phase only
    steps: int  # optimizer steps taken this epoch

    @property
    def samples_per_s(self):
        return self.samples / self.train_time_s if self.train_time_s > 0 else 0.0


def train_one_epoch(model, loader, opt, strategy, precision, progress, log_every_steps, on_log):
    """One pass over this rank's shard. Reads the loss back from the device only every
    `log_every_steps` optimizer steps (and only where `on_log` is set), never per step."""
    model.train()
    device = strategy.device
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)  # sum of per-sample losses
    samples, steps = 0, 0
    num_batches = len(loader)
    parameters = [p for p in model.parameters() if p.requires_grad]
    start = time.perf_counter()
    for batch_index, (signals, labels) in enumerate(loader):
        signals = signals.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        window_size, steps_now = micro_step_plan(batch_index, num_batches, opt.grad_accum_steps)
        # Only the micro-batch that ends an accumulation window all-reduces its gradients.
        with strategy.no_sync() if not steps_now else contextlib.nullcontext():
            with precision.autocast():
                loss = F.cross_entropy(model(signals), labels)
            opt.grad_scaler.scale(loss / window_size).backward()
        loss_sum += loss.detach() * labels.shape[0]
        samples += labels.shape[0]
        progress.update(1)
        if not steps_now:
            continue
        if opt.max_grad_norm > 0:
            opt.grad_scaler.unscale_(opt.optimizer)  # clip the true gradients, not scaled ones
            torch.nn.utils.clip_grad_norm_(parameters, opt.max_grad_norm)
        opt.grad_scaler.step(opt.optimizer)
        opt.grad_scaler.update()
        opt.optimizer.zero_grad(set_to_none=True)
        opt.scheduler.step()
        steps += 1
        if on_log is not None and steps % log_every_steps == 0:
            on_log(steps, (loss_sum / samples).item(), opt.scheduler.get_last_lr()[0])
    strategy.synchronize()  # one sync per epoch so the time covers the queued GPU work
    elapsed = time.perf_counter() - start
    totals = strategy.sum_over_ranks(torch.stack([loss_sum, torch.tensor(float(samples), dtype=torch.float64,
                                                                          device=device)]))
    slowest = strategy.max_over_ranks(torch.tensor(elapsed, dtype=torch.float64, device=device))
    total_loss, total_samples = totals.tolist()
    return EpochResult(total_loss / max(1.0, total_samples), int(total_samples), float(slowest), steps)


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
