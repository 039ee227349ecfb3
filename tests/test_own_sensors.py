"""Data that is not UCI HAR's: other rates and time stamps, label schemes, channel sets, one person."""
import json

import numpy as np
import pytest

from data.errors import DataError
from data.npz_windows import load_npz_windows
from data.recordings import Recording
from data.resample import on_model_clock
from data.sources import load_har_data
from data.splits import MIN_VALIDATION_SUBJECTS
from data.store import WindowStore
from inference_fixtures import RATE_HZ, synthetic_stream
from test_bad_input import assert_refused
from test_npz_dataset import RAW, windows, write_npz
from test_npz_dataset import train as train_npz
from test_predict import run_script
from test_store import build_here
from test_trust_numbers import build_refused


def millisecond_stamps(rate_hz, seconds):
    """A phone's time column: a steady clock written rounded to the millisecond."""
    return np.round(np.arange(int(seconds * rate_hz)) / rate_hz, 3)


@pytest.mark.parametrize("given_hz", [None, 64.0])
def test_rate_of_rounded_stamps_comes_from_the_whole_span(given_hz):
    time_s = millisecond_stamps(64.0, 60.0)
    assert set(np.round(np.diff(time_s), 3)) == {0.015, 0.016}  # the median step alone reads 62.5 Hz
    signals = np.sin(np.outer(time_s, [1.0, 2.0, 3.0]))
    _, _, _, source_hz = on_model_clock(Recording(signals, None, time_s, "r"), RATE_HZ, given_hz)
    assert source_hz == pytest.approx(64.0, rel=1e-3)
    if given_hz is not None:
        assert source_hz == given_hz  # the stamps agree within their rounding: the given rate wins


def test_a_given_rate_the_stamps_contradict_is_refused():
    time_s = millisecond_stamps(64.0, 60.0)
    with pytest.raises(DataError, match="--sample-rate 50 disagrees"):
        on_model_clock(Recording(np.zeros((len(time_s), 3)), None, time_s, "r"), RATE_HZ, 50.0)


def test_npz_labels_may_be_any_integers_or_names(tmp_path):
    arrays = windows(classes=2)
    write_npz(tmp_path / "ints.npz", **{**arrays, "labels": arrays["labels"] + 1})  # labels 1 and 2
    loaded = load_npz_windows(tmp_path / "ints.npz")
    assert loaded.class_names == ("class_1", "class_2")  # two classes, not an empty class_0 beside them
    np.testing.assert_array_equal(loaded.labels, arrays["labels"])
    names = np.array(["walk", "rest"])[arrays["labels"]]
    write_npz(tmp_path / "names.npz", **{**arrays, "labels": names})
    loaded = load_npz_windows(tmp_path / "names.npz")
    assert loaded.class_names == ("rest", "walk")
    np.testing.assert_array_equal(np.array(loaded.class_names)[loaded.labels], names)
    write_npz(tmp_path / "other.npz", **{**arrays, "labels": names}, class_names=np.array(["rest", "run"]))
    with pytest.raises(DataError, match="label 'walk' .* none of the classes' labels"):
        load_npz_windows(tmp_path / "other.npz")


def labelled_recordings(folder, labels_of):
    """Three subjects' recordings at 50 Hz whose label column is labels_of(time_s)."""
    folder.mkdir()
    for subject in (1, 2, 3):
        time_s, acc, gyro = synthetic_stream(30.0, rate_hz=50.0, seed=subject)
        np.savez(folder / f"s{subject}.npz", acc=acc, gyro=gyro, time_s=time_s, label=labels_of(time_s),
                 subject=np.full(len(time_s), subject))
    return folder


def test_a_zero_one_labelling_keeps_both_classes_or_is_refused(tmp_path):
    source = labelled_recordings(tmp_path / "recordings", lambda time_s: (time_s // 5).astype(int) % 2)
    line = build_refused(source, tmp_path / "refused", "--class-names", "rest,walk", "--test-subjects", "3")
    assert "label 0" in line and "--class-labels" in line and "--unlabelled" in line
    for flags, names in ((["--class-labels", "0,1,2"], "3 values for 2"), (["--unlabelled", "1"], "once")):
        assert names in build_refused(source, tmp_path / "refused", "--class-names", "rest,walk", *flags)
    build_here(source, tmp_path / "store", "--class-names", "rest,walk", "--class-labels", "0,1",
               "--test-subjects", "3")
    assert np.bincount(WindowStore(tmp_path / "store").labels).tolist()[0] > 0  # the 0 class is kept


def test_only_the_values_named_unlabelled_are_left_out(tmp_path):
    source = labelled_recordings(tmp_path / "recordings", lambda time_s: np.where(time_s % 10 < 6, 1 + (time_s // 10)
                                                                                  .astype(int) % 2, 9))
    build_here(source, tmp_path / "store", "--class-names", "rest,walk", "--unlabelled", "9", "--test-subjects", "3")
    store = WindowStore(tmp_path / "store")
    assert set(store.labels.tolist()) == {0, 1} and "9" in store.manifest["label_rule"]


ANKLE_HIP_WRIST = tuple(f"{place}_{axis}" for place in ("ankle", "hip", "wrist")
                        for axis in ("horiz_fwd", "vert", "horiz_lat"))


def three_accelerometer_run(tmp_path, **declared):
    """A run trained on windows of 9 channels of another device at 32 Hz, and a recording of that device."""
    path = write_npz(tmp_path / "w.npz", **windows(channels=9, steps=64), channel_names=np.array(ANKLE_HIP_WRIST),
                     sample_rate_hz=np.array(32.0), **declared)
    code, _, err = train_npz(path, tmp_path / "run")
    assert code == 0, err
    time_s = np.arange(32 * 20) / 32.0
    columns = np.column_stack([time_s, np.sin(np.outer(time_s, np.arange(1, 10)))])
    recording = tmp_path / "device.csv"
    np.savetxt(recording, columns, delimiter=",", header=",".join(("time_s", *ANKLE_HIP_WRIST)), comments="")
    return tmp_path / "run" / "best.pt", recording


def test_a_recording_of_the_checkpoints_own_channels_goes_through(tmp_path):
    checkpoint, recording = three_accelerometer_run(tmp_path, preprocessing=np.array("raw"))
    code, out, err = run_script("predict", ["--checkpoint", checkpoint, "--recording", recording, "--out",
                                            tmp_path / "out"])
    assert code == 0, err
    assert len((tmp_path / "out" / "windows.csv").read_text().splitlines()) > 1 + 5


def test_a_checkpoint_of_unknown_preprocessing_is_refused_for_its_real_reason(tmp_path):
    checkpoint, recording = three_accelerometer_run(tmp_path)
    line = assert_refused(run_script("predict", ["--checkpoint", checkpoint, "--recording", recording, "--out",
                                                 tmp_path / "out"]), "preprocessing is unknown", "preprocessing")
    assert "unknown column" not in line and not (tmp_path / "out").exists()


def test_an_accelerometer_alone_makes_a_store_of_its_three_channels(tmp_path):
    source = tmp_path / "recordings"
    source.mkdir()
    for subject in (1, 2, 3):
        time_s, acc, _ = synthetic_stream(30.0, rate_hz=50.0, seed=subject)
        np.savez(source / f"s{subject}.npz", acc=acc, time_s=time_s, label=1 + (time_s // 5).astype(int) % 2,
                 subject=np.full(len(time_s), subject))
    build_here(source, tmp_path / "store", "--preprocessing", "raw", "--class-names", "rest,walk",
               "--test-subjects", "3")
    assert WindowStore(tmp_path / "store").channels == ("acc_x", "acc_y", "acc_z")
    assert load_har_data("store", tmp_path / "store").train.signals.shape[1] == 3


def test_channels_named_take_some_of_what_the_recordings_give(tmp_path):
    # Recordings with a gyroscope, a store of their accelerometer alone: the windows of the same
    # recordings without their gyroscope.
    source = labelled_recordings(tmp_path / "recordings", lambda time_s: 1 + (time_s // 5).astype(int) % 2)
    (tmp_path / "acc").mkdir()
    for path in source.iterdir():
        arrays = dict(np.load(path))
        del arrays["gyro"]
        np.savez(tmp_path / "acc" / path.name, **arrays)
    flags = ("--preprocessing", "raw", "--class-names", "rest,walk", "--test-subjects", "3")
    build_here(source, tmp_path / "some", *flags, "--channels", "acc_x,acc_y,acc_z")
    build_here(tmp_path / "acc", tmp_path / "all", *flags)
    some, every = WindowStore(tmp_path / "some"), WindowStore(tmp_path / "all")
    assert some.channels == every.channels == ("acc_x", "acc_y", "acc_z")
    assert len(some) == len(every) > 0
    np.testing.assert_array_equal(some.read(np.arange(len(some))), every.read(np.arange(len(every))))


def test_one_persons_windows_are_tested_and_validated_on_their_end_without_flags(tmp_path):
    arrays = windows(subjects=1, per_subject=50)
    path = write_npz(tmp_path / "one.npz", **arrays)
    data = load_har_data("npz", path, val_fraction=0.25)
    np.testing.assert_array_equal(data.test.signals, arrays["signals"][40:])  # the last fifth tests
    np.testing.assert_array_equal(data.val.signals, arrays["signals"][30:40])  # the end of the rest validates
    np.testing.assert_array_equal(data.train.signals, arrays["signals"][:30])
    assert "the last part of each training subject's windows" in data.description
    # By default the head is then solved on all 40 training and validation windows; kept validated, it
    # is reported on those 10.
    code, out, err = train_npz(path, tmp_path / "run", "--final-model", "validated")
    assert code == 0, err
    assert (tmp_path / "run" / "val_report.json").is_file()


@pytest.mark.parametrize("people", [MIN_VALIDATION_SUBJECTS - 1, MIN_VALIDATION_SUBJECTS])
def test_few_training_people_validate_on_the_end_of_each_ones_windows_and_more_on_whole_people(people, tmp_path):
    arrays = windows(subjects=people + 1, per_subject=10)
    path = write_npz(tmp_path / "w.npz", **arrays, split=np.where(arrays["subjects"] > people, "test", "train"))
    data = load_har_data("npz", path, val_fraction=0.2)
    if people < MIN_VALIDATION_SUBJECTS:
        for person in range(1, people + 1):  # windows 8 and 9 of each person's 10 validate
            np.testing.assert_array_equal(data.val.signals[data.val.subjects == person],
                                          arrays["signals"][arrays["subjects"] == person][8:])
    else:
        assert not set(data.val.subjects.tolist()) & set(data.train.subjects.tolist())
        assert len(set(data.val.subjects.tolist())) == 1


def test_one_training_subject_among_others_validates_on_its_end(tmp_path):
    arrays = windows(subjects=2)
    path = write_npz(tmp_path / "w.npz", **arrays, split=np.where(arrays["subjects"] == 1, "train", "test"))
    data = load_har_data("npz", path, val_fraction=0.2)
    trained = arrays["signals"][arrays["subjects"] == 1]
    count = round(0.2 * len(trained))
    np.testing.assert_array_equal(data.val.signals, trained[-count:])
    np.testing.assert_array_equal(data.train.signals, trained[:-count])
    two = write_npz(tmp_path / "two.npz", **arrays)  # no split array: one person tests, the other trains
    data = load_har_data("npz", two, val_fraction=0.2)
    assert len(np.unique(data.test.subjects)) == 1 and len(np.unique(data.train.subjects)) == 1
    assert set(data.test.subjects).isdisjoint(data.train.subjects)


def test_a_class_without_training_windows_is_warned_of(tmp_path):
    arrays = windows(subjects=4, classes=3)
    arrays["labels"] = np.where(arrays["subjects"] == 4, 2, arrays["labels"] % 2)  # class c only in the test subject
    path = write_npz(tmp_path / "w.npz", **arrays, class_names=np.array(["a", "b", "c"]),
                     split=np.where(arrays["subjects"] == 4, "test", "train"))
    code, out, err = train_npz(path, tmp_path / "run", "--val-fraction", "0")
    assert code == 0, err
    assert "c have no training windows" in out + err


def test_windows_of_unequal_lengths_are_refused_for_what_they_are(tmp_path):
    arrays = windows()
    ragged = np.empty(len(arrays["labels"]), dtype=object)
    ragged[:] = [window[:, :30 + index % 5] for index, window in enumerate(arrays["signals"])]
    path = write_npz(tmp_path / "ragged.npz", **{**arrays, "signals": ragged})
    line = assert_refused(train_npz(path, tmp_path / "run"), "signals", "unequal lengths", "pad", "8 steps")
    assert "unicode" not in line


@pytest.mark.parametrize("flags", [["--head-fit", "adamw"], ["--model", "cnn1d", "--cv-folds", "2"]])
@pytest.mark.parametrize("channel_names, dropped", [(RAW, ["'flip'", "no class"]),
                                                      (ANKLE_HIP_WRIST, ["'rotate'", "'flip'", "x/y/z"])])
def test_augmentations_a_layout_does_not_support_are_dropped_in_one_line(channel_names, dropped, flags, tmp_path):
    arrays = windows(channels=len(channel_names))
    path = write_npz(tmp_path / "w.npz", **arrays, channel_names=np.array(channel_names),
                     class_names=np.array(["rest", "walk", "run"]))
    code, out, err = train_npz(path, tmp_path / "run", *flags)
    assert code == 0, err
    lines = [line for line in (out + err).splitlines() if line.startswith("warning:") and "augment" in line]
    assert len(lines) == 1, lines
    assert all(word in lines[0] for word in dropped), lines[0]


def test_one_persons_recording_validates_on_its_last_part(tmp_path):
    arrays = windows(subjects=1, per_subject=50)
    split = np.where(np.arange(50) < 40, "train", "test")  # the recording's last fifth tests
    path = write_npz(tmp_path / "w.npz", **arrays, split=split)
    data = load_har_data("npz", path, val_fraction=0.25, val_split="time")
    np.testing.assert_array_equal(data.val.signals, arrays["signals"][30:40])
    np.testing.assert_array_equal(data.train.signals, arrays["signals"][:30])
    code, out, err = train_npz(path, tmp_path / "run", "--val-split", "time", "--val-fraction", "0.25")
    assert code == 0, err
    assert (tmp_path / "run" / "val_report.json").is_file()
    assert_refused(train_npz(path, tmp_path / "cv", "--val-split", "time", "--cv-folds", "2"), "--cv-folds")


DEVICE_CHANNELS = ("ankle_fwd", "ankle_vert", "thigh_lat")


def device_recording(path, subject, seconds=40.0, rate_hz=32.0, labelled=True):
    """A recording of three named channels of another device: a calm and a lively class in turn."""
    time_s = np.arange(int(seconds * rate_hz)) / rate_hz
    label = 1 + (time_s // 5).astype(int) % 2
    values = np.sin(np.outer(time_s, [1.0, 2.5, 4.0]) + subject) * np.where(label == 2, 1.0, 0.1)[:, None]
    columns, names = [time_s, *values.T], ["time_s", *DEVICE_CHANNELS]
    if labelled:
        columns, names = columns + [label, np.full(len(time_s), subject)], names + ["label", "subject"]
    np.savetxt(path, np.column_stack(columns), delimiter=",", header=",".join(names), comments="")
    return path


def trained_then_classified(store, tmp_path, epochs):
    """The default model trained on `store` (into tmp_path/run), then a recording of the same device
    classified: the timeline's lines."""
    from conftest import run_in_process
    code, _, err = run_in_process("main.py", ["--dataset", "store", "--data-dir", store, "--epochs", str(epochs),
                                              "--no-figures", "--save-dir", tmp_path / "run"])
    assert code == 0, err
    recording = device_recording(tmp_path / "device.csv", 5, labelled=False)
    code, _, err = run_script("predict", ["--checkpoint", tmp_path / "run" / "best.pt", "--recording", recording,
                                          "--out", tmp_path / "out"])
    assert code == 0, err
    return (tmp_path / "out" / "timeline.csv").read_text().splitlines()


def test_another_devices_recordings_go_from_a_store_to_a_timeline_and_an_export(tmp_path):
    """Recordings of three named channels at 32 Hz: a store of exactly those channels, the default model
    trained on it, a recording of the same device classified into a timeline, and the model exported."""
    source = tmp_path / "recordings"
    source.mkdir()
    for subject in (1, 2, 3, 4):
        device_recording(source / f"s{subject}.csv", subject)
    build_here(source, tmp_path / "store", "--preprocessing", "raw", "--channels", ",".join(DEVICE_CHANNELS),
               "--sample-rate", "32", "--window-steps", "64", "--class-names", "calm,lively", "--test-subjects", "4")
    store = WindowStore(tmp_path / "store")
    assert store.channels == tuple(DEVICE_CHANNELS) and store.layout.sample_rate_hz == 32.0
    assert set(store.labels.tolist()) == {0, 1}
    timeline = trained_then_classified(tmp_path / "store", tmp_path, epochs=2)
    assert timeline[0].startswith("start_s") and len(timeline) > 2
    assert {row.split(",")[2] for row in timeline[1:]} <= {"calm", "lively", "uncertain"}
    code, _, err = run_script("export", ["--checkpoint", tmp_path / "run" / "best.pt", "--format", "torchscript",
                                         "--out", tmp_path / "model.pt"])
    assert code == 0, err


@pytest.mark.parametrize("flags, says", [
    (["--channels", "ankle_fwd,ankle_vert"], "add --preprocessing raw"),
    (["--preprocessing", "raw", "--channels", "ankle_fwd,ankle_fwd"], "distinct columns"),
    (["--preprocessing", "raw", "--channels", "ankle_fwd,label"], "other than time_s, label and subject"),
])
def test_channels_the_converter_cannot_take_are_refused_in_one_line(tmp_path, flags, says):
    source = tmp_path / "recordings"
    source.mkdir()
    device_recording(source / "s1.csv", 1)
    assert says in build_refused(source, tmp_path / "store", "--class-names", "calm,lively", *flags)
    assert not (tmp_path / "store").exists()


def test_transitions_are_learnt_over_the_classes_and_labels_a_study_gives(tmp_path):
    """Two classes labelled 0 and 1, and 2 for stretches of no class: the file holds those classes, and
    the windows on either side of a stretch of 2 count as neighbours."""
    import json

    from inference.transitions import main as transitions_command
    from test_trust_inputs import run_command
    block = 640  # five windows of 128 at a stride of 64
    labels = np.concatenate([np.zeros(block), np.full(block, 2), np.ones(block), np.zeros(block)]).astype(np.int8)
    np.savez(tmp_path / "study.npz", u01_s0_label=labels, u02_s0_label=labels[::-1].copy())
    code, _, err = run_command(transitions_command, "--recordings", tmp_path / "study.npz", "--subjects", "1,2",
                               "--class-names", "calm,lively", "--class-labels", "0,1", "--out", tmp_path / "t.json")
    assert code == 0, err
    record = json.loads((tmp_path / "t.json").read_text())
    assert record["class_names"] == ["calm", "lively"] and np.array(record["counts"]).shape == (2, 2)
    counts = np.array(record["counts"])
    assert counts[0, 1] > 0 and counts[1, 0] > 0  # across the stretch of 2, and from lively back to calm
    assert counts.sum() > 4 * 8
    description = tmp_path / "d.json"  # the same classes said by a dataset description
    description.write_text(json.dumps({"sample_rate_hz": 50, "channels": [{"name": "a"}], "unlabelled": [2],
                                       "classes": [{"name": "calm", "label": 0}, {"name": "lively", "label": 1}]}))
    code, _, err = run_command(transitions_command, "--recordings", tmp_path / "study.npz", "--subjects", "1,2",
                               "--description", description, "--out", tmp_path / "described.json")
    assert code == 0, err
    described = json.loads((tmp_path / "described.json").read_text())
    assert (described["class_names"], described["counts"]) == (record["class_names"], record["counts"])
    kept = description.read_bytes()
    assert_refused(run_command(transitions_command, "--recordings", tmp_path / "study.npz", "--subjects", "1,2",
                               "--description", description, "--out", description, "--overwrite"), str(description))
    assert description.read_bytes() == kept  # an input named as --out is left as it was


@pytest.mark.parametrize("flags, says", [
    (["--class-names", "calm,lively", "--class-labels", "0"], "gives 1 values for 2"),
    (["--class-names", "calm,lively", "--class-labels", "0,0"], "give each value once"),
    (["--class-names", "calm,lively", "--class-labels", "0,x"], "whole numbers"),
    (["--class-names", "calm"], "at least two distinct classes"),
    (["--description", "d.json", "--class-names", "calm,lively"], "drop --class-names and --class-labels"),
])
def test_transitions_refuse_classes_they_cannot_learn_over(tmp_path, flags, says):
    from inference.transitions import main as transitions_command
    from test_trust_inputs import run_command
    np.savez(tmp_path / "study.npz", u01_s0_label=np.zeros(1280, np.int8))
    assert_refused(run_command(transitions_command, "--recordings", tmp_path / "study.npz", "--subjects", "1",
                               *flags, "--out", tmp_path / "t.json"), says)
    assert not (tmp_path / "t.json").exists()


def test_validation_windows_the_file_marks_validate(tmp_path):
    arrays = windows(subjects=3, per_subject=20)
    split = np.array((["train"] * 14 + ["val"] * 3 + ["test"] * 3) * 3)  # each person's last windows
    path = write_npz(tmp_path / "w.npz", **arrays, split=split)
    data = load_har_data("npz", path)
    np.testing.assert_array_equal(data.val.signals, arrays["signals"][split == "val"])
    np.testing.assert_array_equal(data.train.signals, arrays["signals"][split == "train"])
    np.testing.assert_array_equal(data.test.signals, arrays["signals"][split == "test"])
    assert "val 9 / its split array's 'val' windows" in data.description
    code, _, err = train_npz(path, tmp_path / "run", "--no-figures")
    assert code == 0, err
    assert json.loads((tmp_path / "run" / "val_report.json").read_text())["num_samples"] == 9
    assert_refused(train_npz(path, tmp_path / "other", "--val-subjects", "1"), "marks the validation windows",
                   "--val-subjects")
    assert_refused(train_npz(path, tmp_path / "other", "--val-split", "time"), "--val-split time")
    build_refused(path, tmp_path / "store")
