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


def classes_from_flags(names_text, labels_text):
    """(class names, their whole-number label values) from --class-names and --class-labels (default
    1..K), refused in one line unless there are two or more distinct names and one distinct value each."""
    names = [name.strip() for name in names_text.split(",")]
    if len(names) < 2 or not all(names) or len(set(names)) < len(names):
        raise DataError(f"--class-names must name at least two distinct classes, comma-separated (such as "
                        f"WALKING,SITTING); got {names_text!r}")
    labels = whole_numbers("--class-labels", labels_text) if labels_text else list(range(1, len(names) + 1))
    if len(labels) != len(names):
        raise DataError(f"--class-labels gives {len(labels)} values for {len(names)} --class-names; give one label "
                        "value per class, in the same order")
    class_indexes([], labels, (), "--class-labels", "give each value once")
    return names, labels


def whole_numbers(flag, text):
    """The comma-separated whole numbers of a flag's value, refused in one line otherwise."""
    try:
        return [int(value) for value in text.split(",") if value.strip()]
    except ValueError:
        raise DataError(f"{flag} takes whole numbers such as 0,1,2; got {text!r}") from None
