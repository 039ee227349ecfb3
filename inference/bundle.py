"""A checkpoint made ready for inference: the network it describes with its normalisation in front
(raw-unit windows in, logits out, eval mode), and what its windows need. A fold ensemble
(inference/ensemble.py) loads into the same shape."""
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from data.errors import DataError, not_a_file
from inference.checkpoint_checks import check_declared_shapes, check_members, checked_layout, checked_model
from inference.ensemble import ProbabilityAverage
from training.checkpoint.files import load_checkpoint
from training.checkpoint.format import ENSEMBLE_KIND, ENSEMBLE_MEMBER_KEYS, PREDICTION_KEYS, WEIGHT_KEYS, SavedRun
from training.config.settings import RunConfig
from training.distributed.strategy import resolve_device_type
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


def raw_unit_model(part, weights, window_steps, path, member=None):
    """The network a checkpoint (or its ensemble's `member`-th part; either a SavedRun) describes,
    checked first, with its weights and its normalisation in front."""
    model = checked_model(part, weights, window_steps, path, member)
    normalization = part.normalization
    return RawUnitModel(model, normalization["mean"].float(), normalization["std"].float())


@dataclass
class ModelBundle:
    model: torch.nn.Module  # raw-unit windows in, logits out; eval mode, on CPU until moved
    mean: np.ndarray  # float32 [channels], raw units: the training windows' scale
    std: np.ndarray  # float32 [channels]
    class_names: tuple
    channel_names: tuple
    sample_rate_hz: float
    window_steps: int
    preprocessing: str
    config: RunConfig  # the run's settings, rebuilt from the checkpoint (today's defaults for newer ones)
    path: str
    members: int = 1  # models whose probabilities are averaged: more than one for a fold ensemble
    described: object = None  # the description (a data.layout.Layout) its data was read with, or None
    padded: bool = False  # its model reads windows padded at their end with NaN, each over its own steps
    refitted: bool = False  # a final model trained on its validation people too (SavedRun.refitted)

    def describe(self):
        models = f"ensemble of {self.members} {self.config.model.name} models" if self.members > 1 \
            else self.config.model.name
        return (f"checkpoint {self.path}: {models} on {len(self.channel_names)} channels "
                f"({self.config.data.mode}) x {self.window_steps} steps at {self.sample_rate_hz:g} Hz, "
                f"{len(self.class_names)} classes")


def load_bundle(path):
    """Load with the project's weights_only loader, refuse in one line what lacks a key."""
    if not Path(path).is_file():
        raise UsageError(f"--checkpoint {path} {not_a_file(path)}; point it at a best.pt or last.pt written by "
                         "training")
    saved = SavedRun.of(load_checkpoint(path))
    if saved is None:
        raise UsageError(f"{path} is not a checkpoint of this trainer; point --checkpoint at a best.pt or last.pt")
    kind = saved.kind
    if kind not in WEIGHT_KEYS:
        raise UsageError(f"checkpoint {path} is of kind {kind!r}, which this version of the trainer does not know; "
                         "update the trainer")
    missing = saved.missing((*PREDICTION_KEYS, *WEIGHT_KEYS[kind]))
    if missing:
        raise UsageError(f"checkpoint {path} lacks {', '.join(missing)}, which predicting needs (it was written "
                         "by an older version, or is not a checkpoint of this trainer); retrain to get them")
    check_declared_shapes(saved, path)
    layout = checked_layout(saved, path)
    steps = layout.window_steps
    if kind == ENSEMBLE_KIND:
        check_members(saved, path, ENSEMBLE_MEMBER_KEYS)
        models = [raw_unit_model(member, member.weights, steps, path, number)
                  for number, member in enumerate(saved.member_runs(), start=1)]
    else:
        models = [raw_unit_model(saved, saved.inference_weights(), steps, path)]
    model = ProbabilityAverage(models) if kind == ENSEMBLE_KIND else models[0]
    # An ensemble's scale of the raw windows (what example inputs are drawn at) is its members' mean.
    mean, std = (torch.stack([getattr(part, key).flatten() for part in models]).mean(dim=0).numpy()
                 for key in ("mean", "std"))
    return ModelBundle(model.eval(), mean, std, tuple(layout.class_names), tuple(layout.channels),
                       float(layout.sample_rate_hz), int(layout.window_steps), str(layout.preprocessing),
                       RunConfig.from_flags(saved.flags), str(path), len(models), _described(saved, path),
                       all(part.model.padded for part in models), saved.refitted)


def _described(saved, path):
    try:
        return saved.described(f"checkpoint {path}")
    except DataError as exc:
        raise UsageError(f"{exc}; the file is damaged or not written by this trainer") from None


def pick_device(name):
    """--device auto|cuda|cpu as torch.device, with training's check that CUDA is there."""
    return torch.device(resolve_device_type(name))


def batches(windows, device, batch_size=512):
    """float32 tensors on `device` of consecutive raw-unit windows [N, C, T]: of an array, or of
    anything indexed by an array of positions that gives one (a window store's signals)."""
    for first in range(0, len(windows), batch_size):
        stop = min(first + batch_size, len(windows))
        # An array's batch is a view (no copy when it is float32 already); a store reads positions.
        batch = windows[first:stop] if isinstance(windows, np.ndarray) else windows[np.arange(first, stop)]
        yield torch.from_numpy(np.ascontiguousarray(batch, dtype=np.float32)).to(device)


@torch.no_grad()
def probabilities(bundle, windows, device, batch_size=512):
    """Softmax class probabilities [N, classes] (float64) of the windows `batches` reads."""
    model = bundle.model.to(device)
    chunks = [torch.softmax(model(batch).double(), dim=1).cpu() for batch in batches(windows, device, batch_size)]
    return check_finite_probabilities(torch.cat(chunks).numpy() if chunks else np.zeros((0, len(bundle.class_names))))


def check_finite_probabilities(probs):
    """`probs` [N, classes], refused in one line where a window's are not finite: its input lies far
    beyond what the model was trained on (values near float32's limit), or the checkpoint's weights are
    not sound. Written out, NaN would read as the first class."""
    bad = ~np.isfinite(probs).all(axis=1)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise UsageError(f"the model's outputs are NaN or infinite for {int(bad.sum())} of {len(probs)} window(s), the "
                         f"first window {first}: the input lies far beyond the values the model was trained on "
                         "(check the recording's units and values) or the checkpoint's weights are not sound")
    return probs
