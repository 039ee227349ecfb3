"""May this command write here, and what may it replace: the one answer for every command that writes
(training's --save-dir, predict's and evaluate's --out, export's file, the store converter's --out,
cross-validation's folders), and the one way a file is put in place (write_atomic).

Every check runs before any work and creates nothing: a file in the way of a folder, a folder or a
device where a file goes, a name a file system cannot take, a folder that cannot be written, an
output over one of the command's own inputs. What a folder must hold to be a command's own (a
store's records, a cross-validation's folds) is the command's to say; these checks are the part
every command shares. The package sits below every other (it imports none of them), so its refusal is its own: an
OutputRefused, which the training entry points and the data commands print as one line, exit 2."""
import csv
import io
import os
import tempfile
from pathlib import Path

NAME_MAX = 255  # bytes of a file's name on Linux, macOS and Windows file systems
PARTIAL_STEM_BYTES = 200  # of a name write_atomic writes under: 255 less the dot, pid, .tmp and suffix


class OutputRefused(ValueError):
    """A command may not write where it was asked to; the message says why and what to do."""


def not_a_file(path):
    """Why `path`, which should name a file, does not: for the one line that refuses it."""
    path = Path(path)
    if path.is_dir():
        return "is a folder"
    return "is not a regular file (a device, pipe or socket)" if path.exists() else "does not exist"


def write_atomic(path, write):
    """write(partial_path) fills a temporary file in the same folder that then replaces `path` in one
    rename: a reader sees the old file or the whole new one, never a part."""
    path = Path(path)
    # The suffix stays last so that writers choosing a format by extension (matplotlib, np.save) still can;
    # the stem is cut so that a name the file system takes still does with the marks around it.
    stem = path.stem.encode(errors="surrogateescape")[:PARTIAL_STEM_BYTES].decode(errors="ignore")
    partial = path.with_name(f".{stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        write(partial)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def is_partial_write(name):
    """Whether a file name is one write_atomic was writing under when it was stopped: '.<name>.<pid>.tmp<suffix>'."""
    return name.startswith(".") and ".tmp" in name


def write_csv(path, header, rows):
    """A table put in place whole."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    write_atomic(path, lambda partial: Path(partial).write_text(buffer.getvalue()))


def check_output_folder(folder, flag, files=(), folders=(), reads=(), writer="the command"):
    """Refuse, without creating anything, a `folder` (given as `flag`) that is a file, lies under a
    file, or cannot be written or created; or that holds, where `writer` puts one of `files`, anything
    but a regular file (a rename would replace it), or where it keeps one of `folders`, a file; or
    where one of `files` is a file the command `reads`. Returns `folder` as a Path."""
    folder = _named(folder, flag)
    if folder.exists() and not folder.is_dir():
        raise OutputRefused(f"{flag} {folder} is a file; point it at a folder")
    for name in files:
        _refuse_an_input(folder / name, reads, f"{flag} {folder}: its {name}")
        if (folder / name).exists() and not (folder / name).is_file():
            raise OutputRefused(f"{flag} {folder}: its {name} {not_a_file(folder / name)}, where {writer} writes a "
                                f"file; move it away or choose another {flag}")
    for name in folders:
        if (folder / name).exists() and not (folder / name).is_dir():
            raise OutputRefused(f"{flag} {folder}: its {name} is a file, where {writer} keeps a folder; move it "
                                f"away or choose another {flag}")
    if folder.is_dir():
        _check_writable(folder, f"{flag} {folder} is not writable")
        return folder
    existing = next(parent for parent in folder.absolute().parents if parent.exists())
    if not existing.is_dir():
        raise OutputRefused(f"{flag} {folder} cannot be created: {existing} is a file, not a folder")
    _check_writable(existing, f"{flag} {folder} cannot be created in {existing}")
    return folder


def check_out_dir(out, names, overwrite=False, reads=()):
    """check_output_folder for an --out that receives the files `names`, which (without overwrite) it
    must not hold already. Returns `out` as a Path."""
    out = check_output_folder(out, "--out", files=names, reads=reads)
    taken = [name for name in names if (out / name).exists()] if out.is_dir() else []
    if taken and not overwrite:
        raise OutputRefused(f"--out {out} already holds {', '.join(taken)}; choose another folder or pass --overwrite")
    return out


def prepare_out_dir(out, names, overwrite=False):
    """check_out_dir, then create `out`: call it once the work is done and the files are about to be written."""
    out = check_out_dir(out, names, overwrite)
    make_folder(out, "--out")
    return out


def make_folder(folder, flag):
    """Create `folder` and its parents, or say in one line why not."""
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputRefused(f"{flag} {folder} cannot be created ({exc.strerror}); choose another folder") from None


def check_out_file(out, overwrite, reads=(), flag="--out"):
    """Refuse, before any work, an output file (`flag`) that is a folder, is one of the files the
    command `reads`, exists (without overwrite), or cannot be written. Returns `out` as a Path."""
    if str(out).endswith(("/", os.sep)):  # Path drops the slash, and the file would take the folder's name
        raise OutputRefused(f"{flag} {out} names a folder; give the name of a file inside it")
    out = _named(out, flag)
    if out.is_dir():
        raise OutputRefused(f"{flag} {out} is a folder; give the name of a file inside it")
    _refuse_an_input(out, reads, f"{flag} {out}")
    _refuse_other_than_a_file(out, f"{flag} {out}")
    if (out.exists() or out.is_symlink()) and not overwrite:  # a link to nothing is still a name taken
        raise OutputRefused(f"{flag} {out} exists; choose another name or pass --overwrite")
    if not out.parent.is_dir():
        raise OutputRefused(f"{flag} {out}: folder {out.parent} does not exist; create it or choose another")
    _check_writable(out.parent, f"{flag} {out}: folder {out.parent} is not writable")
    return out


def _check_writable(folder, problem):
    """Make and remove a folder in `folder`: the one test that also holds for root, ACLs and read-only
    mounts; refused as `problem`."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".write-test.", dir=folder))
    except OSError as exc:
        raise OutputRefused(f"{problem} ({exc.strerror}); choose another folder") from None


def _named(out, flag):
    """`out` as a Path; an empty name (which Path reads as the current folder), or a name longer than
    file systems take, is refused."""
    if not str(out).strip():
        raise OutputRefused(f"{flag} is empty; name the output")
    name_bytes = len(Path(out).name.encode(errors="surrogateescape"))
    if name_bytes > NAME_MAX:
        raise OutputRefused(f"{flag}: the file's name is {name_bytes} bytes long and file systems take at most "
                            f"{NAME_MAX}; choose a shorter name")
    return Path(out)


def _refuse_other_than_a_file(path, what):
    """An output is put in place by a rename, which would replace whatever holds its name: only a
    regular file may be replaced, never a folder, a device (/dev/null), a pipe or a socket."""
    if path.exists() and not path.is_file():
        raise OutputRefused(f"{what} {not_a_file(path)}, which an output would replace; choose another name")


def _refuse_an_input(path, reads, what):
    """A command overwrites only its own outputs: never a file it was given to read, --overwrite or not."""
    if any(Path(path).resolve() == Path(read).resolve() for read in reads if read is not None):
        raise OutputRefused(f"{what} would be written over a file this command reads; write it under another name")
