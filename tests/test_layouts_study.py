"""The layouts study's windows, recordings and baseline path, on a few synthetic recordings of the
development archive's keys (no real data needed)."""
import argparse
import contextlib
import io
import json
import sys
import types

import numpy as np
import pytest

from data.layout import read_layout
from data.npz_windows import load_npz_windows
from data.recordings import read_recording
from data.uci_har import CLASS_NAMES
from studies import layouts
from studies.layout_windows import LAYOUTS, ONE_PERSON, THREE_CLASSES, cut_layout, read_recordings, write_recording
from studies.layouts import format_table, run_step
from studies.public_sets import write_public_set
from training.entry_point import run_entry_point

RATE_HZ = 50
STRETCH_S = 12  # long enough for one 10 s window
PROTOCOL = (5, 4, 6, 1, 2, 3)  # the activities in the recordings' order, the stairs last
SUBJECTS = (ONE_PERSON, 3, 5)  # 3 is one of the default test people
SINE_HZ = 0.5


def fake_recording(seed):
    """acc x a slow sine, the rest noise; each activity a stretch, with a transition (7) and unlabelled
    samples (-1) between them."""
    labels = []
    for activity in PROTOCOL:
        labels += [-1] * RATE_HZ + [activity] * (STRETCH_S * RATE_HZ) + [7] * (RATE_HZ // 2)
    labels = np.array(labels, dtype=np.int8)
    rng = np.random.default_rng(seed)
    acc = rng.normal(scale=0.1, size=(len(labels), 3)).astype(np.float32)
    acc[:, 0] = np.sin(2 * np.pi * SINE_HZ * np.arange(len(labels)) / RATE_HZ)
    gyro = rng.normal(size=(len(labels), 3)).astype(np.float32)
    return {"acc": acc, "gyro": gyro, "label": labels}


@pytest.fixture(scope="module")
def recordings(tmp_path_factory):
    """Read back through the study's own reader from an archive of the real one's keys."""
    arrays = {}
    for subject in SUBJECTS:
        for take in range(2 if subject == ONE_PERSON else 1):
            for part, values in fake_recording(10 * subject + take).items():
                arrays[f"u{subject:02d}_s{take}_{part}"] = values
    path = tmp_path_factory.mktemp("recordings") / "recordings.npz"
    np.savez(path, **arrays)
    return read_recordings(path)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_each_layout_is_an_npz_the_trainer_reads(recordings, name, tmp_path):
    layout = LAYOUTS[name]
    windows = cut_layout(recordings, layout)
    windows.save(tmp_path / "windows.npz")
    read = load_npz_windows(tmp_path / "windows.npz")
    assert read.signals.shape == (len(windows.labels), len(layout.channel_names), layout.window_steps)
    assert read.sample_rate_hz == layout.rate_hz
    assert read.channel_names == layout.channel_names
    assert read.preprocessing == "raw"
    if layout.time_split_by:
        assert set(read.subjects.tolist()) == {ONE_PERSON}
    else:
        assert set(read.subjects.tolist()) == set(SUBJECTS)
        assert np.array_equal(read.split == "test", read.subjects == 3)


def test_the_described_layout_gives_its_channels_sensors_and_axes_for_rotation(recordings, tmp_path):
    windows = cut_layout(recordings, LAYOUTS["device-names-described"])
    path = tmp_path / "description.json"
    path.write_text(json.dumps(windows.description()))
    description = read_layout(path)
    assert description.sensor_triples() == [[0, 1, 2], [3, 4, 5]]  # acc, then gyro: what rotate and flip turn
    windows.save(tmp_path / "windows.npz")
    read = load_npz_windows(tmp_path / "windows.npz", description)  # the file and its description agree
    assert read.channel_names == LAYOUTS["device-names"].channel_names and np.array_equal(read.labels, windows.labels)


def test_layout_sizes():
    assert LAYOUTS["20hz"].window_steps == 60 and LAYOUTS["20hz"].stride_steps == 30
    assert LAYOUTS["100hz"].window_steps == 256 and LAYOUTS["10s"].window_steps == 500
    assert LAYOUTS["acc-only"].channel_names == ("acc_x", "acc_y", "acc_z")
    assert not any(name.endswith(("_x", "_y", "_z")) for name in LAYOUTS["device-names"].channel_names)


@pytest.mark.parametrize("name", ["20hz", "100hz", "10s"])
def test_windows_hold_the_recording_at_the_layouts_rate(recordings, name):
    """acc x is a sine: each window's first channel is that sine at the window's times at the new rate."""
    layout = LAYOUTS[name]
    windows = cut_layout(recordings, layout)
    times_s = (windows.start_step[:, None] + np.arange(layout.window_steps)[None, :]) / layout.rate_hz
    np.testing.assert_allclose(windows.signals[:, 0], np.sin(2 * np.pi * SINE_HZ * times_s), atol=0.02)


@pytest.mark.parametrize("name", ["acc-only", "20hz", "100hz", "10s"])
def test_every_window_lies_inside_one_activity(recordings, name):
    layout = LAYOUTS[name]
    windows = cut_layout(recordings, layout)
    assert set(windows.labels.tolist()) == set(range(6)) and windows.class_names == CLASS_NAMES
    for recording, start, label in zip(windows.recording, windows.start_step, windows.labels, strict=True):
        # the recorded samples the window covers, back at 50 Hz
        first = int(np.floor(start * RATE_HZ / layout.rate_hz))
        last = int(np.floor((start + layout.window_steps - 1) * RATE_HZ / layout.rate_hz))
        assert set(recordings[recording]["label"][first:last + 1].tolist()) == {label + 1}


def test_labels_from_zero_make_class_zero_a_real_class(recordings, tmp_path):
    windows = cut_layout(recordings, LAYOUTS["labels-0"])
    six = cut_layout(recordings, LAYOUTS["device-names"])  # the same windows with the six labels
    assert np.array_equal(windows.labels, [THREE_CLASSES[label + 1] for label in six.labels])
    assert np.sum(windows.labels == 0) == np.sum(six.labels <= 2)  # the three walking activities
    windows.save(tmp_path / "three.npz")
    read = load_npz_windows(tmp_path / "three.npz")
    assert read.class_names == ("class_0", "class_1", "class_2") and set(read.labels.tolist()) == {0, 1, 2}


@pytest.mark.parametrize(("name", "by_activity"), [("one-person", False), ("one-person-each-activity", True)])
def test_one_person_trains_on_the_past_and_is_tested_on_the_future(recordings, name, by_activity):
    layout = LAYOUTS[name]
    windows = cut_layout(recordings, layout)
    assert set(windows.recording.tolist()) == {f"u{ONE_PERSON:02d}_s0", f"u{ONE_PERSON:02d}_s1"}
    groups = {(r, label if by_activity else None) for r, label in zip(windows.recording, windows.labels, strict=True)}
    for recording, label in groups:
        mine = (windows.recording == recording) & ((windows.labels == label) if by_activity else True)
        train = windows.start_step[mine & (windows.split == "train")]
        test = windows.start_step[mine & (windows.split == "test")]
        assert len(train) and len(test)
        assert train.max() + layout.window_steps <= test.min()  # not a sample shared
        assert 0.6 <= len(train) / (len(train) + len(test)) <= 0.9
    tested = set(windows.labels[windows.split == "test"].tolist())
    assert tested == (set(range(6)) if by_activity else {1, 2})  # the stairs, last in every recording


@pytest.mark.parametrize("name", ["acc-only", "20hz", "device-names"])
def test_recording_file_reads_back_in_the_layouts_channels_and_rate(recordings, name, tmp_path):
    layout = LAYOUTS[name]
    source = recordings["u03_s0"]
    write_recording(source, layout, tmp_path / "recording.npz")
    channels = layout.channel_names if layout.device_names else ()
    read = read_recording(tmp_path / "recording.npz", channels=channels)
    expected = round(len(source["label"]) * layout.rate_hz / RATE_HZ)
    assert len(read) == expected
    np.testing.assert_allclose(np.diff(read.time_s), 1 / layout.rate_hz)
    if layout.device_names:
        assert read.acc_g is None and set(read.extra) == set(layout.channel_names)
    else:
        assert read.acc_g.shape == (expected, 3)
        assert (read.gyro_rad_s is None) == ("gyro" not in layout.sensors)


def test_the_baseline_reads_an_npz_of_windows(recordings, tmp_path, monkeypatch):
    """Its own split array decides the test windows; aeon's classifier is replaced by one that always
    answers the most common training class, so the accuracy is known, and the study runs where aeon is
    not installed (CI)."""
    class MostCommon:
        def __init__(self, **_):
            self.answer = None

        def fit(self, signals, labels):
            self.answer = np.bincount(labels).argmax()

        def predict(self, signals):
            return np.full(len(signals), self.answer)

    for name in ("aeon", "aeon.classification"):  # the real packages where aeon is installed, else empty ones
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name) or types.ModuleType(name))
    convolution_based = types.ModuleType("aeon.classification.convolution_based")
    convolution_based.MiniRocketClassifier = MostCommon
    monkeypatch.setitem(sys.modules, convolution_based.__name__, convolution_based)
    from studies import minirocket_baseline
    windows = cut_layout(recordings, LAYOUTS["labels-0"])
    windows.save(tmp_path / "windows.npz")
    assert minirocket_baseline.main(["--dataset", "npz", "--data-dir", str(tmp_path / "windows.npz"),
                                     "--json", str(tmp_path / "out.json")]) == 0
    run = json.loads((tmp_path / "out.json").read_text())["runs"][-1]
    answer = np.bincount(windows.labels[windows.split == "train"]).argmax()
    tested = windows.labels[windows.split == "test"]
    assert run["accuracy"] == pytest.approx(np.mean(tested == answer))
    assert set(run["per_subject"]) == {"3"} and run["per_subject"]["3"]["windows"] == len(tested)


def test_a_failed_step_keeps_its_error_line_and_the_table_says_so():
    step = run_step([sys.executable, "-c", "import sys; print('noise', file=sys.stderr); sys.exit('error: no way')"])
    assert not step["ok"] and step["error"] == "exit 1: error: no way"
    assert step["other_cores"] is None or step["other_cores"] >= 0
    ran = {"ok": True, "wall_s": 10.0, "accuracy": 0.9, "worst_subject": "3", "worst_accuracy": 0.8,
           "command": "python x", "error": None}
    row = {"layout": "one-person", "about": "about", "train_windows": 10, "test_windows": 5, "channels": 6,
           "steps": 128, "rate_hz": 50.0, "classes": 6, "test_classes": 2, "recording": "u01_s0 (person 1)",
           "ours": [step], "aeon": [ran], "end_to_end": {"trained": {**step, "error": "no best.pt"}}}
    table = format_table([row])
    assert "| one-person | 10/5 | 6 | 128 (50) | 6 (2) | - / failed / " in table
    assert "0.9000 / 0.800 (3) / 10.0 | - | - | no: trained |" in table
    assert "FAILED one-person, ours: python -c" in table and "error: no way" in table


def test_seeds_run_one_round_each_and_the_table_gives_their_mean_the_lowest_worst_person_and_the_gaps(
        monkeypatch, tmp_path):
    commands = []
    monkeypatch.setattr(layouts, "run_step", lambda command: commands.append(command) or
                        {"ok": False, "wall_s": 1.0, "error": "stopped", "other_cores": 0.0})
    opts = argparse.Namespace(seed=None, seeds=[42, 1], threads=2)
    for round_index in (0, 1):
        for side in layouts.SIDES:
            layouts.side_runner(side, tmp_path / "l.npz", tmp_path, opts)(round_index)
    texts = [" ".join(map(str, command)) for command in commands]
    assert "--seed 42" in texts[0] and "--kernel-seeds 42" in texts[1]
    assert "--seed 1" in texts[2] and "--kernel-seeds 1" in texts[3]

    def run(accuracy, worst, subject):
        return {"ok": True, "wall_s": 10.0, "accuracy": accuracy, "worst_accuracy": worst, "worst_subject": subject,
                "other_cores": 0.0}
    rows = [{"layout": name, "about": "", "recording": "", "train_windows": 1, "test_windows": 1, "channels": 1,
             "steps": 1, "rate_hz": None, "classes": 2, "test_classes": 2, "end_to_end": {},
             "ours": [run(a, 0.8, 3), run(b, 0.7, 7)], "aeon": [run(0.9, 0.9, 3), run(0.9, 0.9, 3)]}
            for name, a, b in (("one", 0.95, 0.93), ("two", 0.88, 0.88))]
    table = layouts.format_table(rows)
    assert "| 0.9400 / 0.700 (7) / 10.0 | 0.9000 / 0.900 (3) / 10.0 | +4.00 |" in table
    assert "ours - aeon over 2 set(s): mean +1.00 points, worst -2.00 (two)" in table


def run_in_process_study(argv):
    """(exit code, stdout, stderr) of the study's command line, run here."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = run_entry_point(layouts.main, list(map(str, argv)))
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def test_seeds_and_seed_together_are_one_line(tmp_path):
    code, out, err = run_in_process_study(["--seeds", "1,2", "--seed", "3", "--recordings", tmp_path / "none"])
    assert code == 2 and "give it or --seed, not both" in err and "Traceback" not in err


@pytest.mark.parametrize("seed", [None, 3])
def test_each_side_runs_its_own_command_with_the_seed_and_description_given(monkeypatch, tmp_path, seed):
    commands = []
    stopped = {"ok": False, "wall_s": 1.0, "error": "stopped", "other_cores": 0.0}
    monkeypatch.setattr(layouts, "run_step", lambda command: commands.append(command) or stopped)
    opts = argparse.Namespace(seed=seed, seeds=None, threads=2)
    for side in layouts.SIDES:
        layouts.side_runner(side, tmp_path / "l.npz", tmp_path, opts, tmp_path / "l.json")(0)
    ours, aeon = (" ".join(map(str, command[1:])) for command in commands)
    assert ours.startswith("main.py --dataset npz") and f"--description {tmp_path / 'l.json'}" in ours
    assert "studies.minirocket_baseline" in aeon and "--description" not in aeon and "--threads 2" in aeon
    assert ("--seed 3" in ours and "--kernel-seeds 3" in aeon) if seed else ("--seed" not in ours + aeon)


def test_a_public_set_keeps_its_split_and_pads_each_series_with_its_last_value(tmp_path):
    datasets = pytest.importorskip("aeon.datasets")
    train, test, channels, steps, classes, padded = write_public_set("JapaneseVowels", tmp_path / "jv.npz")
    assert (train, test, channels, classes, padded) == (270, 370, 12, 9, True)
    windows = load_npz_windows(tmp_path / "jv.npz")
    series, _ = datasets.load_classification("JapaneseVowels", split="train")
    shortest = min(range(len(series)), key=lambda index: series[index].shape[-1])
    length = series[shortest].shape[-1]
    assert windows.signals.shape[2] == steps > length
    np.testing.assert_array_equal(windows.signals[shortest, :, :length], series[shortest].astype(np.float32))
    assert np.all(windows.signals[shortest, :, length:] == windows.signals[shortest, :, length - 1:length])
    assert list(windows.split[:train]) == ["train"] * train and set(windows.split[train:]) == {"test"}
