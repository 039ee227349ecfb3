"""Label-preserving augmentation of inertial windows, done on whole batches on the device.

Every draw comes from torch's global generator of the batch's device, which the trainer seeds
per (seed, epoch, rank) and saves in checkpoints: runs are reproducible, resume exactly, and
DDP ranks draw differently from each other. Nothing here reads a value back to the host.
"""
import math
from dataclasses import dataclass

import torch

from data.layout import named_triples

AUGMENTATIONS = ("rotate", "flip", "scale", "jitter", "shift")


@dataclass
class AugmentConfig:
    kinds: tuple = AUGMENTATIONS  # which of AUGMENTATIONS to apply, in that order
    rotate_deg: float = 10.0  # rotation angle about a random axis, uniform in +-rotate_deg
    # rotate: the windows of these classes (any case) turn by up to rotate_wide_deg instead; () none.
    # How a phone sits on the waist differs between people by up to about 20 degrees, and while
    # the tilt tells postures apart, it should not be what tells walking from walking upstairs.
    rotate_wide_classes: tuple = ()
    rotate_wide_deg: float = 45.0
    scale: float = 0.1  # amplitude factor uniform in 1 +- scale, one per window
    jitter: float = 0.02  # Gaussian noise, in units of each channel's standard deviation
    shift_steps: int = 8  # circular time shift, uniform in +-shift_steps samples
    # flip: half the windows turned half a turn about the x axis (y and z change sign), as if the
    # phone faced the other way or the person lay face down; flip_classes names the classes whose
    # windows it may turn (any case), () every class.
    flip_classes: tuple = ()


def parse_kinds(text):
    """'rotate,scale' -> ('rotate', 'scale'); 'none' or '' -> (); raises ValueError on a typo."""
    kinds = tuple(part.strip() for part in text.split(",") if part.strip() and part.strip() != "none")
    unknown = [kind for kind in kinds if kind not in AUGMENTATIONS]
    if unknown:
        raise ValueError(f"unknown augmentation {unknown[0]!r}; choose from {', '.join(AUGMENTATIONS)} or none")
    return tuple(kind for kind in AUGMENTATIONS if kind in kinds)


class BatchAugmenter:
    """Applies the configured augmentations to normalised batches [B, C, T].

    Rotation is physical: it acts on the raw x/y/z of each sensor (the batch is de-normalised
    with the training statistics, rotated, and normalised again), and all sensors of a window
    turn together, as they would when the phone sits differently on another person. Small
    angles keep gravity's direction, which separates the postures, meaningful; the classes of
    rotate_wide_classes turn further, so that the tilt stops deciding between them.
    """

    def __init__(self, config, mean, std, channel_names, class_names=(), triples=None):
        self.config = config
        # Each sensor's x/y/z channels: as a dataset description places them, else by the names' _x/_y/_z.
        self.triples = torch.tensor(named_triples(channel_names) if triples is None else triples, dtype=torch.long)
        turning = [kind for kind in ("rotate", "flip") if kind in config.kinds]
        if turning and len(self.triples) == 0:
            raise ValueError(f"{turning[0]} needs x/y/z channel triples; these channels have none "
                             f"({', '.join(channel_names)}): leave it out of --augment")
        # [classes] bool: the labels whose windows flip may turn; None: every window.
        limited = "flip" in config.kinds and config.flip_classes
        self.flippable = class_mask(config.flip_classes, class_names) if limited else None
        # [classes] bool: the labels whose windows rotate turns by up to rotate_wide_deg; None: no class.
        widened = "rotate" in config.kinds and config.rotate_wide_classes
        self.widely_turned = class_mask(config.rotate_wide_classes, class_names) if widened else None
        self.mean = torch.as_tensor(mean, dtype=torch.float32).reshape(1, -1, 1)
        self.std = torch.as_tensor(std, dtype=torch.float32).reshape(1, -1, 1)

    def to(self, device):
        for name in ("triples", "mean", "std", "flippable", "widely_turned"):
            if getattr(self, name) is not None:
                setattr(self, name, getattr(self, name).to(device))
        return self

    def __call__(self, signals, labels=None):
        """Augmented copies of `signals`; `labels` [B] are needed when flip or the wide rotation is
        limited to some classes."""
        kinds = self.config.kinds
        if "rotate" in kinds or "flip" in kinds or "scale" in kinds:
            # Rotation and gain act on the raw units (gravity included), not on normalised ones.
            raw = signals * self.std + self.mean
            if "rotate" in kinds:
                raw = self._rotate(raw, labels)
            if "flip" in kinds:
                raw = self._flip(raw, labels)
            if "scale" in kinds:
                raw = self._scale(raw)
            signals = (raw - self.mean) / self.std
        if "jitter" in kinds:
            signals = signals + self.config.jitter * torch.randn_like(signals)
        if "shift" in kinds:
            signals = self._shift(signals)
        return signals

    def _rotate(self, raw, labels):
        batch = raw.shape[0]
        limit = math.radians(self.config.rotate_deg)
        if self.widely_turned is not None:
            wide = self.widely_turned[labels].reshape(-1, 1, 1)
            limit = torch.where(wide, math.radians(self.config.rotate_wide_deg), limit).to(raw.dtype)
        rotation = random_rotations(batch, limit, raw.device)
        grouped = raw[:, self.triples]  # [B, sensors, 3, T]
        turned = torch.einsum("bij,bsjt->bsit", rotation, grouped)
        return raw.index_copy(1, self.triples.reshape(-1), turned.reshape(batch, -1, raw.shape[-1]))

    def _flip(self, raw, labels):
        # Half a turn about x, a proper rotation: a phone worn facing in or out, or a person lying
        # face down where the training people lay face up, sees gravity's y and z reversed.
        batch = raw.shape[0]
        sign = 1 - 2 * torch.randint(0, 2, (batch, 1, 1), device=raw.device, dtype=raw.dtype)
        if self.flippable is not None:
            # Drawn for every window first, so that the random stream does not depend on the labels.
            sign = torch.where(self.flippable[labels].reshape(-1, 1, 1), sign, 1.0)
        turned = self.triples[:, 1:].reshape(-1)  # every sensor's y and z
        return raw.index_copy(1, turned, raw[:, turned] * sign)

    def _scale(self, raw):
        # One gain per window: sensors differ in sensitivity and people in how hard they move.
        factor = 1 + self.config.scale * (2 * torch.rand(raw.shape[0], 1, 1, device=raw.device) - 1)
        return raw * factor

    def _shift(self, signals):
        batch, _, steps = signals.shape
        limit = self.config.shift_steps
        shifts = torch.randint(-limit, limit + 1, (batch, 1, 1), device=signals.device)
        index = (torch.arange(steps, device=signals.device).reshape(1, 1, -1) - shifts) % steps
        return signals.gather(2, index.expand_as(signals))


def class_mask(names, class_names):
    """[len(class_names)] bool, True for the classes named (case aside); ValueError for a name the
    data does not have."""
    known, wanted = [name.upper() for name in class_names], {name.upper() for name in names}
    missing = [name for name in names if name.upper() not in known]
    if missing:
        raise ValueError(f"no class {missing[0]!r} in this data (its classes: {', '.join(class_names)})")
    return torch.tensor([name in wanted for name in known])


def random_rotations(batch, max_angle_rad, device):
    """[batch, 3, 3] rotations about uniformly random axes by angles uniform in +-max_angle_rad, a
    number or a [batch, 1, 1] tensor of one limit per window (Rodrigues' formula, all on the device)."""
    axis = torch.nn.functional.normalize(torch.randn(batch, 3, device=device), dim=1)
    angle = max_angle_rad * (2 * torch.rand(batch, 1, 1, device=device) - 1)
    x, y, z = axis.unbind(1)
    zero = torch.zeros_like(x)
    cross = torch.stack([zero, -z, y, z, zero, -x, -y, x, zero], dim=1).reshape(batch, 3, 3)
    eye = torch.eye(3, device=device).expand(batch, 3, 3)
    return eye + torch.sin(angle) * cross + (1 - torch.cos(angle)) * (cross @ cross)
