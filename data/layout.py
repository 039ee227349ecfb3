"""What a dataset is, said once: the Layout value. Its channels (name, and where known the sensor, axis
and unit), the sample rate, the windows' length and stride, the classes with the label value of each, the
values that mean no class, and the preprocessing that made the channels. A --description file is one (the
store's converter and --dataset npz or recordings take it), a window store's manifest holds one (its
`layout` section), every HarData has one, and a checkpoint keeps its data's, which predict.py reads: one
value, read and checked by one function, Layout.from_json.

    {"sample_rate_hz": 64, "window_steps": 128, "stride_steps": 64, "preprocessing": "raw",
     "channels": [{"name": "wrist_x", "sensor": "wrist_acc", "axis": "x", "unit": "g"}, ...],
     "classes": [{"name": "walking", "label": 1}, {"name": "running", "label": 2}],
     "unlabelled": [0]}

channels and classes are needed, and a description file's sample_rate_hz (a layout made from windows
that do not say their rate holds null); the rest may be left out. A file over 1 MiB is not read; the
rate, window and stride, and the channels' and classes' names, follow data/declared.py's rules."""
import json
import math
from dataclasses import dataclass
from pathlib import Path

from data.declared import MAX_WINDOW_STEPS, MIN_WINDOW_STEPS, checked_names, rate_problem
from data.errors import DataError, not_a_file

AXES = ("x", "y", "z")
FIELDS = ("sample_rate_hz", "channels", "classes", "unlabelled", "window_steps", "stride_steps", "preprocessing")
# How the channels were made from a recording: "uci-har", UCI HAR's nine channels (data/preprocess.py);
# "raw", acc_* / gyro_* as recorded, resampled only; "unknown", windows made elsewhere, which predict.py
# cannot rebuild from a recording.
PREPROCESSINGS = ("uci-har", "raw", "unknown")
CHANNEL_FIELDS = ("name", "sensor", "axis", "unit")
# A description is a few KB (a field per channel and class): a file past this is not one, and is not
# read into memory to find that out.
MAX_DESCRIPTION_BYTES = 2 ** 20


@dataclass(frozen=True)
class Layout:
    sample_rate_hz: float  # NaN where the data does not say (windows of no stated rate)
    channels: tuple  # the channels' names, in the windows' order
    sensors: tuple  # per channel: the sensor it belongs to, or None
    axes: tuple  # per channel: "x", "y", "z", or None
    units: tuple  # per channel: its unit as said (free text), or None
    class_names: tuple
    class_labels: tuple  # per class: the value (a whole number or a name) that the data's labels give it
    unlabelled: tuple = ()  # label values that mean no class
    window_steps: int | None = None
    stride_steps: int | None = None
    preprocessing: str | None = None  # PREPROCESSINGS; None: not said
    where: str = "the description"  # the file or place it was read from, for the refusals

    @classmethod
    def from_json(cls, content, where, rate_said=True):
        """The Layout a dict says (a --description file's, a store manifest's section, a checkpoint's), each
        field checked: the one reader and validator of a layout. `rate_said`: the rate must be given (a
        description file, a store); else null stands for windows of no stated rate."""
        return _layout_from_json(content, where, rate_said)

    @classmethod
    def named(cls, channels, class_names, class_labels=None, **said):
        """A layout of channels and classes by name (each class labelled by `class_labels`, else by its
        index, as the windows hold it), with any other field by keyword: what a source that reads no
        description knows."""
        where = said.pop("where", "the data")
        rate = said.pop("sample_rate_hz", None)
        said["sample_rate_hz"] = None if rate is None or math.isnan(rate) else float(rate)
        labels = range(len(class_names)) if class_labels is None else class_labels
        return cls.from_json({"channels": [{"name": name} for name in channels],
                              "classes": [{"name": name, "label": label} for name, label in zip(class_names, labels,
                                                                                                strict=True)],
                              **{key: value for key, value in said.items() if value is not None}}, where,
                             rate_said=False)

    def replace(self, **changes):
        """This layout with fields changed, checked again."""
        return Layout.from_json({**self.as_json(), **changes}, self.where, rate_said=False)

    def sensor_triples(self):
        """Channel indices [x, y, z] of every sensor whose three axes are all named (by sensor and axis, or
        where none is said by the names' _x/_y/_z): what rotation and flip turn together."""
        if all(axis is None for axis in self.axes):
            return named_triples(self.channels)
        triples = []
        for sensor in dict.fromkeys(s for s in self.sensors if s is not None):
            by_axis = {axis: i for i, (s, axis) in enumerate(zip(self.sensors, self.axes, strict=True))
                       if s == sensor and axis is not None}
            if set(by_axis) == set(AXES):
                triples.append([by_axis[axis] for axis in AXES])
        return triples

    def labels_are_numbers(self):
        """Whether every class's label and every unlabelled value is a whole number, as a recording's
        label column holds (an .npz may label by names)."""
        return all(_is_whole(label) for label in (*self.class_labels, *self.unlabelled))

    def as_json(self):
        """The dict a file holds (what a store's manifest and a checkpoint keep); a rate not said is null."""
        channels = [{key: value for key, value in zip(CHANNEL_FIELDS, row, strict=True) if value is not None}
                    for row in zip(self.channels, self.sensors, self.axes, self.units, strict=True)]
        kept = {"window_steps": self.window_steps, "stride_steps": self.stride_steps,
                "preprocessing": self.preprocessing}
        rate = None if math.isnan(self.sample_rate_hz) else self.sample_rate_hz
        return {"sample_rate_hz": rate, "channels": channels,
                "classes": [{"name": name, "label": label}
                            for name, label in zip(self.class_names, self.class_labels, strict=True)],
                "unlabelled": list(self.unlabelled), **{key: value for key, value in kept.items() if value is not None}}

    def check(self, field, held, source):
        """Refuse `source` when what it holds for `field` is not what the description says (None: it does
        not say, and the description's stands)."""
        said = {"channels": self.channels, "sample_rate_hz": self.sample_rate_hz, "window_steps": self.window_steps,
                "classes": self.class_names}[field]
        unsaid = [value is None or (isinstance(value, float) and math.isnan(value)) for value in (held, said)]
        if any(unsaid):
            return
        same = tuple(held) == said if isinstance(said, tuple) else float(held) == float(said)
        if not same:
            raise DataError(f"{source} holds {field} {_shown(held)} but {self.where} says {_shown(said)}: correct "
                            f"the field '{field}' or use the data it describes")


def named_triples(channel_names):
    """Channel indices of every x/y/z triple told by the names alone, e.g. body_acc_x/_y/_z -> [0, 1, 2]."""
    index = {name: i for i, name in enumerate(channel_names)}
    triples = []
    for name in channel_names:
        if name.endswith("_x"):
            members = [index.get(name[:-1] + axis) for axis in AXES]
            if None not in members:
                triples.append(members)
    return triples


def read_layout(path):
    """The Layout a --description JSON file says; a file that is not one is refused in one line naming the
    field."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"--description {path} {not_a_file(path)}; it names a JSON file (see docs/using_a_model.md, "
                        "'A dataset description')")
    with open(path, "rb") as handle:
        text = handle.read(MAX_DESCRIPTION_BYTES + 1)  # the size as read: a file may grow after a stat
    if len(text) > MAX_DESCRIPTION_BYTES:
        raise DataError(f"--description {path} is larger than {MAX_DESCRIPTION_BYTES:,} bytes (1 MiB), and a "
                        "description is a few KB of JSON: name the description file, not the data")
    try:
        content = json.loads(text.decode("utf-8"))
    except RecursionError:
        raise DataError(f"--description {path} nests its JSON deeper than can be read; a description is an object "
                        "of lists of objects, three levels deep") from None
    except (UnicodeDecodeError, ValueError) as exc:  # ValueError: JSONDecodeError, or a number too long to read
        raise DataError(f"--description {path} is not readable JSON ({str(exc).splitlines()[0][:200]})") from None
    return Layout.from_json(content, str(path))


def _layout_from_json(content, where, rate_said):
    """Layout.from_json: every field checked, in one line naming it."""
    _need(isinstance(content, dict), where, "(the whole file)", "an object with " + ", ".join(FIELDS))
    unknown = sorted(set(content) - set(FIELDS))
    _need(not unknown, where, unknown[0] if unknown else "", "left out: the fields are " + ", ".join(FIELDS))
    for field in ("sample_rate_hz", "channels", "classes") if rate_said else ("channels", "classes"):
        _need(field in content, where, field, "given")
    rate = content.get("sample_rate_hz")
    if rate is not None or rate_said:
        _need(_is_number(rate), where, "sample_rate_hz", f"a positive number of Hz, got {rate!r}")
        _need(rate_problem(rate) is None, where, "sample_rate_hz", rate_problem(rate))
    window, stride = content.get("window_steps"), content.get("stride_steps")
    _need(window is None or (_is_whole(window) and MIN_WINDOW_STEPS <= window <= MAX_WINDOW_STEPS), where,
          "window_steps", f"a whole number of at least {MIN_WINDOW_STEPS} and at most {MAX_WINDOW_STEPS:,} (22 "
          "minutes at 50 Hz)")
    _need(stride is None or (_is_whole(stride) and 1 <= stride <= (window or MAX_WINDOW_STEPS)), where,
          "stride_steps", f"a whole number between 1 and window_steps (at most {MAX_WINDOW_STEPS:,})")
    preprocessing = content.get("preprocessing")
    _need(preprocessing is None or preprocessing in PREPROCESSINGS, where, "preprocessing",
          f"one of {', '.join(PREPROCESSINGS)}")
    channels = _channels(content["channels"], where)
    class_names, labels = _classes(content["classes"], where)
    unlabelled = content.get("unlabelled", [])
    _need(isinstance(unlabelled, list) and all(_is_whole(v) or _is_name(v) for v in unlabelled)
          and len(set(unlabelled)) == len(unlabelled) and not set(unlabelled) & set(labels), where, "unlabelled",
          "a list of distinct label values that are no class's label")
    return Layout(float("nan") if rate is None else float(rate), tuple(c["name"] for c in channels),
                  tuple(c.get("sensor") for c in channels), tuple(c.get("axis") for c in channels),
                  tuple(c.get("unit") for c in channels), class_names, labels, tuple(unlabelled), window, stride,
                  preprocessing, where)


def _channels(channels, where):
    """The 'channels' field, checked: a list of objects, each a name (data/declared.py's rule) and
    optionally its sensor, axis and unit."""
    _need(isinstance(channels, list) and channels and all(isinstance(c, dict) and isinstance(c.get("name"), str)
                                                          and set(c) <= set(CHANNEL_FIELDS) for c in channels),
          where, "channels", "a list of objects with a non-empty 'name' and optionally 'sensor', 'axis' and 'unit'")
    checked_names([channel["name"] for channel in channels], "channel", f"{where}: 'channels'")
    for key in ("sensor", "unit"):
        _need(all(channel.get(key) is None or _is_name(channel[key]) for channel in channels), where, "channels",
              f"objects whose '{key}' is a non-empty string where given")
    _need(all(channel.get("axis") in (None, *AXES) for channel in channels), where, "channels",
          "objects whose 'axis' is x, y or z where given")
    pairs = [(c.get("sensor"), c["axis"]) for c in channels if c.get("axis") is not None]
    _need(all(sensor is not None for sensor, _ in pairs) and len(set(pairs)) == len(pairs), where, "channels",
          "objects that give an 'axis' with its 'sensor', each axis of a sensor once")
    return channels


def _classes(classes, where):
    """(class names, their label values) of the 'classes' field, checked."""
    _need(isinstance(classes, list) and len(classes) >= 2
          and all(isinstance(c, dict) and set(c) == {"name", "label"} and isinstance(c["name"], str) for c in classes),
          where, "classes", "a list of at least two objects {\"name\": ..., \"label\": ...}")
    class_names = checked_names([c["name"] for c in classes], "class", f"{where}: 'classes'")
    labels = tuple(c["label"] for c in classes)
    _need(all(_is_whole(label) or _is_name(label) for label in labels), where, "classes", "objects whose 'label' is "
          "a whole number or a non-empty string")
    _need(len(set(labels)) == len(labels), where, "classes", "objects of distinct names and distinct labels")
    return class_names, labels


def _need(ok, where, field, what):
    if not ok:
        raise DataError(f"{where}: '{field}' must be {what}")


def _is_number(value):
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_whole(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_name(value):
    return isinstance(value, str) and bool(value.strip())


def _shown(value):
    return ", ".join(map(str, value)) if isinstance(value, tuple | list) else f"{float(value):g}"
