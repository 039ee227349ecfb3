"""Writing and reading checkpoints: plain tensors and containers only, written atomically."""
import os
import pickle
import zipfile
from pathlib import Path

import torch

from training.errors import UsageError

LAST = "last.pt"
BEST = "best.pt"


def save_checkpoint(state, path):
    """Write to a temporary file in the same folder, fsync, then rename over `path`.

    A crash mid-write leaves the previous file whole: rename within a folder is atomic.
    """
    path = Path(path)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(partial, "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(partial, path)
    finally:
        if partial.exists():
            partial.unlink()


def load_checkpoint(path):
    """Load with weights_only=True: tensors and plain containers, never arbitrary objects."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"checkpoint {path} does not exist; check --resume, or use --no-resume")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise UsageError(f"checkpoint {path} holds objects other than tensors and plain data and was "
                         f"not loaded ({str(exc).splitlines()[0]})") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError) as exc:
        raise UsageError(f"checkpoint {path} is unreadable or truncated "
                         f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None


def resume_path(resume, save_dir):
    """The checkpoint to resume from: None (fresh run), <save-dir>/last.pt, or a given path."""
    if resume is None:
        return None
    if resume == "auto":
        last = Path(save_dir) / LAST
        return last if last.is_file() else None
    return Path(resume)


def check_compatible(checkpoint, model_name, in_channels, num_classes, mode, path):
    """Refuse, in one line, a checkpoint made for another model or channel layout."""
    config = checkpoint.get("config", {})
    found = (config.get("model"), checkpoint.get("in_channels"), checkpoint.get("num_classes"), config.get("mode"))
    wanted = (model_name, in_channels, num_classes, mode)
    if found != wanted:
        raise UsageError(f"checkpoint {path} is for model={found[0]} with {found[1]} channels "
                         f"(--mode {found[3]}), {found[2]} classes; this run asks for model={model_name} "
                         f"with {in_channels} channels (--mode {mode}), {num_classes} classes. "
                         "Match the flags, or use --no-resume / another --save-dir")
