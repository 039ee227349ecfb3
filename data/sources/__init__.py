"""Where a run's windows come from: one module per kind of data, each a Source registered here by name,
as models/ registers its networks. --dataset's choices, what --dataset auto means for a --data-dir, and
every command's reading of one (training, predict.py, cross-validation, the store's converter) go
through this module, so a new kind of data is one module that registers itself (register_source).

    load_har_data("npz", "windows.npz", val_fraction=0.25)     # any DataOptions field by name
    source_for("auto", "store/").name                           # 'store': the kind that claims the folder
"""
from pathlib import Path

from data.errors import DataError
from data.sources import npz, recordings, store, synthetic, uci_har
from data.sources.base import AUTO, DataOptions, Source

__all__ = ["AUTO", "SOURCES", "DataOptions", "Source", "dataset_choices", "load_har_data", "register_source",
           "resolved_dataset", "source_for"]

# In the order --dataset auto asks them whether a --data-dir is theirs: a store's folder before a
# folder of recordings (a store's shards are .npy), UCI HAR's layout before either.
SOURCES = {}


def register_source(source):
    """Add a kind of data (a Source instance); it is then a --dataset choice everywhere, and --dataset auto
    asks it about a --data-dir after the kinds registered before it."""
    if not source.name or source.name == AUTO:
        raise ValueError(f"a source needs a name other than {AUTO!r}")
    SOURCES[source.name] = source
    return source


for _kind in (synthetic, store, uci_har, npz, recordings):
    register_source(_kind.SOURCE)


def dataset_choices():
    """--dataset's choices: auto, then every registered kind."""
    return (AUTO, *SOURCES)


def source_for(dataset, data_dir):
    """The Source a --dataset value means for a --data-dir: the one named, or for auto the first that
    claims the path; a path no kind claims is refused, naming what each kind reads."""
    if dataset != AUTO:
        if dataset not in SOURCES:
            raise DataError(f"unknown --dataset {dataset!r}; choose {', '.join(dataset_choices())}")
        return SOURCES[dataset]
    path = None if data_dir is None else Path(data_dir)
    found = next((source for source in SOURCES.values() if source.claims(path)), None)
    if found is None:
        kinds = "; ".join(f"--dataset {source.name}: {source.about}" for source in SOURCES.values()
                          if source.takes_path)
        raise DataError(f"--data-dir {data_dir} holds no data of a kind this trainer reads ({kinds}); point it at "
                        "one of those, or use --dataset synthetic to run without data")
    return found


def resolved_dataset(dataset, data_dir):
    """The kind a --dataset value means for a --data-dir, by name; auto where no kind claims the path (a
    folder moved since, say), so that two settings compare by what they meant where that can be told."""
    try:
        return source_for(dataset, data_dir).name
    except (DataError, OSError):
        return dataset


def load_har_data(dataset=AUTO, data_dir=None, **options):
    """The data (data.splits.HarData) of a --dataset and --data-dir, read as the DataOptions fields in
    `options` say: its kind's own refusals first, then its windows split by subject, not normalised."""
    asked = DataOptions(dataset=dataset, data_dir=data_dir, **options)
    source = source_for(dataset, data_dir)
    source.check(asked)
    return source.load(asked)
