"""Building blocks shared by the models."""
from torch import nn


def norm_1d(kind, channels):
    """Normalisation over [B, C, T] features.

    batch: BatchNorm (batch-dependent, so DDP needs --sync-bn to match one process);
    group: GroupNorm, per sample, so results do not depend on how a batch is split;
    none: identity.
    """
    if kind == "batch":
        return nn.BatchNorm1d(channels)
    if kind == "group":
        return nn.GroupNorm(num_groups=min(8, channels), num_channels=channels)
    return nn.Identity()


def conv_block(in_channels, out_channels, kernel_size, norm, stride=1):
    """Conv1d -> norm -> ReLU, padded so that stride 1 keeps the length."""
    return nn.Sequential(
        nn.Conv1d(in_channels, out_channels, kernel_size, stride=stride,
                  padding=kernel_size // 2, bias=norm == "none"),
        norm_1d(norm, out_channels),
        nn.ReLU(inplace=True),
    )
