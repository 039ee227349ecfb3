"""--dataset npz: windows brought in an .npz train, are checked like UCI HAR, and any T works."""
import json

import numpy as np
import pytest
import torch

from conftest import run_in_process
from data.errors import DataError
from data.sources import load_har_data
from inference_fixtures import synthetic_stream, write_csv
from models import build_model
from test_bad_input import assert_refused, snapshot
from test_predict import run_script

RAW = ("acc_x", "acc_y", "acc_z", "gyro_x", "gyro_y", "gyro_z")


def windows(subjects=4, per_subject=12, channels=4, steps=40, classes=3, seed=0):
    """Arrays of a valid file: class-dependent offsets so that the classes differ."""
    rng = np.random.default_rng(seed)
    count = subjects * per_subject
    labels = np.arange(count) % classes
    signals = rng.normal(0, 1, (count, channels, steps)) + labels[:, None, None]
    return {"signals": signals.astype(np.float32), "labels": labels.astype(np.int64),
            "subjects": np.repeat(np.arange(1, subjects + 1), per_subject).astype(np.int64)}


def write_npz(path, **arrays):
    np.savez(path, **{name: value for name, value in arrays.items() if value is not None})
    return path


def train(path, save_dir, *flags):
    return run_in_process("main.py", ["--dataset", "npz", "--data-dir", path, "--epochs", "1", "--batch-size", "8",
                                      "--save-dir", save_dir, *flags])


@pytest.mark.parametrize("model, steps", [("cnn1d", 40), ("cnn_lstm", 40), ("transformer", 40), ("transformer", 300)])
def test_npz_trains_every_model_at_other_lengths(model, steps, tmp_path):
    arrays = windows(steps=steps)
    split = np.where(arrays["subjects"] == 4, "test", "train")
    path = write_npz(tmp_path / "w.npz", **arrays, split=split, class_names=np.array(["rest", "walk", "run"]),
                     channel_names=np.array(["a", "b", "c", "d"]), sample_rate_hz=np.array(25.0))
    code, out, err = train(path, tmp_path / "run", "--model", model)
    assert code == 0, err
    assert "data: npz" in out
    state = torch.load(tmp_path / "run" / "best.pt", weights_only=True)
    assert state["class_names"] == ["rest", "walk", "run"] and state["channel_names"] == ["a", "b", "c", "d"]
    assert (state["window_steps"], state["sample_rate_hz"], state["preprocessing"]) == (steps, 25.0, "unknown")
    report = json.loads((tmp_path / "run" / "test_report.json").read_text())
    assert report["num_samples"] == int(np.sum(split == "test"))


def test_without_split_array_test_subjects_are_fixed_and_disjoint(tmp_path):
    arrays = windows(subjects=10, per_subject=3)
    path = write_npz(tmp_path / "w.npz", **arrays)
    first = load_har_data("npz", path, val_fraction=0.2, split_seed=1)
    second = load_har_data("npz", path, val_fraction=0.2, split_seed=2)
    assert set(first.test.subjects) == set(second.test.subjects)  # --seed does not move the test set
    assert len(set(first.test.subjects)) == 2
    parts = [set(first.train.subjects), set(first.val.subjects), set(first.test.subjects)]
    assert parts[0].isdisjoint(parts[1]) and parts[0].isdisjoint(parts[2]) and parts[1].isdisjoint(parts[2])
    assert set.union(*parts) == set(range(1, 11))
    assert len(first.train) + len(first.val) + len(first.test) == 30
    assert first.class_names == ("class_0", "class_1", "class_2") and first.sample_rate_hz != first.sample_rate_hz
    np.testing.assert_array_equal(np.sort(first.test.signals.sum(axis=(1, 2))),
                                  np.sort(arrays["signals"][np.isin(arrays["subjects"], first.test.subjects)]
                                          .sum(axis=(1, 2))))


def test_raw_channel_windows_can_classify_a_recording(tmp_path):
    # Windows of raw acc / gyro channels at a known rate: predict.py rebuilds them from a recording.
    arrays = windows(channels=6, steps=64)
    path = write_npz(tmp_path / "w.npz", **arrays, channel_names=np.array(RAW), sample_rate_hz=np.array(50.0))
    assert train(path, tmp_path / "run")[0] == 0
    state = torch.load(tmp_path / "run" / "best.pt", weights_only=True)
    assert state["preprocessing"] == "raw"
    recording = write_csv(tmp_path / "r.csv", *synthetic_stream(10.0))
    code, _, err = run_script("predict", ["--checkpoint", tmp_path / "run" / "best.pt", "--recording", recording,
                                          "--out", tmp_path / "out"])
    assert code == 0, err
    assert (tmp_path / "out" / "windows.csv").read_text().splitlines()[0].endswith("class_0,class_1,class_2")
    # ... and evaluates on its own file.
    code, _, err = run_script("predict", ["--checkpoint", tmp_path / "run" / "best.pt", "--dataset", "npz",
                                          "--data-dir", path, "--out", tmp_path / "eval"])
    assert code == 0, err
    report = json.loads((tmp_path / "eval" / "test_report.json").read_text())
    assert report["num_samples"] > 0
    # --dataset auto takes a file ending in .npz for what it is.
    code, _, err = run_script("predict", ["--checkpoint", tmp_path / "run" / "best.pt", "--data-dir", path,
                                          "--out", tmp_path / "eval-auto"])
    assert code == 0, err
    assert json.loads((tmp_path / "eval-auto" / "test_report.json").read_text())["accuracy"] == report["accuracy"]


@pytest.mark.parametrize("extra, names", [
    ({}, ["sample rate"]),  # no sample_rate_hz in the file
    ({"sample_rate_hz": np.array(50.0), "channel_names": np.array(["p", "q", "r", "s"])}, ["preprocessing is unknown"]),
])
def test_predict_refuses_windows_it_cannot_rebuild(extra, names, tmp_path):
    path = write_npz(tmp_path / "w.npz", **windows(), **extra)
    assert train(path, tmp_path / "run")[0] == 0
    recording = write_csv(tmp_path / "r.csv", *synthetic_stream(10.0))
    assert_refused(run_script("predict", ["--checkpoint", tmp_path / "run" / "best.pt", "--recording", recording,
                                          "--out", tmp_path / "out"]), *names)
    assert not (tmp_path / "out").exists()


def bad_file(tmp_path, case):
    if case == "text":
        (tmp_path / "text.npz").write_text("signals,labels\n")
        return tmp_path / "text.npz"
    arrays = windows()
    count = len(arrays["labels"])
    if case == "no-labels":
        arrays["labels"] = None
    elif case == "misspelt-array":
        arrays["label"] = arrays.pop("labels")
    elif case == "signals-2d":
        arrays["signals"] = arrays["signals"][:, 0]
    elif case == "nan":
        arrays["signals"][5, 1, 7] = np.nan
    elif case == "inf":
        arrays["signals"][5, 1, 7] = -np.inf
    elif case == "nan-inside":
        arrays["signals"][5, :, 7] = np.nan
    elif case == "nan-only":
        arrays["signals"][5] = np.nan
    elif case == "label-out-of-range":
        arrays["labels"][9] = 3
        arrays["class_names"] = np.array(["a", "b", "c"])
    elif case == "negative-label":
        arrays["labels"][9] = -1
        arrays["class_names"] = np.array(["a", "b", "c"])
    elif case == "float-labels":
        arrays["labels"] = arrays["labels"].astype(np.float32)
    elif case == "short-subjects":
        arrays["subjects"] = arrays["subjects"][:-1]
    elif case == "pickled-names":
        arrays["class_names"] = np.array(["a", "b", "c"], dtype=object)
    elif case == "bad-split":
        arrays["split"] = np.array(["train"] * (count - 1) + ["validation"])
    elif case == "train-only":
        arrays["split"] = np.array(["train"] * count)
    elif case == "too-short":
        arrays["signals"] = arrays["signals"][:, :, :4]
    elif case == "wrong-channel-count":
        arrays["channel_names"] = np.array(["a", "b"])
    return write_npz(tmp_path / f"{case}.npz", **arrays)


@pytest.mark.parametrize("case, names", [
    ("no-labels", ["lacks labels"]),
    ("misspelt-array", ["lacks labels"]),
    ("signals-2d", ["signals must be", "[N, C, T]"]),
    ("nan", ["window 5, channel 1, step 7 hold nan", "NaN on some channels"]),
    ("inf", ["window 5, channel 1, step 7 hold -inf", "infinity"]),
    ("nan-inside", ["NaN before a value", "window 5, channel 0, step 7", "interpolate"]),
    ("nan-only", ["window 5 holds NaN only", "leave it out"]),
    ("label-out-of-range", ["label 3", "(0, 1, 2)", "class_names"]),
    ("negative-label", ["label -1"]),
    ("float-labels", ["labels must be integers"]),
    ("short-subjects", ["subjects must be integers", "[48]"]),
    ("pickled-names", ["Python objects"]),
    ("text", ["is not an .npz archive"]),
    ("bad-split", ["'validation'"]),
    ("train-only", ["both 'train' and 'test'"]),
    ("too-short", ["4 steps"]),
    ("wrong-channel-count", ["channel_names", "[4]"]),
])
def test_bad_npz_is_refused(case, names, tmp_path):
    save_dir = tmp_path / "run"
    save_dir.mkdir()
    (save_dir / "keep.txt").write_text("keep\n")
    before = snapshot(save_dir)
    assert_refused(train(bad_file(tmp_path, case), save_dir), *names)
    assert snapshot(save_dir) == before


@pytest.mark.parametrize("flags, names", [
    (["--mode", "average"], ["--mode average"]),
    (["--data-dir", "missing.npz"], ["missing.npz", "does not exist"]),
])
def test_npz_flags_that_cannot_work(flags, names, tmp_path):
    path = write_npz(tmp_path / "w.npz", **windows())
    code, out, err = run_in_process("main.py", ["--dataset", "npz", "--data-dir", path, "--epochs", "1",
                                                "--save-dir", tmp_path / "run", *flags])
    assert_refused((code, out, err), *names)


def test_npz_needs_a_file():
    with pytest.raises(DataError, match="--dataset npz needs --data-dir"):
        load_har_data("npz", None)


def test_transformer_at_128_steps_is_unchanged():
    # 128 steps make 32 tokens, which take the first 32 rows of the 64-row table as before.
    torch.manual_seed(0)
    model = build_model("transformer", 9, 6).eval()
    assert model.position.shape == (1, 64, 64)
    x = torch.randn(3, 9, 128)
    with torch.no_grad():
        tokens = model.stem(x).transpose(1, 2)
        expected = model.head(model.encoder(tokens + model.position[:, :32]).mean(dim=1))
        np.testing.assert_array_equal(model(x).numpy(), expected.numpy())
        stretched = model.positions(100)
    assert stretched.shape == (1, 100, 64)
    np.testing.assert_allclose(stretched[0, [0, -1]].detach().numpy(), model.position[0, [0, -1]].detach().numpy(),
                               atol=1e-6)


def test_cross_validation_on_npz_validates_each_fold_on_its_own_subjects(tmp_path):
    arrays = windows(subjects=6)
    arrays["split"] = np.where(arrays["subjects"] == 6, "test", "train")
    path = write_npz(tmp_path / "w.npz", **arrays)
    code, out, err = train(path, tmp_path / "cv", "--cv-folds", "2", "--no-test")
    assert code == 0, err
    report = json.loads((tmp_path / "cv" / "cv_report.json").read_text())
    subjects = [fold["subjects"] for fold in report["folds"]]
    assert sorted(s for fold in subjects for s in fold) == [1, 2, 3, 4, 5]
    for fold in report["folds"]:  # each fold's validation set is exactly its own subjects' windows
        assert fold["val_windows"] == 12 * len(fold["subjects"])
