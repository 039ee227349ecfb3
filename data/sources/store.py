"""--dataset store: a window store (data/store.py), made by `python -m data.build_store`; its test
subjects are the manifest's, its windows stay on disk and are read in batches, its normalisation is
the manifest's."""
from pathlib import Path

import numpy as np

from data.layout import Layout
from data.provenance import array_identity, file_sha256
from data.sources.base import Source
from data.splits import HarData, hold_out, validation_words
from data.store import LABELS, MANIFEST, StoreSplit, WindowStore
from data.store_folder import holds_a_store


class Store(Source):
    name = "store"
    about = "a folder made by python -m data.build_store"
    no_description = "a store keeps the one it was built with"

    def claims(self, path):
        return path is not None and Path(path).is_dir() and holds_a_store(Path(path))

    def identity_files(self, path):
        return [Path(path) / MANIFEST, Path(path) / LABELS]  # the manifest holds the shards' checksums

    def load(self, options):
        data_dir = options.data_dir
        store = WindowStore(data_dir)
        manifest = store.manifest
        is_test = np.isin(store.subjects, manifest["test_subjects"])
        train_all, test = StoreSplit.of(store, ~is_test), StoreSplit.of(store, is_test)
        train, val, val_subjects = hold_out(train_all, options)
        description = (f"data: store ({data_dir}, {len(store):,} windows in {len(store.shards)} shards, "
                       f"{manifest['dtype']}): {len(store.channels)} channels x {store.window_steps} steps; train "
                       f"{len(train):,} windows, val {len(val):,} / "
                       f"{validation_words(train_all, val_subjects, options.val_split)}, "
                       f"test {len(test):,} / {len(manifest['test_subjects'])} subjects")
        statistics = manifest["normalization"]
        normalization = (np.asarray(statistics["mean"], np.float32), np.asarray(statistics["std"], np.float32))
        return HarData(train, val, test, store.layout, self.name, description, normalization=normalization,
                       identity=array_identity(np.array([file_sha256(path) for path in self.identity_files(data_dir)])),
                       described=_store_description(manifest, store, data_dir))


def _store_description(manifest, store, data_dir):
    """The description a store was built by (None: built from flags), checked against its channels."""
    if not manifest.get("description"):
        return None
    described = Layout.from_json(manifest["description"], f"store {data_dir}'s description")
    described.check("channels", store.channels, f"store {data_dir}")
    return described


SOURCE = Store()
