"""HAR models and the registry that builds them by name."""
import torch

from models.cnn1d import CNN1D
from models.cnn_lstm import CNNLSTM
from models.minirocket import MiniRocket
from models.transformer import HARTransformer

MODELS = {"cnn1d": CNN1D, "cnn_lstm": CNNLSTM, "transformer": HARTransformer, "minirocket": MiniRocket}
NORMS = ("batch", "group", "none")
SIZE_KNOBS = ("width", "depth", "heads", "ffn")  # each model says which it takes in SIZES (models/contract.py)


def build_model(name, in_channels, num_classes, dropout=None, norm="batch", window_steps=128, **size):
    """Build a model by registry name; every model maps [B, in_channels, T] to [B, num_classes].

    `size` holds width, depth, heads and ffn where given (None or absent: the model's default);
    `window_steps` reaches the models whose layout depends on T (MiniRocket's dilations); `dropout`
    None takes the model's own DROPOUT."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    if norm not in NORMS:
        raise ValueError(f"unknown norm {norm!r}; choose one of {', '.join(NORMS)}")
    model = MODELS[name]
    shape = {"window_steps": window_steps} if model.TAKES_WINDOW_STEPS else {}
    dropout = model.DROPOUT if dropout is None else dropout
    return model(in_channels, num_classes, dropout=dropout, norm=norm, **shape, **resolve_size(name, **size))


def has_fixed_features(name):
    """Whether the model's features are fixed (not learnt), so that a pool of them can be computed once."""
    return MODELS[name].FIXED_FEATURES


def feature_views_of(name, given=None):
    """--feature-views where given, else the model's own FEATURE_VIEWS."""
    return MODELS[name].FEATURE_VIEWS if given is None else given


def label_smoothing_of(name, given=None):
    """--label-smoothing where given, else the model's own LABEL_SMOOTHING."""
    return MODELS[name].LABEL_SMOOTHING if given is None else given


def resolve_size(name, **size):
    """The model's size knobs with defaults filled in; ValueError for one it does not have or a
    combination that cannot be built."""
    model = MODELS[name]
    given = {knob: value for knob, value in size.items() if value is not None}
    unknown = [knob for knob in given if knob not in model.SIZES]
    if unknown:
        takes = ", ".join(f"--{knob}" for knob in model.SIZES) or "no size flags"
        raise ValueError(f"--{unknown[0]} does not apply to --model {name}, which takes {takes}")
    if any(value < 1 for value in given.values()):
        raise ValueError(f"model sizes must be at least 1, got {given}")
    return model.resolve_size(**given)


def count_parameters(model):
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def training_bytes(name, in_channels, num_classes, window_steps=128, **size):
    """Bytes a model of these sizes holds while it trains: its parameters and buffers, and for each
    trained parameter its gradient and AdamW's two moments. Built on the meta device, so nothing of
    that size is allocated."""
    with torch.device("meta"):
        model = build_model(name, in_channels, num_classes, window_steps=window_steps, **size)
    held = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    trained = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return held + 3 * trained
