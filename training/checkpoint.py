"""Writing and reading checkpoints: plain tensors and containers only, written atomically."""
import os
import pickle
import zipfile
from pathlib import Path

import torch

from training.errors import UsageError

LAST = "last.pt"
BEST = "best.pt"
REQUIRED_KEYS = ("model", "optimizer", "scaler", "epoch", "step", "best_metric", "config", "normalization",
                 "global_batch_size", "in_channels", "num_classes")


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


def prepare_save_dir(save_dir):
    """Create the output folder, or say in one line why it cannot be used."""
    if save_dir.exists() and not save_dir.is_dir():
        raise UsageError(f"--save-dir {save_dir} is a file; point it at a folder")
    try:
        save_dir.mkdir(parents=True, exist_ok=True)
        probe = save_dir / ".write-test"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"--save-dir {save_dir} is not writable ({exc.strerror}); choose another folder") from None


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


def check_compatible(checkpoint, wanted, path):
    """Refuse, in one line, a checkpoint made for another model, norm or channel layout.

    `wanted` maps model, norm, mode, in_channels and num_classes to this run's values."""
    missing = [key for key in REQUIRED_KEYS if key not in checkpoint] if isinstance(checkpoint, dict) else ["all"]
    if missing:
        raise UsageError(f"{path} is not a checkpoint of this trainer (missing: {', '.join(missing)}); "
                         "point --resume at a last.pt or best.pt it wrote")
    config = checkpoint["config"]
    found = {"model": config.get("model"), "norm": config.get("norm"), "mode": config.get("mode"),
             "in_channels": checkpoint.get("in_channels"), "num_classes": checkpoint.get("num_classes")}
    differ = [f"{key} {found[key]} (this run: {wanted[key]})" for key in wanted if found[key] != wanted[key]]
    if differ:
        raise UsageError(f"checkpoint {path} was made with {', '.join(differ)}; match the flags, "
                         "or use --no-resume / another --save-dir")
