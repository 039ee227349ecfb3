"""Windows of unequal lengths, padded at their end with NaN: the default reads each over its own steps
from the .npz to predict.py and export; what cannot read them refuses them in one line."""
import json

import numpy as np
import torch

from data.sources import load_har_data
from data.splits import fit_normalization
from test_bad_input import assert_refused, snapshot
from test_npz_dataset import train as train_npz
from test_npz_dataset import windows, write_npz
from test_predict import run_script
from test_trust_numbers import build_refused
from training.config.cli import parse_config
from training.loop.recipe import build_augmenter

NINE = tuple(f"{sensor}_{axis}" for sensor in ("body_acc", "body_gyro", "total_acc") for axis in "xyz")


def padded_arrays(channels=4, steps=40, shortest=3, seed=0):
    """windows() with each window cut to a length of its own (the longest kept whole) and NaN after it."""
    arrays = windows(channels=channels, steps=steps, seed=seed)
    lengths = np.random.default_rng(seed).integers(shortest, steps + 1, len(arrays["labels"]))
    lengths[0] = steps
    for window, length in zip(arrays["signals"], lengths, strict=True):
        window[:, length:] = np.nan
    return arrays, lengths


def test_padded_windows_load_with_their_lengths_said_and_normalise_over_their_own_steps(tmp_path):
    arrays, lengths = padded_arrays()
    data = load_har_data("npz", write_npz(tmp_path / "w.npz", **arrays))
    assert data.padded and data.own_lengths == (int(lengths.min()), 40)
    assert f"(unequal: {lengths.min()} to 40, padded at their end with NaN)" in data.description
    mean, std = fit_normalization(data.train.signals, data.padded)
    own_steps = np.concatenate([window[:, :int((~np.isnan(window[0])).sum())] for window in data.train.signals], axis=1)
    np.testing.assert_allclose(mean, own_steps.mean(axis=1), rtol=1e-5)
    np.testing.assert_allclose(std, own_steps.std(axis=1), rtol=1e-5)


def test_the_default_trains_on_padded_windows_and_predict_reads_them_as_the_run_did(tmp_path):
    arrays, _ = padded_arrays()
    path = write_npz(tmp_path / "w.npz", **arrays)
    code, out, err = train_npz(path, tmp_path / "run", "--no-figures")
    assert code == 0, err
    assert "padded at their end with NaN" in out and "ridge regression" in out
    assert "float32" in out  # the pool holds the features themselves: no common T' turns counts back
    state = torch.load(tmp_path / "run" / "best.pt", weights_only=True)
    assert bool(state["model"]["nan_padding"])
    report = json.loads((tmp_path / "run" / "test_report.json").read_text())
    assert report["accuracy"] > 1 / 3  # three classes told apart by their offsets
    code, _, err = run_script("predict", ["--checkpoint", tmp_path / "run" / "best.pt", "--data-dir", path,
                                          "--dataset", "npz", "--out", tmp_path / "eval"])
    assert code == 0, err
    evaluated = json.loads((tmp_path / "eval" / "test_report.json").read_text())
    assert (evaluated["accuracy"], evaluated["num_samples"]) == (report["accuracy"], report["num_samples"])
    code, _, err = run_script("export", ["--checkpoint", tmp_path / "run" / "best.pt", "--format", "torchscript",
                                         "--out", tmp_path / "model.pt"])
    assert code == 0, err
    exported = torch.jit.load(str(tmp_path / "model.pt"))
    test = torch.from_numpy(arrays["signals"][:6])
    from inference.bundle import load_bundle
    with torch.no_grad():
        torch.testing.assert_close(exported(test), load_bundle(tmp_path / "run" / "best.pt").model(test))


def test_an_adamw_head_trains_on_padded_windows_without_the_circular_shift(tmp_path):
    arrays, _ = padded_arrays()
    code, out, err = train_npz(write_npz(tmp_path / "w.npz", **arrays), tmp_path / "run", "--head-fit", "adamw",
                               "--no-figures")
    assert code == 0, err
    lines = [line for line in (out + err).splitlines() if line.startswith("warning:") and "augment" in line]
    assert len(lines) == 1 and "without 'shift'" in lines[0], lines
    assert "float32" in out
    assert np.isfinite(json.loads((tmp_path / "run" / "test_report.json").read_text())["loss"])


def test_the_augmentations_kept_leave_the_padding_where_it_was():
    augment = build_augmenter(parse_config(["--augment", "rotate,flip,scale,jitter,shift"]).recipe,
                              {"mean": torch.zeros(9), "std": torch.ones(9)}, NINE, ("a", "b"),
                              warn=lambda line: None, padded=True)
    assert "shift" not in augment.config.kinds and "rotate" in augment.config.kinds
    batch = torch.randn(16, 9, 40)
    for index, window in enumerate(batch):
        window[:, 10 + index:] = float("nan")
    torch.manual_seed(0)
    augmented = augment(batch.clone(), torch.arange(16) % 2)
    assert torch.equal(augmented.isnan(), batch.isnan())


def test_a_model_that_reads_one_length_is_refused_padded_windows(tmp_path):
    arrays, lengths = padded_arrays()
    save_dir = tmp_path / "run"
    save_dir.mkdir()
    (save_dir / "keep.txt").write_text("keep\n")
    before = snapshot(save_dir)
    assert_refused(train_npz(write_npz(tmp_path / "w.npz", **arrays), save_dir, "--model", "cnn1d"),
                   "--model cnn1d", f"{lengths.min()} to 40 steps", "--model minirocket")
    assert snapshot(save_dir) == before


def test_a_model_trained_on_one_length_refuses_to_evaluate_padded_windows(tmp_path):
    whole = write_npz(tmp_path / "whole.npz", **windows())
    assert train_npz(whole, tmp_path / "run", "--no-figures")[0] == 0
    arrays, _ = padded_arrays()
    assert_refused(run_script("predict", ["--checkpoint", tmp_path / "run" / "best.pt", "--dataset", "npz",
                                          "--data-dir", write_npz(tmp_path / "w.npz", **arrays),
                                          "--out", tmp_path / "eval"]),
                   "padded at their end with NaN", "one length")
    assert not (tmp_path / "eval").exists()


def test_a_store_refuses_padded_windows_for_the_npz_itself(tmp_path):
    arrays, _ = padded_arrays()
    path = write_npz(tmp_path / "w.npz", **arrays)
    line = build_refused(path, tmp_path / "store")
    assert "padded at their end with NaN" in line and "--dataset npz" in line


def test_a_resumed_run_reads_its_padded_windows_as_the_first_did(tmp_path):
    arrays, _ = padded_arrays()
    path = write_npz(tmp_path / "w.npz", **arrays)
    flags = ("--head-fit", "adamw", "--no-figures", "--epochs", "2")
    assert train_npz(path, tmp_path / "run", *flags, "--stop-after-epochs", "1")[0] == 0
    code, out, err = train_npz(path, tmp_path / "run", *flags)
    assert code == 0, err
    assert "fixed parts from the checkpoint" in out and "float32" in out  # the flag came back with the weights
    assert bool(torch.load(tmp_path / "run" / "last.pt", weights_only=True)["model"]["nan_padding"])
