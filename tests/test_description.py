"""A dataset description (data/layout.py) read by --dataset npz, the store's converter, training
and predict.py: each field checked as it is read, data that contradicts it refused naming the field."""
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import run_in_process
from data.errors import DataError
from data.layout import read_layout
from data.npz_windows import load_npz_windows
from data.sources import load_har_data
from data.store import WindowStore
from test_bad_input import assert_refused
from test_npz_dataset import train as train_npz
from test_npz_dataset import windows, write_npz
from test_own_sensors import DEVICE_CHANNELS, device_recording, trained_then_classified
from test_predict import run_script
from test_store import build_here
from test_trust_numbers import build_refused

# Three channels of one ankle sensor whose names say nothing of axes, and one of another sensor.
ANKLE = [{"name": "fwd", "sensor": "ankle", "axis": "x", "unit": "g"},
         {"name": "side", "sensor": "ankle", "axis": "y", "unit": "g"},
         {"name": "up", "sensor": "ankle", "axis": "z", "unit": "g"},
         {"name": "pressure", "unit": "hPa"}]
CLASSES = [{"name": "rest", "label": 0}, {"name": "walk", "label": 1}, {"name": "run", "label": 2}]


def describe(path, **fields):
    content = {"sample_rate_hz": 25, "channels": ANKLE, "classes": CLASSES, "unlabelled": [-1], **fields}
    path.write_text(json.dumps({key: value for key, value in content.items() if value is not None}))
    return path


def test_a_description_places_each_sensors_axes_whatever_the_names(tmp_path):
    described = read_layout(describe(tmp_path / "d.json"))
    assert described.channels == ("fwd", "side", "up", "pressure")
    assert described.sensor_triples() == [[0, 1, 2]]
    assert described.units == ("g", "g", "g", "hPa")
    shuffled = [ANKLE[2], ANKLE[3], ANKLE[0], ANKLE[1]]  # z, another sensor, x, y
    assert read_layout(describe(tmp_path / "s.json", channels=shuffled)).sensor_triples() == [[2, 3, 0]]
    assert read_layout(describe(tmp_path / "two.json", channels=ANKLE[:2])).sensor_triples() == []
    again = read_layout(describe(tmp_path / "again.json", **read_layout(tmp_path / "d.json").as_json()))
    assert again.as_json() == described.as_json()


@pytest.mark.parametrize("fields, field", [
    ({"sample_rate_hz": None}, "'sample_rate_hz' must be given"),
    ({"sample_rate_hz": -5}, "'sample_rate_hz' must be a positive number"),
    ({"channels": [{"name": "a"}, {"name": "a"}]}, "'channels' must be distinct"),
    ({"channels": [{"name": "label"}]}, "'channels' must be distinct names other than time_s"),
    ({"channels": [{"name": "a", "axis": "w", "sensor": "s"}]}, "'axis' is x, y or z"),
    ({"channels": [{"name": "a", "axis": "x"}]}, "with its 'sensor'"),
    ({"channels": [{"name": "a", "colour": "red"}]}, "'channels' must be a list of objects"),
    ({"classes": [{"name": "rest", "label": 0}]}, "'classes' must be a list of at least two"),
    ({"classes": [{"name": "rest", "label": 0}, {"name": "walk", "label": 0}]}, "distinct labels"),
    ({"unlabelled": [1]}, "'unlabelled' must be a list of distinct label values that are no class's"),
    ({"window_steps": 4}, "'window_steps' must be a whole number of at least 8"),
    ({"window_steps": 32, "stride_steps": 64}, "'stride_steps' must be a whole number between 1 and window_steps"),
    ({"rate": 25}, "'rate' must be left out"),
])
def test_a_description_that_is_not_one_is_refused_naming_the_field(fields, field, tmp_path):
    with pytest.raises(DataError, match=re.escape(field)):
        read_layout(describe(tmp_path / "d.json", **fields))


def test_npz_windows_read_by_a_description(tmp_path):
    arrays = windows(channels=4, steps=40)
    labels = arrays["labels"].copy()
    labels[::5] = -1  # unlabelled stretches
    path = write_npz(tmp_path / "w.npz", **{**arrays, "labels": labels})
    described = read_layout(describe(tmp_path / "d.json", window_steps=40))
    loaded = load_npz_windows(path, described)
    kept = labels >= 0
    assert loaded.unlabelled_windows == int((~kept).sum()) > 0
    np.testing.assert_array_equal(loaded.labels, labels[kept])
    np.testing.assert_array_equal(loaded.signals, arrays["signals"][kept])
    assert loaded.channel_names == described.channels and loaded.class_names == ("rest", "walk", "run")
    assert (loaded.sample_rate_hz, loaded.preprocessing) == (25.0, "raw")
    data = load_har_data("npz", path, description=tmp_path / "d.json")
    assert data.sensor_triples() == [[0, 1, 2]] and "unlabelled windows left out" in data.description
    assert data.identity != load_har_data("npz", path, description=describe(tmp_path / "e.json", sample_rate_hz=50)
                                          ).identity  # another description is other data to a resume


@pytest.mark.parametrize("arrays, says", [
    ({"channel_names": np.array(["a", "b", "c", "d"])}, "holds channels a, b, c, d but"),
    ({"sample_rate_hz": np.array(50.0)}, "holds sample_rate_hz 50 but"),
    ({"signals": np.zeros((48, 3, 40), np.float32)}, "signals hold 3 channels but"),
    ({"labels": np.full(48, 7)}, "label 7 (48 times) is none of the classes' labels"),
    ({"class_names": np.array(["a", "b", "c"])}, "holds classes a, b, c but"),
    ({"labels": np.full(48, -1)}, "every window's label means no class"),
    ({"labels": np.repeat([0, -1], 24), "split": np.repeat(["train", "test"], 24)},
     "every test window's label means no class"),
])
def test_npz_windows_that_contradict_their_description_are_refused_naming_the_field(arrays, says, tmp_path):
    path = write_npz(tmp_path / "w.npz", **{**windows(channels=4, steps=40), **arrays})
    with pytest.raises(DataError, match=re.escape(says)):
        load_npz_windows(path, read_layout(describe(tmp_path / "d.json")))


def test_training_turns_the_sensor_a_description_places_and_keeps_the_description(tmp_path):
    path = write_npz(tmp_path / "w.npz", **windows(channels=4, steps=40))
    code, out, err = train_npz(path, tmp_path / "plain", "--head-fit", "adamw", "--no-figures")
    assert code == 0, err
    assert "without 'rotate' and 'flip': these channels have no x/y/z triples" in out + err
    code, out, err = train_npz(path, tmp_path / "described", "--head-fit", "adamw", "--no-figures",
                               "--description", describe(tmp_path / "d.json"))
    assert code == 0, err
    assert "no x/y/z triples" not in out + err
    checkpoint = torch.load(tmp_path / "described" / "best.pt", weights_only=True)
    assert checkpoint["description"]["channels"] == ANKLE and checkpoint["channel_names"] == ["fwd", "side", "up",
                                                                                              "pressure"]
    named = write_npz(tmp_path / "named.npz", **windows(channels=4, steps=40), channel_names=np.array(list("abcd")))
    assert_refused(train_npz(named, tmp_path / "refused", "--description", tmp_path / "d.json"), "holds channels a, b",
                   "correct the field 'channels'")
    assert_refused(run_in_process("main.py", ["--dataset", "synthetic", "--description", tmp_path / "d.json",
                                              "--save-dir", tmp_path / "synthetic"]), "--description", "npz")
    (tmp_path / "d.json").unlink()  # moved away: an evaluation reads the windows by the checkpoint's description
    code, _, err = run_script("predict", ["--checkpoint", tmp_path / "described" / "best.pt", "--data-dir", path,
                                          "--out", tmp_path / "evaluated"])
    assert code == 0, err
    report, trained = (json.loads((folder / "test_report.json").read_text())
                       for folder in (tmp_path / "evaluated", tmp_path / "described"))
    assert (report["accuracy"], report["num_samples"]) == (trained["accuracy"], trained["num_samples"])


def test_the_converter_reads_an_npz_by_its_description_whose_labels_may_be_names(tmp_path):
    arrays = windows(channels=4, steps=40)
    names = np.array(["rest", "walk", "run", "none"])[np.where(np.arange(48) % 7 == 0, 3, arrays["labels"])]
    path = write_npz(tmp_path / "w.npz", **{**arrays, "labels": names})
    classes = [{"name": name, "label": name} for name in ("rest", "walk", "run")]
    build_here(path, tmp_path / "store", "--description", str(describe(tmp_path / "d.json", classes=classes,
                                                                       unlabelled=["none"])))
    store, loaded = WindowStore(tmp_path / "store"), load_npz_windows(path, read_layout(tmp_path / "d.json"))
    assert store.layout.class_names == ("rest", "walk", "run") and len(store) == len(loaded.labels) < 48
    assert sorted(store.labels.tolist()) == sorted(loaded.labels.tolist())


def device_description(path, **fields):
    channels = [{"name": name, "sensor": "leg", "axis": axis, "unit": "g"}
                for name, axis in zip(DEVICE_CHANNELS, "xyz", strict=True)]
    content = {"sample_rate_hz": 32, "window_steps": 64, "channels": channels,
               "classes": [{"name": "calm", "label": 1}, {"name": "lively", "label": 2}], **fields}
    path.write_text(json.dumps(content))
    return path


def test_the_converter_takes_a_description_for_its_flags_and_the_store_keeps_it(tmp_path):
    source = tmp_path / "recordings"
    source.mkdir()
    for subject in (1, 2, 3, 4):
        device_recording(source / f"s{subject}.csv", subject)
    description = str(device_description(tmp_path / "d.json"))
    assert "--sample-rate 50.0 disagrees with" in build_refused(source, tmp_path / "refused", "--description",
                                                                description, "--sample-rate", "50")
    assert "'classes' must give whole-number labels" in build_refused(
        source, tmp_path / "refused", "--description", str(device_description(
            tmp_path / "names.json", classes=[{"name": "calm", "label": "c"}, {"name": "lively", "label": "l"}])))
    assert "--class-names ca lm,lively disagrees" in build_refused(source, tmp_path / "refused", "--description",
                                                                   description, "--class-names", "ca lm,lively")
    assert not (tmp_path / "refused").exists()
    build_here(source, tmp_path / "store", "--description", description, "--sample-rate", "32",
               "--class-names", "calm, lively", "--test-subjects", "4")
    flags = tmp_path / "flags"
    build_here(source, flags, "--preprocessing", "raw", "--channels", ",".join(DEVICE_CHANNELS), "--sample-rate",
               "32", "--window-steps", "64", "--class-names", "calm,lively", "--test-subjects", "4")
    other = device_description(tmp_path / "other.json", channels=[{"name": name, "unit": "m/s2"}
                                                                  for name in DEVICE_CHANNELS])
    # The other description's units make another layout: its channels' field names it.
    assert "whose channels is" in build_refused(source, tmp_path / "store", "--description", str(other),
                                                "--test-subjects", "4", "--dtype", "float32")  # its windows stay
    store, by_flags = WindowStore(tmp_path / "store"), WindowStore(flags)
    assert store.manifest["description"] == json.loads(Path(description).read_text()) | {"unlabelled": []}
    np.testing.assert_array_equal(store.labels, by_flags.labels)  # the same windows as the flags make
    np.testing.assert_array_equal(store.read(np.arange(len(store))), by_flags.read(np.arange(len(by_flags))))
    data = load_har_data("store", tmp_path / "store")
    assert data.sensor_triples() == [[0, 1, 2]] and data.described.units == ("g", "g", "g")
    assert len(trained_then_classified(tmp_path / "store", tmp_path, epochs=1)) > 2
