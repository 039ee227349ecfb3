"""Accuracy and agreement studies: nested evaluation, recordings, ensembles, baselines."""
import re
import sys
from pathlib import Path

OUTER_FOLD = re.compile(r"outer-[0-9]+")  # the folder studies.nested_cv gives outer fold k


def outer_fold_number(name):
    """k of an outer-k folder's name."""
    return int(name.split("-")[1])


def outer_fold_dirs(config_dir, *needed):
    """The outer-k folders of a studies.nested_cv configuration that hold every file in `needed`, by k. A
    folder named otherwise (outer-2.bak, outer-2-old: a copy kept beside them) is none of its outer
    folds, and is skipped with one line saying so."""
    found = sorted(path for path in Path(config_dir).glob("outer-*") if path.is_dir())
    strays = [path.name for path in found if not OUTER_FOLD.fullmatch(path.name)]
    if strays:
        print(f"warning: {config_dir}: skipping {', '.join(strays)}: studies.nested_cv names an outer fold's "
              "folder outer-<k>, so these are not outer folds of its", file=sys.stderr)
    dirs = [path for path in found if OUTER_FOLD.fullmatch(path.name) and all((path / n).is_file() for n in needed)]
    return sorted(dirs, key=lambda path: outer_fold_number(path.name))
