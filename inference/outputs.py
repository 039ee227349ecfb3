"""The output folder: checked before any work, and files put in place whole (temp + rename)."""
import csv
import io
import os
from pathlib import Path

from training.checkpoint.atomic import write_atomic
from training.errors import UsageError


def prepare_out_dir(out, names, overwrite=False):
    """Create `out`, refusing a file there or (without overwrite) any of `names` already in it."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; point it at a folder")
    taken = [name for name in names if (out / name).exists()]
    if taken and not overwrite:
        raise UsageError(f"--out {out} already holds {', '.join(taken)}; choose another folder or pass --overwrite")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {out} cannot be created ({exc.strerror})") from None
    if not os.access(out, os.W_OK):
        raise UsageError(f"--out {out} is not writable; choose another folder")
    return out


def write_csv(path, header, rows):
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    write_atomic(path, lambda partial: Path(partial).write_text(buffer.getvalue()))
