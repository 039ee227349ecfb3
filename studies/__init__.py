"""Accuracy and agreement studies: nested evaluation, recordings, ensembles, baselines."""
from pathlib import Path


def outer_fold_number(name):
    """k of an outer-k folder's name."""
    return int(name.split("-")[1])


def outer_fold_dirs(config_dir, *needed):
    """The outer-k folders of a studies.nested_cv configuration that hold every file in `needed`, by k."""
    dirs = [p for p in Path(config_dir).glob("outer-*") if p.is_dir() and all((p / n).is_file() for n in needed)]
    return sorted(dirs, key=lambda p: outer_fold_number(p.name))
