"""HAR models and the registry that builds them by name."""
from models.cnn1d import CNN1D
from models.cnn_lstm import CNNLSTM
from models.transformer import HARTransformer

MODELS = {"cnn1d": CNN1D, "cnn_lstm": CNNLSTM, "transformer": HARTransformer}
NORMS = ("batch", "group", "none")


def build_model(name, in_channels, num_classes, dropout=0.1, norm="batch"):
    """Build a model by registry name; every model maps [B, in_channels, T] to [B, num_classes]."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    if norm not in NORMS:
        raise ValueError(f"unknown norm {norm!r}; choose one of {', '.join(NORMS)}")
    return MODELS[name](in_channels, num_classes, dropout=dropout, norm=norm)


def count_parameters(model):
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
