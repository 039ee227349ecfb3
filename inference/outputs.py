"""The output folder: checked before any work, created just before the first file is written, and
files put in place whole (temp + rename)."""
import csv
import io
import os
from pathlib import Path

from data.errors import not_a_file
from data.store import write_atomic
from training.errors import UsageError
from training.output_folders import check_folder_can_be_made, check_writable

NAME_MAX = 255  # bytes of a file's name on Linux, macOS and Windows file systems


def check_out_dir(out, names, overwrite=False, reads=()):
    """Refuse, without creating anything, an `out` that is a file, lies under a file, cannot be written
    or created, would put one of `names` over a file the command `reads`, or (without overwrite)
    already holds one of `names`. Returns `out` as a Path."""
    out = _named(out, "--out")
    for name in names:
        _refuse_an_input(out / name, reads, f"--out {out}: its {name}")
        _refuse_other_than_a_file(out / name, f"--out {out}: its {name}")
    taken = [name for name in names if (out / name).exists()] if out.is_dir() else []
    if taken and not overwrite:
        raise UsageError(f"--out {out} already holds {', '.join(taken)}; choose another folder or pass --overwrite")
    check_folder_can_be_made(out, "--out")
    return out


def prepare_out_dir(out, names, overwrite=False):
    """check_out_dir, then create `out`: call it once the work is done and the files are about to be written."""
    out = check_out_dir(out, names, overwrite)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {out} cannot be created ({exc.strerror}); choose another folder") from None
    return out


def write_csv(path, header, rows):
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    write_atomic(path, lambda partial: Path(partial).write_text(buffer.getvalue()))


def check_out_file(out, overwrite, reads=(), flag="--out"):
    """Refuse, before any work, an output file (`flag`) that is a folder, is one of the files the
    command `reads`, exists (without overwrite), or cannot be written. Returns `out` as a Path."""
    if str(out).endswith(("/", os.sep)):  # Path drops the slash, and the file would take the folder's name
        raise UsageError(f"{flag} {out} names a folder; give the name of a file inside it")
    out = _named(out, flag)
    if out.is_dir():
        raise UsageError(f"{flag} {out} is a folder; give the name of a file inside it")
    _refuse_an_input(out, reads, f"{flag} {out}")
    _refuse_other_than_a_file(out, f"{flag} {out}")
    if (out.exists() or out.is_symlink()) and not overwrite:  # a link to nothing is still a name taken
        raise UsageError(f"{flag} {out} exists; choose another name or pass --overwrite")
    if not out.parent.is_dir():
        raise UsageError(f"{flag} {out}: folder {out.parent} does not exist; create it or choose another")
    check_writable(out.parent, f"{flag} {out}: folder {out.parent} is not writable")
    return out


def _named(out, flag):
    """`out` as a Path; an empty name (which Path reads as the current folder), or a name longer than
    file systems take, is refused."""
    if not str(out).strip():
        raise UsageError(f"{flag} is empty; name the output")
    name_bytes = len(Path(out).name.encode(errors="surrogateescape"))
    if name_bytes > NAME_MAX:
        raise UsageError(f"{flag}: the file's name is {name_bytes} bytes long and file systems take at most "
                         f"{NAME_MAX}; choose a shorter name")
    return Path(out)


def _refuse_other_than_a_file(path, what):
    """An output is put in place by a rename, which would replace whatever holds its name: only a
    regular file may be replaced, never a folder, a device (/dev/null), a pipe or a socket."""
    if path.exists() and not path.is_file():
        raise UsageError(f"{what} {not_a_file(path)}, which an output would replace; choose another name")


def _refuse_an_input(path, reads, what):
    """A command overwrites only its own outputs: never a file it was given to read, --overwrite or not."""
    if any(Path(path).resolve() == Path(read).resolve() for read in reads if read is not None):
        raise UsageError(f"{what} would be written over a file this command reads; write it under another name")
