"""Folders a command writes its outputs into (predict's --out, the profiler's --output-dir), refused in
one line before any work: a file in the way, or no right to write there."""
import os
import tempfile
from pathlib import Path

from training.errors import UsageError


def check_folder_can_be_made(folder, flag):
    """Refuse, without creating anything, a `folder` that is a file, lies under a file, or cannot be
    written or created."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{flag} {folder} is a file; point it at a folder")
    if folder.is_dir():
        check_writable(folder, f"{flag} {folder} is not writable")
        return
    existing = next(parent for parent in folder.absolute().parents if parent.exists())
    if not existing.is_dir():
        raise UsageError(f"{flag} {folder} cannot be created: {existing} is a file, not a folder")
    check_writable(existing, f"{flag} {folder} cannot be created in {existing}")


def check_writable(folder, problem):
    """Make and remove a folder in `folder`: the one test that also holds for root, ACLs and read-only
    mounts; refused as `problem`."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".write-test.", dir=folder))
    except OSError as exc:
        raise UsageError(f"{problem} ({exc.strerror}); choose another folder") from None
