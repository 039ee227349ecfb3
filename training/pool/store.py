"""The feature pool on disk: a window store's run (--dataset store) keeps its pool in
<save-dir>/features/<identity>/, one .npy shard per piece that a rank transforms, each written whole or
not at all (a temporary file, then one rename), read back by positioned reads (data.store.read_rows).
The identity is a digest of everything that decides the pool's contents, so a re-run with the same
identity reuses the shards
(an interrupted build resumes at the shards it lacks) and any change builds a pool of its own.

Beside each shard lies its SHA-256, in the format of sha256sum (part0-000000000.sha256), recorded as
the shard is written and compared before the shard is reused: a shard changed in place keeps its
type and shape, so only its bytes can tell. At UCI HAR's size (4 views: 27,783 windows of 8,820 uint8
counts, 234 MiB) checking every shard took 0.14 to 0.19 s on two busy CPU cores, where building the
pool takes about 18 s (docs/distributed.md), so every byte is hashed rather than a sample."""
import errno
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import torch

from data.provenance import file_sha256, read_json
from data.store import StoreSplit, npy_data_offset, read_rows
from outputs.safety import write_atomic
from training import faults
from training.errors import UsageError

FORMAT = "har-feature-store-1"
IDENTITY = "identity.json"
MISSING = "missing"  # a shard not written yet: built without a word, unlike a damaged one


def pool_identity(model, splits, views, augment, seed, dtype, chunk):
    """{what: digest or value} of everything that decides the pool: the model's fixed parts (what its
    pool_identity_parts names), each split's windows (a store's manifest and the windows chosen) and
    normalisation, the views, the seed, the augmentation's settings, statistics and the training labels
    it reads (the classes rotate turns wide, the classes flip may turn: a store relabelled keeps its
    manifest), the counts' type and the chunking of random draws."""
    identity = {"format": FORMAT, "model": _digest(*model.pool_identity_parts()),
                "views": views, "seed": seed, "dtype": str(dtype), "chunk": chunk,
                "augmentation": _digest(repr(augment.config), augment.mean, augment.std,
                                        np.ascontiguousarray(splits["train"].labels)) if augment else None}
    for name, split in splits.items():
        signals = split.signals
        if isinstance(split, StoreSplit):
            manifest = (signals.store.root / "manifest.json").read_bytes()
            identity[f"data {name}"] = _digest(manifest, signals.indices, signals.mean, signals.std)
        else:
            identity[f"data {name}"] = _digest(np.ascontiguousarray(signals))
    return identity


def _digest(*parts):
    digest = hashlib.sha256()
    for part in parts:
        if isinstance(part, torch.Tensor):
            part = part.detach().cpu().contiguous().numpy()
        digest.update(part.tobytes() if isinstance(part, np.ndarray) else str(part).encode())
    return digest.hexdigest()[:16]


class FeatureStore:
    """One identity's folder of shards: which are held whole, writing one, opening them all."""

    def __init__(self, root, identity):
        self.root = Path(root)
        self.identity = identity
        self.folder = self.root / _digest(json.dumps(identity, sort_keys=True))

    def describe_change(self):
        """Why this identity's pool is built: what differs from the newest other pool in `root`."""
        others = sorted(self.root.glob(f"*/{IDENTITY}"), key=lambda path: path.stat().st_mtime)
        others = [path for path in others if path.parent != self.folder]
        if not others:
            return "no earlier pool in this folder"
        return f"the pool in {others[-1].parent.name} was of other {self._changed_from(_identity_in(others[-1]))}"

    def foreign(self):
        """Why the shards in this identity's folder are another pool's (None where they are this one's,
        or there are none): its identity file, written before any shard, names another identity or
        cannot be read (a folder moved or edited by hand). Read before start() records this identity."""
        if not any(self.folder.glob("part*.npy")):
            return None
        recorded = _identity_in(self.folder / IDENTITY)
        if recorded == self.identity:
            return None
        if not recorded:
            return f"its shards in {self.folder.name} have no readable {IDENTITY}"
        return f"its shards in {self.folder.name} were of other {self._changed_from(recorded)} (their {IDENTITY})"

    def _changed_from(self, earlier):
        """The fields in which the identity `earlier` differs from this one (every one of an unreadable
        file's: {})."""
        now = self.identity
        return ", ".join(sorted(key for key in {**earlier, **now} if earlier.get(key) != now.get(key)))

    def start(self):
        """Make the folder and record its identity (every rank may: the same bytes, one rename each)."""
        payload = json.dumps(self.identity, sort_keys=True, indent=1).encode()
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            write_atomic(self.folder / IDENTITY, lambda path: Path(path).write_bytes(payload))
        except OSError as exc:  # a full disk, a read-only folder, a file where the folder should be
            raise UsageError(_unwritable(self.folder / IDENTITY, exc)) from None

    def remove_others(self, warn):
        """Once every rank has written its shards: delete the partial files a killed build left, and
        the other pools in `root` (each a folder with an identity file of this format), which a
        finished pool replaces, so that a folder holds one pool, not one for every change. One that
        cannot go is warned of: the new pool is built, and the run goes on."""
        for partial in self.folder.glob(".*.tmp.*"):  # a shard's or its checksum's
            partial.unlink(missing_ok=True)
        for path in self.root.glob(f"*/{IDENTITY}"):
            if path.parent != self.folder and _identity_in(path).get("format") == FORMAT:
                _remove_pool(path.parent, warn)

    def shard_path(self, part, first):
        return self.folder / f"part{part}-{first:09d}.npy"

    def checksum_path(self, part, first):
        return self.shard_path(part, first).with_suffix(".sha256")

    def damage(self, part, first, stop, width, dtype):
        """Why the piece's shard cannot be reused: None when it is an .npy of [stop - first, width] of
        `dtype` whose bytes are those recorded when it was written, MISSING when there is no shard,
        else one phrase saying what is wrong with it."""
        path, dtype = self.shard_path(part, first), np.dtype(dtype)
        try:
            held = np.load(path, mmap_mode="r")
        except FileNotFoundError:
            return MISSING
        except (OSError, ValueError, EOFError) as exc:  # its header or data cut short (to nothing: EOFError)
            return f"is cut short or unreadable ({exc})"
        if held.dtype != dtype:
            return f"holds {held.dtype} counts, not {dtype}"
        if held.shape != (stop - first, width):
            return f"holds [{', '.join(map(str, held.shape))}] counts, not [{stop - first}, {width}]"
        del held
        try:
            recorded = self.checksum_path(part, first).read_text().split()[:1]
        except FileNotFoundError:
            return "has no checksum beside it (written before checksums were kept, or stopped before its own)"
        except (OSError, ValueError):  # not text: as good as a checksum of other bytes
            recorded = []
        if recorded != [file_sha256(path)]:
            return "has bytes other than those written (its SHA-256 differs from the checksum recorded)"
        return None

    def write(self, part, first, counts):
        path, checksum = self.shard_path(part, first), self.checksum_path(part, first)
        digest = []

        def save(partial):
            np.save(partial, counts)
            digest.append(file_sha256(partial))
            faults.during_shard_write()

        try:
            # The old checksum goes first: a build stopped before recording the new one leaves a
            # shard without a checksum, which is rebuilt, never a shard beside another's checksum.
            checksum.unlink(missing_ok=True)
            write_atomic(path, save)
            write_atomic(checksum, lambda partial: Path(partial).write_text(f"{digest[0]}  {path.name}\n"))
        except OSError as exc:  # a full disk, above all: the shards written so far stay, and count
            raise UsageError(_unwritable(path, exc)) from None

    def open(self, pieces, width, dtype):
        """The shards of `pieces` [(part, first, stop), ...] in order, as one array [n, width] on disk."""
        return ShardedRows([self.shard_path(part, first) for part, first, _ in pieces],
                           [stop - first for _, first, stop in pieces], width, dtype)


def _remove_pool(folder, warn):
    """An earlier pool's folder, or the link to one kept elsewhere: the link goes, what it points at stays
    (it is not in this run's folder)."""
    try:
        if folder.is_symlink():
            folder.unlink()
        else:
            shutil.rmtree(folder)
    except OSError as exc:
        warn(f"the earlier feature pool {folder} could not be removed ({exc.strerror}); the new one is built "
             "beside it: remove the old one yourself")


def _identity_in(path):
    """The identity an identity file records; {} where it cannot be read or holds no JSON object."""
    recorded = read_json(path)
    return recorded if isinstance(recorded, dict) else {}


def _unwritable(path, exc):
    """The one line for a feature pool file that could not be written: what to do depends on why."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = "free space there and run the same command again (it reuses the shards written so far)"
    else:
        fix = f"make {path.parent.parent} a writable folder (or pass another --save-dir) and run the same command again"
    return (f"could not write the feature pool file {path} ({exc.strerror or exc}); {fix}, or pass --feature-views 0 "
            "to transform every batch instead")


class ShardedRows:
    """Shards [n_i, F] read as one array [sum n_i, F]: `shape`, `dtype`, `nbytes`, and indexing with an
    array of positions (what the loaders read a batch with), by data.store.read_rows as the window
    store reads its windows: nothing stays mapped, so a process keeps resident the batches it works on,
    not every page it went through."""

    def __init__(self, paths, lengths, width, dtype):
        self.paths, self.dtype = paths, np.dtype(dtype)
        self.starts = np.cumsum([0, *lengths])
        self.shape = (int(self.starts[-1]), width)
        self.nbytes = self.shape[0] * width * self.dtype.itemsize

    def __len__(self):
        return self.shape[0]

    def __getitem__(self, positions):
        positions = np.asarray(positions, dtype=np.int64)
        out = np.empty((len(positions), self.shape[1]), dtype=self.dtype)
        shard_of = np.searchsorted(self.starts, positions, side="right") - 1
        row_bytes = self.shape[1] * self.dtype.itemsize
        for shard in np.unique(shard_of):
            picked = np.flatnonzero(shard_of == shard)
            length = int(self.starts[shard + 1] - self.starts[shard])
            rows = read_rows(self.paths[shard], npy_data_offset((length, self.shape[1]), self.dtype.str), row_bytes,
                             positions[picked] - self.starts[shard],
                             f"feature pool shard {self.paths[shard]} was cut short while training read it; run the "
                             "same command again to rebuild it")
            out[picked] = rows.view(self.dtype)
        return out
