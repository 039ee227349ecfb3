"""A dataset said once, in a JSON file that the store's converter and --dataset npz take as --description
and that then travels with the store and the checkpoint to predict.py: the channels (name, and where
known the sensor, axis and unit), the sample rate, the windows' length and stride, the classes with
the label value of each, and the values that mean no class. Each field is checked as it is read, and
data that contradicts the file is refused in one line naming the field.

    {"sample_rate_hz": 64, "window_steps": 128, "stride_steps": 64,
     "channels": [{"name": "wrist_x", "sensor": "wrist_acc", "axis": "x", "unit": "g"}, ...],
     "classes": [{"name": "walking", "label": 1}, {"name": "running", "label": 2}],
     "unlabelled": [0]}

sample_rate_hz, channels and classes are needed; the rest may be left out. A file over 1 MiB is not
read; the rate, window and stride, and the channels' and classes' names, follow data/declared.py's rules."""
import json
import math
from dataclasses import dataclass
from pathlib import Path

from data.declared import MAX_WINDOW_STEPS, MIN_WINDOW_STEPS, checked_names, rate_problem
from data.errors import DataError, not_a_file

AXES = ("x", "y", "z")
FIELDS = ("sample_rate_hz", "channels", "classes", "unlabelled", "window_steps", "stride_steps")
CHANNEL_FIELDS = ("name", "sensor", "axis", "unit")
# A description is a few KB (a field per channel and class): a file past this is not one, and is not
# read into memory to find that out.
MAX_DESCRIPTION_BYTES = 2 ** 20


@dataclass(frozen=True)
class Description:
    sample_rate_hz: float
    channels: tuple  # the channels' names, in the windows' order
    sensors: tuple  # per channel: the sensor it belongs to, or None
    axes: tuple  # per channel: "x", "y", "z", or None
    units: tuple  # per channel: its unit as said (free text), or None
    class_names: tuple
    class_labels: tuple  # per class: the value (a whole number or a name) that the data's labels give it
    unlabelled: tuple = ()  # label values that mean no class
    window_steps: int | None = None
    stride_steps: int | None = None
    where: str = "the description"  # the file it was read from, for the refusals

    def sensor_triples(self):
        """Channel indices [x, y, z] of every sensor whose three axes are all named: what rotation and
        flip turn together."""
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
        """The dict the file holds (what a store's manifest and a checkpoint keep)."""
        channels = [{key: value for key, value in zip(CHANNEL_FIELDS, row, strict=True) if value is not None}
                    for row in zip(self.channels, self.sensors, self.axes, self.units, strict=True)]
        kept = {"window_steps": self.window_steps, "stride_steps": self.stride_steps}
        return {"sample_rate_hz": self.sample_rate_hz, "channels": channels,
                "classes": [{"name": name, "label": label}
                            for name, label in zip(self.class_names, self.class_labels, strict=True)],
                "unlabelled": list(self.unlabelled), **{key: value for key, value in kept.items() if value is not None}}

    def check(self, field, held, source):
        """Refuse `source` when what it holds for `field` is not what the description says (None: it does
        not say, and the description's stands)."""
        said = {"channels": self.channels, "sample_rate_hz": self.sample_rate_hz, "window_steps": self.window_steps,
                "classes": self.class_names}[field]
        if held is None or said is None or (isinstance(held, float) and math.isnan(held)):
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


def read_description(path):
    """The Description in a JSON file; a file that is not one is refused in one line naming the field."""
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
    return description_of(content, str(path))


def description_of(content, where):
    """A Description from the dict a file, a store's manifest or a checkpoint holds."""
    _need(isinstance(content, dict), where, "(the whole file)", "an object with " + ", ".join(FIELDS))
    unknown = sorted(set(content) - set(FIELDS))
    _need(not unknown, where, unknown[0] if unknown else "", "left out: the fields are " + ", ".join(FIELDS))
    for field in ("sample_rate_hz", "channels", "classes"):
        _need(field in content, where, field, "given")
    rate = content["sample_rate_hz"]
    _need(_is_number(rate), where, "sample_rate_hz", "a positive number of Hz")
    _need(rate_problem(rate) is None, where, "sample_rate_hz", rate_problem(rate))
    window, stride = content.get("window_steps"), content.get("stride_steps")
    _need(window is None or (_is_whole(window) and MIN_WINDOW_STEPS <= window <= MAX_WINDOW_STEPS), where,
          "window_steps", f"a whole number of at least {MIN_WINDOW_STEPS} and at most {MAX_WINDOW_STEPS:,} (22 "
          "minutes at 50 Hz)")
    _need(stride is None or (_is_whole(stride) and 1 <= stride <= (window or MAX_WINDOW_STEPS)), where,
          "stride_steps", f"a whole number between 1 and window_steps (at most {MAX_WINDOW_STEPS:,})")
    channels = _channels(content["channels"], where)
    class_names, labels = _classes(content["classes"], where)
    unlabelled = content.get("unlabelled", [])
    _need(isinstance(unlabelled, list) and all(_is_whole(v) or _is_name(v) for v in unlabelled)
          and len(set(unlabelled)) == len(unlabelled) and not set(unlabelled) & set(labels), where, "unlabelled",
          "a list of distinct label values that are no class's label")
    return Description(float(rate), tuple(c["name"] for c in channels), tuple(c.get("sensor") for c in channels),
                       tuple(c.get("axis") for c in channels), tuple(c.get("unit") for c in channels),
                       class_names, labels, tuple(unlabelled), window, stride, where)


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
