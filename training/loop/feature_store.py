"""The feature pool on disk: a window store's run (--dataset store) keeps its pool in
<save-dir>/features/<identity>/, one .npy shard per piece that a rank transforms, each written whole or
not at all (a temporary file, then one rename), read back memory-mapped. The identity is a digest of
everything that decides the pool's contents, so a re-run with the same identity reuses the shards
(an interrupted build resumes at the shards it lacks) and any change builds a pool of its own."""
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import torch

from data.provenance import read_json
from data.store import StoreSplit, write_atomic
from training import faults
from training.errors import UsageError

FORMAT = "har-feature-store-1"
IDENTITY = "identity.json"


def pool_identity(model, splits, views, augment, seed, dtype, chunk):
    """{what: digest or value} of everything that decides the pool: the model's fixed parts, each
    split's windows (a store's manifest and the windows chosen) and normalisation, the views, the seed,
    the augmentation's settings and statistics, the counts' type and the chunking of random draws."""
    fixed = {name: tensor for name, tensor in model.state_dict().items() if not name.startswith("head.")}
    identity = {"format": FORMAT, "model": _digest(*fixed.values(), repr(model.dilations), repr(model.paddings)),
                "views": views, "seed": seed, "dtype": str(dtype), "chunk": chunk,
                "augmentation": _digest(repr(augment.config), augment.mean, augment.std) if augment else None}
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
        earlier = read_json(others[-1]) or {}  # unreadable: every field counts as changed
        changed = sorted(key for key in {**earlier, **self.identity} if earlier.get(key) != self.identity.get(key))
        return f"the pool in {others[-1].parent.name} was of other {', '.join(changed)}"

    def start(self):
        """Make the folder and record its identity (every rank may: the same bytes, one rename each)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        payload = json.dumps(self.identity, sort_keys=True, indent=1).encode()
        write_atomic(self.folder / IDENTITY, lambda path: Path(path).write_bytes(payload))

    def remove_others(self):
        """Once every rank has written its shards: delete the partial files a killed build left, and
        the other pools in `root` (each a folder with an identity file of this format), which a
        finished pool replaces, so that a folder holds one pool, not one for every change."""
        for partial in self.folder.glob(".*.tmp.npy"):
            partial.unlink(missing_ok=True)
        for path in self.root.glob(f"*/{IDENTITY}"):
            if path.parent != self.folder and (read_json(path) or {}).get("format") == FORMAT:
                shutil.rmtree(path.parent)

    def shard_path(self, part, first):
        return self.folder / f"part{part}-{first:09d}.npy"

    def holds(self, part, first, stop, width, dtype):
        """Whether the piece's shard is whole: an .npy of [stop - first, width] of `dtype`, all its bytes there."""
        try:
            held = np.load(self.shard_path(part, first), mmap_mode="r")
        except (OSError, ValueError):  # missing, or cut short (its header or data)
            return False
        return held.shape == (stop - first, width) and held.dtype == dtype

    def write(self, part, first, counts):
        path = self.shard_path(part, first)

        def save(partial):
            np.save(partial, counts)
            faults.during_shard_write()

        try:
            write_atomic(path, save)
        except OSError as exc:  # a full disk, above all: the shards written so far stay, and count
            raise UsageError(f"could not write the feature pool's shard {path} ({exc.strerror or exc}); free "
                             "space there and run the same command again (it reuses the shards written so far), "
                             "or pass --feature-views 0 to transform every batch instead") from None

    def open(self, pieces, width, dtype):
        """The shards of `pieces` [(part, first, stop), ...] in order, as one array [n, width] on disk."""
        return ShardedRows([self.shard_path(part, first) for part, first, _ in pieces],
                           [stop - first for _, first, stop in pieces], width, dtype)


class ShardedRows:
    """Shards [n_i, F] read as one array [sum n_i, F]: `shape`, `dtype`, `nbytes`, and indexing with an
    array of positions (what the loaders read a batch with). Each read maps the shards it needs and
    lets them go, so a process keeps resident the batches it works on, not every page it went through."""

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
        for shard in np.unique(shard_of):
            picked = np.flatnonzero(shard_of == shard)
            out[picked] = np.load(self.paths[shard], mmap_mode="r")[positions[picked] - self.starts[shard]]
        return out
