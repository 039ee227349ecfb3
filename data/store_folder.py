"""The folder a store is built in (python -m data.build_store --out): which folders a build may write
in, the record that makes a folder a store's from a build's first write, and taking back what a
refused build wrote there.

A folder is a store's only by the store's own records: a finished store's manifest.json, or the
build record (data/store.py's BUILD_RECORD) that the converter writes before anything else in a
folder it created or found empty. Any other folder that is not empty is refused and left as it is,
whatever it holds: a labels.npy and an empty shards/ of the user's own are not a build cut short."""
import json
import re
import shutil
from pathlib import Path

from data.errors import DataError
from data.provenance import read_json
from data.store import (
    BUILD_RECORD,
    FORMAT,
    LABELS,
    MANIFEST,
    PARTS,
    SHARD_DIR,
    VERSION,
    manifest_layout,
)
from outputs.safety import check_output_folder, is_partial_write, write_atomic

JOB_FILE = re.compile(rf"(.*)\.json|(.*)-[^-]*\.(?:{'|'.join(PARTS)})\.npy", re.DOTALL)
# What makes a store's windows what they are: a finished store asked for other values of these (or of its
# layout's fields) is refused.
STORE_SETTINGS = ("label_rule", "dtype", "description")


def check_store_folder(out):
    """--out must be a new folder, an empty one, or a store's own (a build resumes there): never a file,
    and never a folder of other things, such as a training run, which the store's files would be mixed
    into or written over."""
    out = check_output_folder(out, "--out", files=(MANIFEST, LABELS, BUILD_RECORD), folders=(SHARD_DIR,),
                              writer="the converter")
    if out.is_dir() and any(out.iterdir()) and not holds_a_store(out):
        raise DataError(f"--out {out} holds other files and no store (neither a store's {MANIFEST} nor the "
                        f"{BUILD_RECORD} a build writes first); give a new or empty folder: nothing was changed")
    return out


def check_same_store(out, asked):
    """A finished store is data a run may have trained on: a build asking for other windows of it (another
    dtype, rate, window, stride, preprocessing or classes), or the windows of another source (another
    folder or file), is refused rather than converted over it. Only the source's recordings may change:
    one added or removed updates the same store."""
    finished = read_json(out / MANIFEST)
    if not isinstance(finished, dict):
        return
    # Without its manifest the folder stays a store's only by its build record (one from before has none).
    in_place = (f"remove {out / MANIFEST} to convert" if (out / BUILD_RECORD).is_file() else
                f"remove {out} to convert afresh")
    if finished.get("source_path", asked["source_path"]) != asked["source_path"]:
        # Another source is another dataset, not this one with recordings added or removed.
        raise DataError(f"--out {out} holds a finished store built from {finished['source_path']}, not "
                        f"{asked['source_path']}; give another --out, or {in_place} this source there in its place")
    then = {**manifest_layout(finished, out).as_json(), **{key: finished.get(key) for key in STORE_SETTINGS}}
    now = {**asked["layout"], **{key: asked.get(key) for key in STORE_SETTINGS}}
    differ = [key for key in dict.fromkeys([*then, *now]) if then.get(key) != now.get(key)]
    if differ:
        key = differ[0]
        raise DataError(f"--out {out} holds a finished store whose {key} is {then.get(key)!r}, not this build's "
                        f"{now.get(key)!r}; give another --out, or {in_place} it in place")


def holds_a_store(out):
    """Whether a folder is a store's by its own records: finished (a manifest of the store's format),
    or begun by a build (its build record) and holding nothing but what a build writes (shards/ of job
    records and shard files, labels.npy, and what a write cut short leaves)."""
    if (out / MANIFEST).exists():
        finished = read_json(out / MANIFEST)
        return isinstance(finished, dict) and finished.get("format") == FORMAT
    record = read_json(out / BUILD_RECORD)
    if not (isinstance(record, dict) and record.get("format") == FORMAT):
        return False
    if any(path.name not in (SHARD_DIR, LABELS, BUILD_RECORD) and not is_partial_write(path.name)
           for path in out.iterdir()):
        return False
    shards = out / SHARD_DIR
    return not shards.exists() or (shards.is_dir() and all(_store_file(path) for path in shards.iterdir()))


def _store_file(path):
    """A shard file, a job's record (a JSON object with its identity), or a write cut short."""
    if not path.is_file() or job_of(path.name) is None:
        return path.is_file() and is_partial_write(path.name)
    record = read_json(path) if path.suffix == ".json" else {"identity": None}
    return isinstance(record, dict) and "identity" in record


def job_of(file_name):
    """The job a file under shards/ belongs to: '<job>.json', '<job>-<part>.signals.npy' or '.labels.npy'."""
    match = JOB_FILE.fullmatch(file_name)
    return match and (match[1] if match[1] is not None else match[2])


def remove_job_files(out, remove):
    """Delete the records and shard files under shards/ of the jobs for which remove(job name) is true."""
    files = [path for path in (Path(out) / SHARD_DIR).iterdir()
             if path.is_file() and job_of(path.name) is not None and remove(job_of(path.name))]
    for path in files:
        path.unlink()
    return len(files)


class BuildFolder:
    """The --out of a build that has begun (check_store_folder passed): made if need be, its build record
    written first, and what the build made there taken back when it is refused."""

    def __init__(self, out):
        self.out = Path(out)
        missing = [path for path in (self.out.absolute(), *self.out.absolute().parents) if not path.exists()]
        self.created = missing[-1] if missing else None  # the topmost folder this build makes
        self.found_empty = self.created is None and not any(self.out.iterdir())
        self.writes_record = not (self.out / BUILD_RECORD).exists()  # one of another's making is left alone
        try:
            self.out.mkdir(parents=True, exist_ok=True)
            if self.writes_record:  # a finished store from before build records gains one too
                payload = json.dumps({"format": FORMAT, "version": VERSION, "written_by": "python -m data.build_store",
                                      "means": "this folder is a window store's, finished once manifest.json exists"})
                write_atomic(self.out / BUILD_RECORD, lambda partial: Path(partial).write_text(payload))
            (self.out / SHARD_DIR).mkdir(exist_ok=True)
        except OSError as exc:
            self.take_back(())
            raise DataError(f"--out {out} cannot be created ({exc.strerror or exc}); give a folder you can "
                            "write") from None

    def take_back(self, new_jobs):
        """Remove what this build made, and only that: the folder it created (with the folders above it
        that it created), or in a folder it found empty its build record, shards/ and labels.npy; in a
        store's folder, the files of `new_jobs` (the jobs this build added) and a build record it wrote.
        Returns what was done, for the refusal's line."""
        if self.created is not None:
            shutil.rmtree(self.created, ignore_errors=True)
            return f"{self.created}, which this build made, was removed again"
        if self.found_empty:
            shutil.rmtree(self.out / SHARD_DIR, ignore_errors=True)
            (self.out / LABELS).unlink(missing_ok=True)
        elif (self.out / SHARD_DIR).is_dir():
            new_jobs = set(new_jobs)
            remove_job_files(self.out, lambda job: job in new_jobs)
        if self.found_empty or self.writes_record:
            (self.out / BUILD_RECORD).unlink(missing_ok=True)
        return f"{self.out} was left empty, as it was" if self.found_empty else \
            f"the files this build added to {self.out} were removed again"
