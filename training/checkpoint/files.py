"""Writing and reading checkpoints: plain tensors and containers only, written atomically."""
import os
import pickle
import re
import shutil
import struct
import warnings
import zipfile
from pathlib import Path

import torch

from outputs.safety import check_output_folder, make_folder, write_atomic
from training import faults
from training.checkpoint.format import SavedRun, nonfinite_tensor
from training.errors import UsageError

LAST = "last.pt"
BEST = "best.pt"
NUMBERED = re.compile(r"step-(\d+)\.pt")


def save_checkpoint(state, path):
    """Write to a temporary file in the same folder, fsync, then rename over `path` (write_atomic).

    A crash mid-write leaves the previous file whole: rename within a folder is atomic.
    """
    def write(partial):
        with open(partial, "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        faults.during_save()
    write_atomic(path, write)


def save_run_checkpoint(state, save_dir, keep_last, is_best):
    """last.pt, plus step-XXXXXXXX.pt (the newest `keep_last` kept) and best.pt when `is_best`.

    Each extra name is a whole copy of last.pt, not a hard link: a link shares one inode, so a
    tool that truncates or overwrites one name in place would damage every fallback with it. Each
    copy is written to a temporary name, fsynced and renamed into place like last.pt itself
    (docs/resuming.md weighs the disk and time this costs)."""
    save_dir = Path(save_dir)
    last = save_dir / LAST
    save_checkpoint(state, last)
    if keep_last > 0:
        place_copy(last, save_dir / f"step-{SavedRun(state).step:08d}.pt")
        for old in numbered_checkpoints(save_dir)[keep_last:]:
            old.unlink(missing_ok=True)
    if is_best:
        place_copy(last, save_dir / BEST)
    _fsync_folder(save_dir)  # the renames themselves survive a power cut


def inference_weights(checkpoint):
    """SavedRun.inference_weights of a loaded checkpoint dict, for a reader that holds the dict."""
    return SavedRun(checkpoint).inference_weights()


def numbered_checkpoints(save_dir):
    """step-XXXXXXXX.pt files in `save_dir`, newest step first."""
    found = [(int(match.group(1)), path) for path in Path(save_dir).glob("step-*.pt")
             if (match := NUMBERED.fullmatch(path.name))]
    return [path for _, path in sorted(found, reverse=True)]


def place_copy(source, target):
    """A copy of `source` under `target`'s name, whole or not at all (write_atomic, fsynced before the rename)."""
    def write(partial):
        shutil.copyfile(source, partial)  # in the kernel where it can (sendfile), no pass through Python
        with open(partial, "rb+") as handle:
            os.fsync(handle.fileno())
    write_atomic(target, write)


def _fsync_folder(folder):
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:  # a filesystem that cannot open folders: the renames are still atomic
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def check_save_dir(save_dir):
    """Create the output folder, or say in one line why it cannot be used. Returns the outermost folder
    this made (None where the folder was there): a run refused before it wrote anything removes it."""
    # A checkpoint goes in place by a rename, which cannot replace a folder.
    check_output_folder(save_dir, "--save-dir", files=(LAST, BEST), writer="the run")
    created = next((path for path in [*reversed(save_dir.parents), save_dir] if not path.exists()), None)
    make_folder(save_dir, "--save-dir")
    return created


def remove_empty_folders(save_dir, created):
    """Remove `save_dir` and its parents up to `created` (what check_save_dir made) while they are
    empty: a run that stopped before writing anything leaves no folder behind."""
    if created is None:
        return
    path = save_dir
    while True:
        try:
            path.rmdir()  # only an empty folder
        except OSError:
            return
        if path == created:
            return
        path = path.parent


def remove_partial_saves(save_dir):
    """Remove what a process killed mid-write left in the folder check_save_dir made; only with the
    folder's lock held, since a running save's file looks just the same."""
    try:
        for partial in save_dir.glob(".*.tmp.pt"):
            partial.unlink()
    except OSError as exc:
        raise UsageError(f"--save-dir {save_dir} is not writable ({exc.strerror}); choose another folder") from None


class UnreadableCheckpoint(UsageError):
    """A truncated or corrupt file: an older checkpoint can stand in for it."""


def load_checkpoint(path):
    """Load with weights_only=True: tensors and plain containers, never arbitrary objects."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"--resume {path} is a folder; point it at a checkpoint file such as {path / LAST}")
    if not path.is_file():
        raise UsageError(f"checkpoint {path} does not exist; check --resume, or use --no-resume")
    try:
        with warnings.catch_warnings():  # torch warns of a plain pickle's protocol before refusing it below
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        # torch reports both a forbidden object and a damaged file this way; only the first names a GLOBAL.
        forbidden = [line.strip() for line in str(exc).splitlines() if "GLOBAL" in line]
        if forbidden:
            raise UsageError(f"checkpoint {path} holds objects other than tensors and plain data and was "
                             f"not loaded ({forbidden[0]}); only load checkpoints this trainer wrote") from None
        if "Unsupported operand" in str(exc):  # random bytes, or a pickle of a protocol torch.save does not write
            raise UnreadableCheckpoint(f"checkpoint {path} is unreadable or truncated, or a pickle torch.save did "
                                       "not write (not a checkpoint file); only load checkpoints this trainer "
                                       "wrote") from None
        raise UnreadableCheckpoint(f"checkpoint {path} is unreadable or truncated (not a complete "
                                   "checkpoint file)") from None
    except (KeyError, IndexError, struct.error):
        # A few bytes of text, read as a legacy pickle, fail inside the unpickler with these.
        raise UnreadableCheckpoint(f"checkpoint {path} is unreadable or truncated (not a checkpoint file)") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as exc:
        if "TorchScript" in str(exc):  # torch's own line would advise loading it with weights_only=False
            raise UnreadableCheckpoint(f"{path} is a TorchScript model (export.py's), not a checkpoint; give the "
                                       "best.pt or last.pt that training wrote") from None
        raise UnreadableCheckpoint(f"checkpoint {path} is unreadable or truncated ({_first_line(exc)})") from None


def _first_line(exc):
    return str(exc).splitlines()[0] if str(exc).strip() else type(exc).__name__


class NonFiniteCheckpoint(UnreadableCheckpoint):
    """Weights or optimizer state with NaN/inf: training on from them would only spread them."""


def load_resumable(path):
    """load_checkpoint, and refuse a trainer checkpoint whose weights, weight average or optimizer
    moments hold NaN or inf (a file of another kind is left for judge.py to name)."""
    checkpoint = load_checkpoint(path)
    saved = SavedRun.of(checkpoint)
    bad = nonfinite_tensor(saved.trained_tensors()) if saved is not None else None
    if bad is not None:
        raise NonFiniteCheckpoint(f"checkpoint {path} holds NaN/inf values ({bad})")
    return checkpoint


def load_resume_checkpoint(resume, save_dir, warn):
    """(path, checkpoint) to resume from, or (None, None) for a fresh run.

    --resume PATH must load and be finite. With --resume auto the newest usable checkpoint is
    taken: last.pt, else the newest numbered one or best.pt, whichever is further on; each file
    passed over is reported in one line, and so is the fallback: a file cut short by a kill, or
    truncated afterwards, never stops a requeued job from continuing."""
    if resume is None:
        return None, None
    if resume != "auto":
        try:
            return Path(resume), load_resumable(resume)
        except NonFiniteCheckpoint as exc:
            raise UsageError(f"{exc}; point --resume at an earlier checkpoint, or use --no-resume") from None
    save_dir = Path(save_dir)
    candidates = [path for path in (save_dir / LAST, *numbered_checkpoints(save_dir), save_dir / BEST)
                  if path.is_file()]
    if not candidates:
        return None, None
    skipped, found = [], None
    for path in candidates:
        # Past last.pt, look on only to compare the first usable numbered file with best.pt,
        # which may have been saved later than every numbered file that is left.
        if found is not None and (found[0].name == LAST or path.name != BEST):
            continue
        try:
            checkpoint = load_resumable(path)
        except UnreadableCheckpoint as exc:
            warn(str(exc))
            skipped.append(path.name)
            continue
        if found is None or _progress(checkpoint) > _progress(found[1]):
            found = (path, checkpoint)
    if found is None:
        raise UsageError(f"no readable checkpoint with finite weights in {save_dir} (tried {', '.join(skipped)}); "
                         "use --no-resume to start over, or --resume PATH")
    if skipped:
        warn(f"falling back to {found[0].name} (step {_progress(found[1])}), the newest checkpoint in {save_dir} "
             "that loads with finite weights")
    return found


def saved_progress(path):
    """(epoch, step, samples into the epoch) of the checkpoint at `path`, or None where there is none that
    loads. Mapped, not read: a launcher asks this of a file it did not write."""
    try:
        return SavedRun(torch.load(path, map_location="cpu", weights_only=True, mmap=True)).progress()
    except Exception:  # absent, partial, foreign: the launcher then says nothing was saved
        return None


def _progress(checkpoint):
    saved = SavedRun.of(checkpoint)
    return saved.step if saved is not None else -1
