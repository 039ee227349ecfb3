"""Fold ensembles: one checkpoint of several models that averages their probabilities, through the
cross-validation that writes it, predict.py and export.py."""
import json

import numpy as np
import pytest
import torch

from conftest import TINY_DATA, load_checkpoint, run_in_process
from inference_fixtures import make_checkpoint, synthetic_stream, write_csv
from test_bad_input import assert_refused, write_fake_uci
from test_export import raw_windows, run_onnx, run_torchscript
from test_predict import predict, read_rows, run_script


def member_probabilities(path, windows):
    """One checkpoint's softmax on raw windows, through its own normalisation, built here without the
    inference code: with the weight average where the run kept one."""
    from models import build_model
    state = load_checkpoint(path)
    model = build_model(state["config"]["model"], state["in_channels"], state["num_classes"],
                        norm=state["config"]["norm"])
    model.load_state_dict(state["ema"]["weights"] if state.get("ema") else state["model"])
    normalised = (torch.from_numpy(windows) - state["normalization"]["mean"][None, :, None]) / \
        state["normalization"]["std"][None, :, None]
    with torch.no_grad():
        return torch.softmax(model.eval()(normalised), dim=1).numpy()


def mean_probabilities(checkpoints, windows):
    return np.mean([member_probabilities(path, windows) for path in checkpoints], axis=0)


@pytest.fixture
def members(tmp_path):
    # Other weights and other normalisations, so that a member run through another's statistics shows.
    return [make_checkpoint(tmp_path / f"member-{seed}.pt", seed=seed) for seed in (0, 1, 2)]


@pytest.fixture
def ensemble(members, tmp_path):
    from inference.ensemble import write_ensemble
    return write_ensemble(members, tmp_path / "ensemble.pt", config=load_checkpoint(members[0])["config"])


def test_the_ensemble_averages_its_members_probabilities(members, ensemble):
    from inference.bundle import load_bundle, probabilities
    windows = raw_windows(7, 128, seed=3)
    bundle = load_bundle(ensemble)
    assert bundle.members == 3 and "ensemble of 3 cnn1d models" in bundle.describe()
    expected = mean_probabilities(members, windows)
    np.testing.assert_allclose(probabilities(bundle, windows, torch.device("cpu")), expected, atol=1e-6)
    # Not what any one member says: the members disagree enough for the average to differ.
    assert min(np.abs(mean_probabilities([member], windows) - expected).max() for member in members) > 1e-3


@pytest.mark.parametrize("fmt, runner", [("torchscript", run_torchscript), ("onnx", run_onnx)])
def test_the_exported_ensemble_is_one_graph_giving_the_mean_probabilities(members, ensemble, fmt, runner, tmp_path):
    code, out, err = run_script("export", ["--checkpoint", ensemble, "--format", fmt, "--out", tmp_path / "m"])
    assert code == 0, err
    assert "largest logit difference" in out or "not checked" in out
    windows = raw_windows(5, 128, seed=4)
    logits = runner(tmp_path / "m", windows)
    probabilities = torch.softmax(torch.from_numpy(logits), dim=1).numpy()
    np.testing.assert_allclose(probabilities, mean_probabilities(members, windows), atol=1e-5)


def test_predict_classifies_recordings_and_evaluates_with_an_ensemble(members, ensemble, tmp_path):
    time_s, acc, gyro = synthetic_stream(30.0)
    code, _, err = predict(ensemble, write_csv(tmp_path / "r.csv", time_s, acc, gyro), tmp_path / "rec")
    assert code == 0, err
    assert len(read_rows(tmp_path / "rec" / "windows.csv")) > 0
    root = write_fake_uci(tmp_path / "UCI HAR Dataset")
    code, out, err = run_script("predict", ["--checkpoint", ensemble, "--data-dir", root, "--out", tmp_path / "eval"])
    assert code == 0, err
    from data.uci_har import load_split
    signals, labels, _ = load_split(root, "test")
    voted = mean_probabilities(members, signals).argmax(axis=1)
    report = json.loads((tmp_path / "eval" / "test_report.json").read_text())
    assert report["accuracy"] == pytest.approx(float(np.mean(voted == labels)))
    # Every training subject trained one member or another: there is no validation split to score.
    assert_refused(run_script("predict", ["--checkpoint", ensemble, "--data-dir", root, "--split", "val",
                                          "--out", tmp_path / "eval-val"]), "--split test")


def test_members_that_disagree_on_their_windows_are_refused(members, tmp_path):
    from inference.ensemble import write_ensemble
    from training.errors import UsageError
    other = make_checkpoint(tmp_path / "short.pt", window_steps=64)
    with pytest.raises(UsageError, match="other windows or classes"):
        write_ensemble([members[0], other], tmp_path / "bad.pt", config={})
    assert not (tmp_path / "bad.pt").exists()


def test_cross_validation_writes_and_reports_its_ensemble(tmp_path):
    code, out, err = run_in_process("main.py", [*TINY_DATA, "--synthetic-windows-per-subject", "8", "--epochs", "1",
                                                "--cv-folds", "2", "--refit", "--ensemble", "--save-dir", tmp_path])
    assert code == 0, err
    runs = [tmp_path / "fold-0" / "best.pt", tmp_path / "fold-1" / "best.pt", tmp_path / "refit" / "best.pt"]
    members = load_checkpoint(tmp_path / "ensemble.pt")["members"]
    for member, run in zip(members, runs, strict=True):
        weights = load_checkpoint(run)["ema"]["weights"]  # the moving average: what each run predicts with
        assert member["source"] == str(run)
        assert all(torch.equal(member["model"][name], weights[name]) for name in weights)
    from data.sources import load_har_data
    test = load_har_data("synthetic", synthetic_windows_per_subject=8).test
    voted = mean_probabilities(runs, test.signals).argmax(axis=1)
    report = json.loads((tmp_path / "test_report.json").read_text())
    assert report["num_samples"] == len(test)
    assert report["accuracy"] == pytest.approx(float(np.mean(voted == test.labels)))
    summary = json.loads((tmp_path / "cv_report.json").read_text())
    assert summary["ensemble"]["test_accuracy"] == report["accuracy"]
    assert "test split, the ensemble of 3 models" in out


def test_runs_trained_apart_become_one_ensemble_from_the_command_line(members, ensemble, tmp_path):
    from inference.bundle import load_bundle, probabilities
    code, out, err = run_script("inference.ensemble", [*members, "--out", tmp_path / "apart.pt"])
    assert code == 0, err
    assert f"wrote {tmp_path / 'apart.pt'}: 3 models" in out
    windows = raw_windows(5, 128, seed=4)
    np.testing.assert_array_equal(probabilities(load_bundle(tmp_path / "apart.pt"), windows, torch.device("cpu")),
                                  probabilities(load_bundle(ensemble), windows, torch.device("cpu")))


def test_the_ensemble_command_refuses_in_one_line_and_keeps_what_is_on_disk(members, ensemble, tmp_path):
    before = ensemble.read_bytes()
    assert_refused(run_script("inference.ensemble", [*members]), "--out")
    assert_refused(run_script("inference.ensemble", [members[0], "--out", tmp_path / "one.pt"]), "at least two")
    assert_refused(run_script("inference.ensemble", [members[0], tmp_path / "none.pt", "--out", tmp_path / "x.pt"]),
                   "none.pt", "not a checkpoint")
    assert_refused(run_script("inference.ensemble", [ensemble, members[0], "--out", tmp_path / "x.pt"]),
                   "an ensemble already")
    assert_refused(run_script("inference.ensemble", [*members, "--out", ensemble]), "--overwrite")
    member_bytes = members[0].read_bytes()
    assert_refused(run_script("inference.ensemble", [*members, "--out", members[0], "--overwrite"]),
                   "a file this command reads")
    assert_refused(run_script("inference.ensemble", [*members, members[0], "--out", tmp_path / "x.pt"]), "twice")
    assert_refused(run_script("inference.ensemble", [*members, "--out", tmp_path / "missing" / "x.pt"]),
                   "does not exist")
    torch.save({"model": {}}, tmp_path / "keyless.pt")
    assert_refused(run_script("inference.ensemble", [members[0], tmp_path / "keyless.pt", "--out", tmp_path / "x.pt"]),
                   "keyless.pt lacks")
    diverged = load_checkpoint(members[1])
    next(iter(diverged["model"].values())).fill_(float("nan"))
    diverged.pop("ema", None)
    torch.save(diverged, tmp_path / "diverged.pt")
    assert_refused(run_script("inference.ensemble", [members[0], tmp_path / "diverged.pt", "--out", tmp_path / "x.pt"]),
                   "NaN or infinity")
    assert members[0].read_bytes() == member_bytes
    assert ensemble.read_bytes() == before and not (tmp_path / "one.pt").exists() and not (tmp_path / "x.pt").exists()
    code, _, err = run_script("inference.ensemble", [*members[:2], "--out", ensemble, "--overwrite"])
    assert code == 0, err
    assert ensemble.read_bytes() != before
