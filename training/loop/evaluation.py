"""The evaluation pass: a model over one split's loader on every rank, its labels, logits and mean loss
gathered."""
import torch
import torch.nn.functional as F

from data.loaders import window_shape


@torch.no_grad()
def gather_predictions(model, loader, strategy, precision, num_classes):
    """(labels [N], logits [N, num_classes] in fp32, mean loss) over the whole split, gathered from
    every rank, as numpy arrays."""
    model.eval()
    device = strategy.device
    labels_seen, logits_seen = [], []
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    for _ in range(strategy.evaluation_batches(loader) - len(loader)):
        # A rank with fewer batches still takes part in every forward (FSDP gathers parameters there).
        with precision.autocast():
            model(torch.zeros(0, *window_shape(loader), device=device))
    for signals, labels in loader:
        signals = signals.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        with precision.autocast():
            logits = model(signals)
        loss_sum += F.cross_entropy(logits.float(), labels, reduction="sum")
        labels_seen.append(labels)
        logits_seen.append(logits.float().flatten())  # flat: the ranks' pieces are gathered as 1-D tensors
    labels_all = strategy.gather_concat(_cat(labels_seen, torch.long, device))
    logits_all = strategy.gather_concat(_cat(logits_seen, torch.float32, device)).view(-1, num_classes)
    total_loss = float(strategy.sum_over_ranks(loss_sum))
    return labels_all.cpu().numpy(), logits_all.cpu().numpy(), total_loss / max(1, len(labels_all))


def _cat(tensors, dtype, device):
    return torch.cat(tensors) if tensors else torch.zeros(0, dtype=dtype, device=device)
