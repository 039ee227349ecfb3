"""What a checkpoint must hold before its model is trusted to predict: the shapes it declares, finite
weights and normalisation, and in a fold ensemble members that are one model on the same windows.
Each problem is refused in one line naming the file, before a model is built from it, or where its
settings do not build that model or its weights do not fit it."""
import math

import torch

from data.errors import DataError
from models import MODELS
from training.checkpoint.format import nonfinite_tensor
from training.config.settings import RunConfig
from training.errors import UsageError

REWRITE = "train it again (python main.py), or point --checkpoint at another of the run's checkpoints"
REWRITE_ENSEMBLE = "write it again with python main.py --cv-folds K --ensemble"


def checked_layout(saved, path):
    """The Layout the checkpoint (a SavedRun) keeps of its data, read through Layout.from_json; a file whose
    layout is not one is refused in one line naming the field."""
    try:
        layout = saved.data_layout(f"checkpoint {path}")
    except DataError as exc:
        raise UsageError(f"{exc}; the file is damaged or not written by this trainer: {REWRITE}") from None
    if layout is None:
        raise UsageError(f"checkpoint {path} records no channel_names or class_names: {REWRITE}")
    return layout


def check_declared_shapes(saved, path):
    """in_channels and num_classes of `saved` (a SavedRun) are positive counts that the channel and class
    names match."""
    if not isinstance(saved.flags, dict):
        raise UsageError(f"checkpoint {path}: config is not a mapping of settings; {REWRITE}")
    layout = checked_layout(saved, path)
    for key, count, names, listed in (("in_channels", saved.in_channels, "channel_names", layout.channels),
                                      ("num_classes", saved.num_classes, "class_names", layout.class_names)):
        if not _is_count(count) or not isinstance(listed, (list, tuple)) or len(listed) != count \
                or not all(isinstance(name, str) for name in listed):
            raise UsageError(f"checkpoint {path}: {key} ({count!r}) and {names} ({_brief(listed)}) disagree; "
                             f"the file is damaged or not written by this trainer: {REWRITE}")
    if not _is_count(layout.window_steps):
        raise UsageError(f"checkpoint {path}: window_steps must be a positive whole number, got "
                         f"{layout.window_steps!r}; {REWRITE}")
    rate = layout.sample_rate_hz  # NaN: windows of no stated rate (an .npz without one)
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or math.isinf(rate) or rate <= 0:
        raise UsageError(f"checkpoint {path}: sample_rate_hz must be a positive number of samples a second (NaN "
                         f"where unknown), got {rate!r}; {REWRITE}")


def check_model_part(part, path, weights, member=None):
    """One model's description (`part`: a SavedRun of a checkpoint, or of its ensemble's `member`-th
    part) and the weights it predicts with: a known model, a state dict of finite tensors, and a finite
    positive normalisation of the right length."""
    what, fix = ("", REWRITE) if member is None else (f"member {member}'s ", REWRITE_ENSEMBLE)
    config = part.flags
    name = config.get("model") if isinstance(config, dict) else None
    if not isinstance(name, str) or name not in MODELS:
        raise UsageError(f"checkpoint {path}: {what}model {name!r} is not one of {', '.join(MODELS)}; {fix}")
    if not isinstance(weights, dict) or not weights:
        raise UsageError(f"checkpoint {path}: {what}weights are not a state dict of tensors; {fix}")
    bad = nonfinite_tensor(_real_tensors(weights, f"checkpoint {path}: {what}", fix))
    if bad is not None:
        raise UsageError(f"checkpoint {path}: {what}weight {bad!r} holds NaN or infinity (a run that diverged, "
                         f"or a damaged file); {fix}")
    normalization, channels = part.normalization, part.in_channels
    if not isinstance(normalization, dict) or not all(isinstance(normalization.get(key), torch.Tensor)
                                                      and normalization[key].is_floating_point()
                                                      for key in ("mean", "std")):
        raise UsageError(f"checkpoint {path}: {what}normalization must hold tensors mean and std of real numbers; "
                         f"{fix}")
    for key in ("mean", "std"):
        values = normalization[key]
        if tuple(values.shape) != (channels,):
            raise UsageError(f"checkpoint {path}: {what}normalization {key} has shape {list(values.shape)}, not "
                             f"[{channels}] (one per channel); {fix}")
        if nonfinite_tensor([(key, values)]) is not None:
            raise UsageError(f"checkpoint {path}: {what}normalization {key} holds NaN or infinity; {fix}")
    if not bool((normalization["std"] > 0).all()):
        raise UsageError(f"checkpoint {path}: {what}normalization std holds a value that is not positive; {fix}")


def _real_tensors(weights, where, fix):
    """(name, tensor) of `weights` one by one, refusing in one line, as it comes to it, an entry that is
    not a tensor of real numbers: nonfinite_tensor reads no further than the first non-finite one."""
    for key, tensor in weights.items():
        if not isinstance(tensor, torch.Tensor) or tensor.is_complex():
            raise UsageError(f"{where}weight {key!r} is not a tensor of real numbers; {fix}")
        yield key, tensor


def checked_model(part, weights, window_steps, path, member=None):
    """The network `part` (a SavedRun) describes (check_model_part first), its weights loaded; its
    settings must build it and its weights fit it."""
    check_model_part(part, path, weights, member)
    config, where = part.flags, path if member is None else f"{path} (member {member})"
    try:
        model = RunConfig.from_flags(config).model.build(part.in_channels, part.num_classes, window_steps)
    except (TypeError, ValueError, RuntimeError) as exc:  # settings edited by hand, or another tool's file
        raise UsageError(f"checkpoint {where}: its settings do not build a {config['model']} model "
                         f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}); use a checkpoint "
                         "written by training") from None
    try:
        model.load_state_dict(weights)
    except RuntimeError as exc:
        raise UsageError(f"checkpoint {where}: weights do not fit a {config['model']} model "
                         f"({str(exc).splitlines()[0]})") from None
    return model


def check_members(saved, path, member_keys):
    """An ensemble's members (`saved`: a SavedRun of it): a non-empty list of dicts with `member_keys`, one
    model on the ensemble's channels and classes (their weights: check_model_part)."""
    members = saved.members
    if not isinstance(members, list) or not members or not all(isinstance(member, dict) for member in members):
        raise UsageError(f"checkpoint {path}: members must be a non-empty list of models, got {_brief(members)}; "
                         f"{REWRITE_ENSEMBLE}")
    runs = saved.member_runs()
    for number, member in enumerate(runs, start=1):
        missing = member.missing(member_keys)
        if missing:
            raise UsageError(f"checkpoint {path}: member {number} lacks {', '.join(missing)}; {REWRITE_ENSEMBLE}")
        for key, value, shared in (("in_channels", member.in_channels, saved.in_channels),
                                   ("num_classes", member.num_classes, saved.num_classes)):
            if value != shared:
                raise UsageError(f"checkpoint {path}: member {number} has {key} {value!r}, the ensemble "
                                 f"{shared!r}; an ensemble's members must share their windows and classes: "
                                 f"{REWRITE_ENSEMBLE}")
    mixed = other_model([member.flags for member in runs])
    if mixed:
        raise UsageError(f"checkpoint {path}: {mixed}: {REWRITE_ENSEMBLE}")


def other_model(configs):
    """The rule that an ensemble's members are one model: "" where the flat configs share their
    model, else which member differs (counted from 1) and how."""
    models = [config.get("model") if isinstance(config, dict) else None for config in configs]
    for number, model in enumerate(models, start=1):
        if model != models[0]:
            return (f"member {number} is a {model} model, member 1 a {models[0]}; an ensemble's members must be "
                    "one model")
    return ""


def _is_count(value):
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _brief(value):
    text = repr(value)
    return text if len(text) <= 60 else f"{type(value).__name__} of {len(value)}" if hasattr(value, "__len__") \
        else type(value).__name__
