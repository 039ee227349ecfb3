"""One rule for what a label means, read by --dataset npz and the store's converter: each class is one
named label value (an integer or a name), "no class" is only the values the user names, and any other
value is refused rather than dropped."""
import numpy as np

from data.errors import DataError


def class_indexes(values, class_labels, unlabelled=(), where="labels", fix=""):
    """int64 [n]: each value's position in class_labels, or -1 for a value in `unlabelled`."""
    lookup = {**dict.fromkeys(unlabelled, -1), **{value: i for i, value in enumerate(class_labels)}}
    if len(lookup) < len(class_labels) + len(unlabelled):
        raise DataError(f"{where}: a label value names two classes, or a class and no class; {fix}")
    distinct, inverse = np.unique(np.asarray(values), return_inverse=True)
    unknown = [value for value in distinct.tolist() if value not in lookup]
    if unknown:
        count = int(np.isin(values, unknown[:1]).sum())
        named = f"; {', '.join(map(str, unlabelled))} mean no class" if len(unlabelled) else ""
        raise DataError(f"{where}: label {unknown[0]!r} ({count} times) is none of the classes' labels "
                        f"({', '.join(map(str, class_labels))}){named}; {fix}")
    return np.array([lookup[value] for value in distinct.tolist()], np.int64)[inverse.reshape(-1)]
