"""What produced a piece of finished work, recorded in a small JSON beside it, and whether a re-run may reuse it.

A record holds the work's `inputs` (a JSON mapping of everything that decides its content: the
settings that matter, the source files' file_identity, windows in memory as array_identity) and
each output file's size, mtime and SHA-256 as written. A Verdict answers: `missing` (no readable
record: the work never finished), `changed` (inputs that differ, one line each) or `damaged`
(outputs that are not what was written); each caller decides whether to redo the part or refuse.
"""
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from outputs.safety import write_atomic

HASH_CHUNK_BYTES = 2 ** 22
SHOWN_CHARACTERS = 60  # a changed value is shown up to this length in a one-line message


def file_sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def file_identity(path, checksum=False):
    """A source file as a re-run compares it: resolved path, size and mtime, or, with `checksum`, its
    size and content (then a copy or a touched file still matches)."""
    path = Path(path)
    stat = path.stat()
    if checksum:
        return {"path": str(path.resolve()), "bytes": stat.st_size, "sha256": file_sha256(path)}
    return {"path": str(path.resolve()), "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def array_identity(*arrays):
    """The content of arrays in memory: dtype, shape and bytes of each, as one SHA-256."""
    digest = hashlib.sha256()
    for array in arrays:
        digest.update(f"{array.dtype.str}{list(array.shape)}".encode())
        digest.update(memoryview(array.reshape(-1).view("u1") if array.flags.c_contiguous else array.tobytes()))
    return digest.hexdigest()


def make_record(inputs, root, outputs):
    """The record of finished work: its inputs and each output file (relative to `root`) as written."""
    root = Path(root)
    files = {}
    for name in outputs:
        stat = (root / name).stat()
        files[str(name)] = {"bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": file_sha256(root / name)}
    return {"inputs": _as_json(inputs), "outputs": files}


def write_record(path, record):
    """The record as JSON, whole or not at all (a temporary file, then one rename)."""
    write_atomic(path, lambda partial: Path(partial).write_bytes(json.dumps(record, indent=1).encode()))


def read_json(path):
    """The JSON object in `path`, or None when there is none or it cannot be read."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def read_record(path):
    """A record written by write_record, or None when there is none or it cannot be read."""
    record = read_json(path)
    ok = isinstance(record, dict) and isinstance(record.get("inputs"), dict) and isinstance(record.get("outputs"), dict)
    return record if ok else None


@dataclass
class Verdict:
    missing: bool = False  # no readable record
    changed: list = field(default_factory=list)  # 'name: recorded (now: current)' per differing input
    damaged: list = field(default_factory=list)  # output files that are no longer what was written

    @property
    def matches(self):
        return not (self.missing or self.changed or self.damaged)

    def describe(self, limit=3):
        """The differences in a few words, for one line of output."""
        if self.missing:
            return "no record of a finished run"
        parts = [*self.changed, *(f"{name} is not what was written" for name in self.damaged)]
        more = f" and {len(parts) - limit} more" if len(parts) > limit else ""
        return "; ".join(parts[:limit]) + more


def check(record, inputs, root):
    """Compare a record (from read_record, or None) with the inputs a re-run would use, and its
    outputs under `root` with what was written."""
    if record is None:
        return Verdict(missing=True)
    recorded, now = record["inputs"], _as_json(inputs)
    changed = [_difference(key, recorded.get(key), now.get(key)) for key in sorted(set(recorded) | set(now))
               if recorded.get(key) != now.get(key)]
    return Verdict(changed=changed, damaged=damaged_outputs(record, root))


def _difference(key, recorded, now):
    if isinstance(recorded, dict) and isinstance(now, dict) and "path" in recorded:
        if recorded["path"] != now.get("path"):
            return f"{key}: {_shown(recorded['path'])} (now: {_shown(now.get('path'))})"
        return f"{key}: {_shown(recorded['path'])} changed since"
    return f"{key}: {_shown(recorded)} (now: {_shown(now)})"


def damaged_outputs(record, root):
    """Output files that are missing, of another size, or rewritten with other bytes (a file whose mtime
    moved is hashed again: a copied folder still matches, a file rewritten in place does not)."""
    damaged = []
    for name, written in record["outputs"].items():
        path = Path(root) / name
        try:
            stat = path.stat()
            moved = stat.st_mtime_ns != written["mtime_ns"]  # then only the bytes can tell
            if stat.st_size != written["bytes"] or (moved and file_sha256(path) != written["sha256"]):
                damaged.append(name)
        except (OSError, KeyError, TypeError):
            damaged.append(name)
    return damaged


def _as_json(value):
    """As it reads back from JSON (tuples as lists, keys as strings), so a fresh value compares equal."""
    return json.loads(json.dumps(value))


def _shown(value):
    text = "none" if value is None else json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= SHOWN_CHARACTERS else text[:SHOWN_CHARACTERS - 3] + "..."
