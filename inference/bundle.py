"""A checkpoint made ready for inference: the model in eval mode and what its windows need."""
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from models import SIZE_KNOBS, build_model
from training.checkpoint.files import inference_weights, load_checkpoint
from training.config.environment import resolve_device_type
from training.errors import UsageError

NEEDED_KEYS = ("model", "config", "normalization", "class_names", "channel_names", "in_channels",
               "num_classes", "sample_rate_hz", "window_steps", "preprocessing")


@dataclass
class ModelBundle:
    model: torch.nn.Module  # eval mode, on CPU until moved
    mean: np.ndarray  # float32 [channels], raw units
    std: np.ndarray  # float32 [channels]
    class_names: tuple
    channel_names: tuple
    sample_rate_hz: float
    window_steps: int
    preprocessing: str
    config: dict
    path: str

    def describe(self):
        return (f"checkpoint {self.path}: {self.config.get('model')} on {len(self.channel_names)} channels "
                f"({self.config.get('mode')}) x {self.window_steps} steps at {self.sample_rate_hz:g} Hz, "
                f"{len(self.class_names)} classes")


def load_bundle(path):
    """Load with the project's weights_only loader, refuse in one line what lacks a key."""
    if not Path(path).is_file():
        what = "is a folder" if Path(path).is_dir() else "does not exist"
        raise UsageError(f"--checkpoint {path} {what}; point it at a best.pt or last.pt written by training")
    checkpoint = load_checkpoint(path)
    if not isinstance(checkpoint, dict):
        raise UsageError(f"{path} is not a checkpoint of this trainer; point --checkpoint at a best.pt or last.pt")
    missing = [key for key in NEEDED_KEYS if key not in checkpoint]
    if missing:
        raise UsageError(f"checkpoint {path} lacks {', '.join(missing)}, which predicting needs (it was written "
                         "by an older version, or is not a checkpoint of this trainer); retrain to get them")
    config = checkpoint["config"]
    mean = checkpoint["normalization"]["mean"].numpy().astype(np.float32)
    std = checkpoint["normalization"]["std"].numpy().astype(np.float32)
    model = build_model(config["model"], checkpoint["in_channels"], checkpoint["num_classes"],
                        dropout=config.get("dropout", 0.0), norm=config.get("norm", "batch"),
                        **{knob: config.get(knob) for knob in SIZE_KNOBS})
    try:
        model.load_state_dict(inference_weights(checkpoint))  # the moving average when the run kept one
    except RuntimeError as exc:
        raise UsageError(f"checkpoint {path}: weights do not fit a {config['model']} model "
                         f"({str(exc).splitlines()[0]})") from None
    return ModelBundle(model.eval(), mean, std, tuple(checkpoint["class_names"]),
                       tuple(checkpoint["channel_names"]), float(checkpoint["sample_rate_hz"]),
                       int(checkpoint["window_steps"]), str(checkpoint["preprocessing"]), dict(config), str(path))


def require_sample_rate(bundle):
    if not math.isfinite(bundle.sample_rate_hz) or bundle.sample_rate_hz <= 0:
        raise UsageError(f"checkpoint {bundle.path} does not know the sample rate of its windows (an .npz "
                         "without sample_rate_hz); add it to the .npz and retrain to classify recordings")


def pick_device(name):
    """--device auto|cuda|cpu as torch.device, with training's check that CUDA is there."""
    return torch.device(resolve_device_type(name))


@torch.no_grad()
def probabilities(bundle, windows, device, batch_size=512):
    """Softmax class probabilities [N, classes] (float64) of raw-unit windows [N, C, T]."""
    model = bundle.model.to(device)
    mean = torch.from_numpy(bundle.mean).to(device)[None, :, None]
    std = torch.from_numpy(bundle.std).to(device)[None, :, None]
    chunks = []
    for first in range(0, len(windows), batch_size):
        batch = torch.from_numpy(windows[first:first + batch_size]).to(device)
        chunks.append(torch.softmax(model((batch - mean) / std).double(), dim=1).cpu())
    if not chunks:
        return np.zeros((0, len(bundle.class_names)))
    return torch.cat(chunks).numpy()
