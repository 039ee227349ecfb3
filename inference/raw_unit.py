"""The network a checkpoint describes, with its normalisation in front: raw-unit windows in, logits out.
Single checkpoints (inference/bundle.py) and each member of a fold ensemble (inference/ensemble.py)
are built here."""
import torch
from torch import nn

from training.config.settings import RunConfig
from training.errors import UsageError


class RawUnitModel(nn.Module):
    """(signals - mean) / std, then the model: raw-unit windows in, logits out."""

    def __init__(self, model, mean, std):
        super().__init__()
        self.model = model
        self.register_buffer("mean", torch.as_tensor(mean, dtype=torch.float32).reshape(1, -1, 1))
        self.register_buffer("std", torch.as_tensor(std, dtype=torch.float32).reshape(1, -1, 1))

    def forward(self, signals):
        return self.model((signals - self.mean) / self.std)


def raw_unit_model(member, weights, window_steps, path):
    """The network a checkpoint (or an ensemble's member) describes, with its weights and its
    normalisation in front."""
    config = member["config"]
    model = RunConfig.from_flags(config).model.build(member["in_channels"], member["num_classes"], window_steps)
    try:
        model.load_state_dict(weights)
    except RuntimeError as exc:
        raise UsageError(f"checkpoint {path}: weights do not fit a {config['model']} model "
                         f"({str(exc).splitlines()[0]})") from None
    normalization = member["normalization"]
    return RawUnitModel(model, normalization["mean"].float(), normalization["std"].float())
