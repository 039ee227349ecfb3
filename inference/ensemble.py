"""Fold ensembles: the models of a cross-validation (and its refit) as one checkpoint that loads as
one model, for predict.py, export.py and the run's own test report. Each member keeps its own
normalisation (a fold's statistics come from its own training subjects); the ensemble's "logits" are
the log of the members' mean probabilities, so that softmax gives that mean back and everything that
reads a single model's logits reads an ensemble's unchanged."""
import math

import torch
from torch import nn

from training.checkpoint.files import inference_weights, load_checkpoint, save_checkpoint
from training.errors import UsageError

ENSEMBLE_FILE = "ensemble.pt"
ENSEMBLE_KIND = "fold-ensemble"  # the "kind" of an ensemble checkpoint; single runs' checkpoints have none
SHARED_KEYS = ("class_names", "channel_names", "in_channels", "num_classes", "sample_rate_hz", "window_steps",
               "preprocessing")  # what every member must agree on: the windows in, the classes out
MEMBER_KEYS = ("config", "normalization", "in_channels", "num_classes")


class ProbabilityAverage(nn.Module):
    """Raw-unit windows in; log of the members' mean class probabilities out."""

    def __init__(self, members):
        super().__init__()
        self.members = nn.ModuleList(members)

    def forward(self, signals):
        # log(mean_k p_k) = logsumexp_k(log p_k) - log K: no log of a probability that underflowed to 0.
        log_probabilities = torch.stack([torch.log_softmax(member(signals), dim=1) for member in self.members])
        return torch.logsumexp(log_probabilities, dim=0) - math.log(len(self.members))


def write_ensemble(member_paths, path, config):
    """One checkpoint of the runs' inference weights (the moving average where kept), each with
    its normalisation and settings; `config` is the cross-validation's own flat flags."""
    members, shared = [], None
    for member_path in member_paths:
        checkpoint = load_checkpoint(member_path)
        these = {key: checkpoint[key] for key in SHARED_KEYS}
        if shared is not None and these != shared:
            raise UsageError(f"{member_path} was trained on other windows or classes than {member_paths[0]}; "
                             "an ensemble's members must share them")
        shared = these
        members.append({"model": inference_weights(checkpoint), "source": str(member_path),
                        **{key: checkpoint[key] for key in MEMBER_KEYS}})
    save_checkpoint({"kind": ENSEMBLE_KIND, "members": members, "config": config, **shared}, path)
    return path
