"""The store's converter, an .npz of windows and a description: a refused build leaves no trace, a
user's own data gives no silent wrong answer, each refusal names where the problem came from, and a
description is read within the bounds its format allows."""
import json

import numpy as np
import pytest

from conftest import run_in_process
from data import build_store
from data.store import WindowStore
from test_bad_input import assert_refused, snapshot
from test_npz_dataset import windows, write_npz
from test_own_sensors import DEVICE_CHANNELS, device_recording
from test_store import build_here, store_bytes, write_recording
from test_trust_inputs import run_command


def build(source, out, *flags):
    """data.build_store through the command line's wrapper, in this process with one worker."""
    return run_command(build_store.main, source, "--out", out, "--workers", "1", *flags)


def recordings(folder, subjects=(1, 2, 3), short=(), bad_labels=()):
    """Labelled recordings of 30 s at 50 Hz, one per subject; `short` ones hold one second, `bad_labels`
    ones a label that is no class's."""
    folder.mkdir(exist_ok=True)
    for subject in subjects:
        write_recording(folder, f"s{subject}.npz", subject, seed=subject)
        if subject in short or subject in bad_labels:
            arrays = dict(np.load(folder / f"s{subject}.npz"))
            if subject in short:
                arrays = {name: values[:50] for name, values in arrays.items()}
            if subject in bad_labels:
                arrays["label"] = np.full_like(arrays["label"], 9)
            np.savez(folder / f"s{subject}.npz", **arrays)
    return folder


def npz_of_windows(path, **changes):
    """A valid .npz of windows (4 subjects, 4 channels of 40 steps at 25 Hz), with `changes` applied."""
    arrays = {**windows(channels=4, steps=40), "sample_rate_hz": np.float64(25.0), **changes}
    return write_npz(path, **arrays)


def description(path, channels=("fwd", "side", "up"), classes=("calm", "lively"), **fields):
    content = {"sample_rate_hz": 32, "channels": [{"name": name} for name in channels],
               "classes": [{"name": name, "label": label} for label, name in enumerate(classes, start=1)], **fields}
    path.write_text(json.dumps(content))
    return path


def device_recordings(folder):
    folder.mkdir()
    for subject in (1, 2, 3):
        device_recording(folder / f"s{subject}.csv", subject)
    return folder


# ---------------------------------------------------------------------------
# 1. A refused build leaves no trace, and a folder is a store's only by the store's own records
# ---------------------------------------------------------------------------

def test_a_users_labels_beside_an_empty_shards_folder_are_no_unfinished_store(tmp_path):
    source = recordings(tmp_path / "recordings")
    out = tmp_path / "mine"
    (out / "shards").mkdir(parents=True)
    np.save(out / "labels.npy", np.arange(5))
    before = snapshot(out)
    assert_refused(build(source, out, "--test-subjects", "2"), str(out), "holds other files and no store")
    assert snapshot(out) == before and list((out / "shards").iterdir()) == []


REFUSED_BUILDS = {
    "labels outside the classes": ({"bad_labels": (3,)}, [], ["s3.npz", "label 9"]),
    "a test subject the recordings lack": ({}, ["--test-subjects", "9"], ["--test-subjects", "(1,2,3)"]),
    "every recording shorter than a window": ({"short": (1, 2, 3)}, [],
                                              ["no recording gave a window", "shorter than one window"]),
}


@pytest.mark.parametrize("case", sorted(REFUSED_BUILDS))
def test_a_build_refused_while_converting_removes_the_folder_it_created(tmp_path, case):
    made, flags, says = REFUSED_BUILDS[case]
    source = recordings(tmp_path / "recordings", **made)
    assert_refused(build(source, tmp_path / "new" / "store", *flags), *says)
    assert not (tmp_path / "new").exists()  # the folders it made, the one above --out too


def test_windows_whose_test_subject_is_missing_are_refused_before_anything_is_written(tmp_path):
    source = npz_of_windows(tmp_path / "windows.npz")
    assert_refused(build(source, tmp_path / "store", "--test-subjects", "99"), "test subjects 99", "(1,2,3,4)")
    assert not (tmp_path / "store").exists()


def test_a_refused_build_in_an_empty_folder_leaves_it_empty(tmp_path):
    source = recordings(tmp_path / "recordings", bad_labels=(3,))
    (tmp_path / "empty").mkdir()
    assert_refused(build(source, tmp_path / "empty"), "label 9")
    assert list((tmp_path / "empty").iterdir()) == []


def test_a_refused_update_leaves_a_finished_store_as_it_was(tmp_path):
    source = recordings(tmp_path / "recordings")
    out = tmp_path / "store"
    build_here(source, out, "--test-subjects", "2")
    before = snapshot(out)
    (source / "s3.npz").unlink()  # a recording removed: its shards must outlive a refused update
    recordings(source, subjects=(4, 5), bad_labels=(5,))  # one good recording added, one refused
    assert_refused(build(source, out, "--test-subjects", "2", "--dtype", "float32"), "s5.npz", "label 9")
    assert snapshot(out) == before
    WindowStore(out)  # still whole: every shard its manifest lists is there
    (source / "s5.npz").unlink()
    printed = build_here(source, out, "--test-subjects", "2")
    assert "3 job(s), 2 already done" in printed and "removed 3 file(s)" in printed
    assert WindowStore(out).manifest["subjects"].keys() == {"1", "2", "4"}


RUN_JOB = build_store.run_job


def _cut_short_at_the_second_recording(arguments):
    if arguments[0]["name"] == "rec-s2.npz":
        raise KeyboardInterrupt  # as Ctrl-C stops the build there
    return RUN_JOB(arguments)


def test_a_build_cut_short_in_a_folder_it_created_continues(tmp_path, monkeypatch):
    # Not a refusal: the folder is the store's by its build record, and the same command goes on.
    source = recordings(tmp_path / "recordings")
    monkeypatch.setattr(build_store, "run_job", _cut_short_at_the_second_recording)  # the forked workers see it
    code, _, err = build(source, tmp_path / "store", "--test-subjects", "2", "--dtype", "float32")
    assert code == 130 and "interrupted" in err, err
    assert (tmp_path / "store" / "build.json").is_file() and not (tmp_path / "store" / "manifest.json").exists()
    finished = len(list((tmp_path / "store" / "shards").glob("*.json")))  # s1's, and s3's if it had started
    assert 1 <= finished <= 2
    monkeypatch.undo()
    printed = build_here(source, tmp_path / "store", "--test-subjects", "2")
    assert f"3 job(s), {finished} already done" in printed
    build_here(source, tmp_path / "fresh", "--test-subjects", "2")
    assert store_bytes(tmp_path / "store") == store_bytes(tmp_path / "fresh")


# ---------------------------------------------------------------------------
# 2. No silent wrong answer on a user's own data
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["time_s", "label", "subject"])
def test_windows_may_not_name_a_channel_as_a_recordings_own_column(tmp_path, name):
    source = npz_of_windows(tmp_path / "windows.npz", channel_names=np.array([name, "b", "c", "d"]))
    assert_refused(build(source, tmp_path / "store"), "channel_names", repr(name), "other than time_s")
    assert not (tmp_path / "store").exists()


def test_training_refuses_windows_with_a_time_s_channel(tmp_path):
    source = npz_of_windows(tmp_path / "windows.npz", channel_names=np.array(["time_s", "b", "c", "d"]))
    assert_refused(run_in_process("main.py", ["--dataset", "npz", "--data-dir", source, "--epochs", "1",
                                              "--save-dir", tmp_path / "run"]), "channel_names", "'time_s'")
    assert not (tmp_path / "run").exists()


def test_a_recording_shorter_than_a_window_is_named_not_dropped_in_silence(tmp_path):
    source = recordings(tmp_path / "recordings", subjects=(1, 2, 3, 4), short=(4,))
    code, out, err = build(source, tmp_path / "store", "--test-subjects", "2")
    assert code == 0, err
    line = next(line for line in out.splitlines() if "s4.npz" in line)
    assert "left out 1 of 4 recordings" in line and "shorter than one window (128 steps at 50 Hz)" in line
    assert sorted(WindowStore(tmp_path / "store").manifest["subjects"]) == ["1", "2", "3"]  # it opens: none is 4's


@pytest.mark.parametrize("label", ["", "   "], ids=["empty", "blank"])
def test_an_empty_or_blank_label_is_no_class(tmp_path, label):
    arrays = windows(channels=4, steps=40)
    names = np.array([label, "walk", "run"])[arrays["labels"]]
    source = npz_of_windows(tmp_path / "windows.npz", labels=names)
    assert_refused(build(source, tmp_path / "store"), "labels", repr(label), "empty or blank")
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize("label", ["", "  "], ids=["empty", "blank"])
def test_a_csv_recording_with_an_empty_label_is_refused_and_the_build_taken_back(tmp_path, label):
    source = recordings(tmp_path / "recordings")
    arrays = dict(np.load(source / "s3.npz"))
    (source / "s3.npz").unlink()
    columns = ["time_s", "acc_x", "acc_y", "acc_z", "gyro_x", "gyro_y", "gyro_z", "label", "subject"]
    rows = [",".join(f"{value:.9g}" for value in row) for row in np.column_stack(
        [arrays["time_s"], arrays["acc"], arrays["gyro"], arrays["label"], arrays["subject"]])]
    rows[100] = ",".join([*rows[100].split(",")[:7], label, "3"])  # converted after s1 and s2
    (source / "s3.csv").write_text("\n".join([",".join(columns), *rows]) + "\n")
    assert_refused(build(source, tmp_path / "store"), "s3.csv", "line 102, column label", "not a number")
    assert not (tmp_path / "store").exists()


# ---------------------------------------------------------------------------
# 3. Messages that name where a bad name came from
# ---------------------------------------------------------------------------

def comma_source(tmp_path, where):
    """(source, flags) whose one class name holds a comma, said by `where`."""
    if where == "description":
        return device_recordings(tmp_path / "recordings"), [
            "--description", description(tmp_path / "d.json", channels=DEVICE_CHANNELS, classes=("calm", "brisk,fast")),
            "--test-subjects", "3"]
    if where == "class_names":
        return npz_of_windows(tmp_path / "w.npz", class_names=np.array(["rest", "walk", "run,jog"])), []
    arrays = windows(channels=4, steps=40)
    return npz_of_windows(tmp_path / "w.npz", labels=np.array(["rest", "walk", "run,jog"])[arrays["labels"]]), []


@pytest.mark.parametrize("where, names", [("description", ["d.json", "'classes'"]),
                                          ("class_names", ["w.npz", "class_names"]),
                                          ("labels", ["w.npz", "labels"])])
def test_a_class_name_holding_a_comma_is_refused_naming_where_it_came_from(tmp_path, where, names):
    source, flags = comma_source(tmp_path, where)
    line = assert_refused(build(source, tmp_path / "store", *flags), *names, "comma", "split in two")
    assert "--class-labels" not in line
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize("field", ["channel", "class"])
def test_a_described_name_with_whitespace_at_an_end_is_refused_by_the_first_reader(tmp_path, field):
    source = device_recordings(tmp_path / "recordings")
    channels = ("ankle_fwd ", *DEVICE_CHANNELS[1:]) if field == "channel" else DEVICE_CHANNELS
    classes = (" calm", "lively") if field == "class" else ("calm", "lively")
    described = description(tmp_path / "d.json", channels=channels, classes=classes)
    assert_refused(build(source, tmp_path / "store", "--description", described, "--test-subjects", "3"),
                   "d.json", "whitespace at either end")
    assert not (tmp_path / "store").exists()


def test_windows_naming_a_channel_with_whitespace_at_an_end_are_refused(tmp_path):
    source = npz_of_windows(tmp_path / "w.npz", channel_names=np.array(["a", "b ", "c", "d"]))
    assert_refused(build(source, tmp_path / "store"), "w.npz", "channel_names", "'b '", "whitespace")


# ---------------------------------------------------------------------------
# 4. A description read within the bounds of what one can be
# ---------------------------------------------------------------------------

DESCRIPTION_TEXTS = {
    "larger than 1 MiB": (lambda path: description(path, channels=DEVICE_CHANNELS).write_text(
        path.read_text() + " " * 2 ** 20), ["1,048,576 bytes"]),
    "nested 100,000 deep": (lambda path: path.write_text("[" * 100_000 + "]" * 100_000), ["deeper than can be read"]),
    "a number of 5,000 digits": (lambda path: path.write_text('{"sample_rate_hz": 1' + "0" * 5000 + "}"),
                                 ["not readable JSON"]),
}


@pytest.mark.parametrize("case", sorted(DESCRIPTION_TEXTS))
def test_a_description_that_cannot_be_one_is_refused_unread(tmp_path, case):
    write, says = DESCRIPTION_TEXTS[case]
    write(tmp_path / "d.json")
    source = device_recordings(tmp_path / "recordings")
    assert_refused(build(source, tmp_path / "store", "--description", tmp_path / "d.json"), "--description", *says)
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize("fields, names", [
    ({"sample_rate_hz": 1e30}, ["'sample_rate_hz'", "at most 10,000"]),
    ({"sample_rate_hz": 32, "window_steps": 10 ** 9}, ["'window_steps'", "at most 65,536"]),
    ({"sample_rate_hz": 32, "stride_steps": 10 ** 9}, ["'stride_steps'", "at most 65,536"]),
])
def test_a_description_number_beyond_its_bounds_is_refused_naming_the_field(tmp_path, fields, names):
    source = device_recordings(tmp_path / "recordings")
    described = description(tmp_path / "d.json", channels=DEVICE_CHANNELS, **fields)
    line = assert_refused(build(source, tmp_path / "store", "--description", described, "--test-subjects", "3"),
                          "d.json", *names)
    assert "--window-steps" not in line and "--stride" not in line
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize("given", ["flag", "npz"])
def test_a_rate_beyond_10_khz_is_refused_wherever_it_is_given(tmp_path, given):
    if given == "flag":
        source, flags = recordings(tmp_path / "recordings"), ["--sample-rate", "1e30"]
    else:
        source, flags = npz_of_windows(tmp_path / "w.npz", sample_rate_hz=np.float64(1e30)), []
    assert_refused(build(source, tmp_path / "store", *flags), "at most 10,000")
    assert not (tmp_path / "store").exists()


def test_a_source_of_one_subject_is_refused_in_the_converters_own_terms(tmp_path):
    one = npz_of_windows(tmp_path / "one.npz", subjects=np.ones(48, dtype=np.int64))
    line = assert_refused(build(one, tmp_path / "store"), "one subject", "whole subjects")
    assert "--val-fraction" not in line and not (tmp_path / "store").exists()
