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
    # Each batch's labels and logits are copied into tensors made before the pass. Kept as pieces until
    # its end, those small tensors took the space each batch's input left behind when it was freed, so
    # the next batch's input went to fresh pages: on a CPU a feature pool's validation pass faulted in
    # about 1 GB and took 0.58 s, 0.16 s since (docs/training.md, the window store).
    samples = len(loader.sampler)  # this rank's share, unpadded
    labels_all = torch.empty(samples, dtype=torch.long, device=device)
    logits_all = torch.empty(samples, num_classes, dtype=torch.float32, device=device)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    for _ in range(strategy.evaluation_batches(loader) - len(loader)):
        # A rank with fewer batches still takes part in every forward (FSDP gathers parameters there).
        with precision.autocast():
            model(torch.zeros(0, *window_shape(loader), device=device))
    filled = 0
    for signals, labels in loader:
        signals = signals.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        with precision.autocast():
            logits = model(signals)
        loss_sum += F.cross_entropy(logits.float(), labels, reduction="sum")
        labels_all[filled:filled + len(labels)] = labels
        logits_all[filled:filled + len(labels)] = logits
        filled += len(labels)
    if filled != samples:
        raise RuntimeError(f"the evaluation loader yielded {filled} samples where its sampler holds {samples}")
    labels_all = strategy.gather_concat(labels_all)
    # Flat: the ranks' pieces are gathered as 1-D tensors.
    logits_all = strategy.gather_concat(logits_all.flatten()).view(-1, num_classes)
    total_loss = float(strategy.sum_over_ranks(loss_sum))
    return labels_all.cpu().numpy(), logits_all.cpu().numpy(), total_loss / max(1, len(labels_all))
