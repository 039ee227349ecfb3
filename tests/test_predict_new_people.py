"""predict.py's options for new people, end to end: a temperature changes the confidence and never the
activity, per-recording features, learnt transitions, uncertain windows, and the evaluation's
calibration figures; each misuse refused in one line."""
import json

import numpy as np
import pytest
import torch

from data.recordings import Recording
from data.uci_har import CLASS_NAMES
from inference.bundle import load_bundle
from inference.classify import recording_windows
from inference.transitions import write_transitions
from inference_fixtures import make_checkpoint, synthetic_stream
from test_bad_input import assert_refused, write_fake_uci
from test_predict import read_rows, run_script


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("ckpt") / "best.pt")


def minirocket_fitted_to_the_stream(path):
    """A MiniRocket checkpoint whose training statistics are those of the windows of the `recording`
    fixture's stream (synthetic_stream(30.0)), and whose random head reads them at that scale: unadapted,
    it sees several activities in that recording (the conftest `minirocket` sees one)."""
    make_checkpoint(path, model="minirocket")
    bundle, state = load_bundle(path), torch.load(path, weights_only=True)
    time_s, acc, gyro = synthetic_stream(30.0)
    windows = torch.from_numpy(recording_windows(bundle, Recording(acc, gyro, time_s, "stream")).windows)
    net = bundle.model.model
    net.fit((windows - bundle.model.mean) / bundle.model.std)
    torch.manual_seed(0)
    with torch.no_grad():
        net.head[-1].weight.normal_(0, 0.3)
    state["model"] = net.state_dict()
    torch.save(state, path)
    return path


@pytest.fixture(scope="module")
def mixed_minirocket(tmp_path_factory):
    return minirocket_fitted_to_the_stream(tmp_path_factory.mktemp("ckpt") / "mixed.pt")


def predict(checkpoint, recording, out, *flags):
    return run_script("predict", ["--checkpoint", checkpoint, "--recording", recording, "--out", out, *flags])


def test_a_temperature_changes_the_confidence_and_not_the_activities(checkpoint, recording, tmp_path):
    for name, flags in (("plain", []), ("sharp", ["--temperature", "0.5"])):
        code, _, err = predict(checkpoint, recording, tmp_path / name, *flags)
        assert code == 0, err
    plain, sharp = (read_rows(tmp_path / name / "windows.csv") for name in ("plain", "sharp"))
    assert [row["predicted"] for row in plain] == [row["predicted"] for row in sharp]
    assert all(float(s["confidence"]) >= float(p["confidence"]) for p, s in zip(plain, sharp, strict=True))
    assert any(float(s["confidence"]) > float(p["confidence"]) + 1e-3 for p, s in zip(plain, sharp, strict=True))
    timelines = [[row["activity"] for row in read_rows(tmp_path / name / "timeline.csv")]
                 for name in ("plain", "sharp")]
    assert timelines[0] == timelines[1]


def test_features_standardised_on_the_recording(mixed_minirocket, checkpoint, recording, tmp_path):
    code, out, err = predict(mixed_minirocket, recording, tmp_path / "own", "--adapt", "recording")
    assert code == 0, err
    assert "features standardised on this recording" in out
    # Its training statistics are this recording's own: standardised on itself, the same probabilities.
    code, _, err = predict(mixed_minirocket, recording, tmp_path / "plain")
    assert code == 0, err
    own, plain = (read_rows(tmp_path / name / "windows.csv") for name in ("own", "plain"))
    assert [row["predicted"] for row in own] == [row["predicted"] for row in plain]
    assert_refused(predict(checkpoint, recording, tmp_path / "cnn", "--adapt", "recording"), "minirocket")
    assert_refused(predict(mixed_minirocket, recording, tmp_path / "x", "--adapt", "subject"), "--adapt recording")


def test_learnt_transitions_and_uncertain_windows(checkpoint, recording, tmp_path):
    path = tmp_path / "transitions.json"
    write_transitions(path, np.eye(6, dtype=int) * 100, CLASS_NAMES, 128, 64, {})
    code, out, err = predict(checkpoint, recording, tmp_path / "hmm", "--smooth", "hmm", "--transitions", path,
                             "--uncertain-below", "0.99")
    assert code == 0, err
    activities = {row["activity"] for row in read_rows(tmp_path / "hmm" / "timeline.csv")}
    assert activities == {"uncertain"}  # a random model is never 99% sure
    assert "windows uncertain" in out and "learnt transitions" in out
    assert_refused(predict(checkpoint, recording, tmp_path / "a", "--transitions", path), "--smooth hmm")
    assert_refused(predict(checkpoint, recording, tmp_path / "b", "--smooth", "hmm", "--transitions", path,
                           "--stride", "32"), "--stride 64")
    assert_refused(predict(checkpoint, recording, tmp_path / "c", "--uncertain-below", "1.5"), "between 0 and 1")
    assert_refused(predict(checkpoint, recording, tmp_path / "d", "--temperature", "fit"), "validation split")
    (tmp_path / "negative.json").write_text('{"temperature": -1}')
    assert_refused(predict(checkpoint, recording, tmp_path / "e", "--temperature", tmp_path / "negative.json"),
                   f"got -1 in {tmp_path / 'negative.json'}")
    root = write_fake_uci(tmp_path / "UCI HAR Dataset")
    evaluation = ["--checkpoint", checkpoint, "--data-dir", root, "--out", tmp_path / "f", "--uncertain-below", "0.5"]
    line = assert_refused(run_script("predict", evaluation), "--uncertain-below only applies to classifying a")
    assert "--transitions" not in line  # only the flag that was given is named


def test_evaluation_reports_calibration_and_fits_a_temperature(checkpoint, minirocket, tmp_path):
    root = write_fake_uci(tmp_path / "UCI HAR Dataset")
    code, out, err = run_script("predict", ["--checkpoint", checkpoint, "--data-dir", root, "--out", tmp_path / "eval"])
    assert code == 0, err
    report = json.loads((tmp_path / "eval" / "test_report.json").read_text())
    assert 0 <= report["ece"] <= 1 and set(report["ece_per_subject"]) == set(report["per_subject"])
    calibration = json.loads((tmp_path / "eval" / "calibration.json").read_text())
    assert calibration["temperature"] > 0 and calibration["windows"] > 0
    assert report["temperature"]["value"] == calibration["temperature"]
    assert "expected calibration error (15 equal-width bins)" in out and "per person ECE" in out
    # The file an evaluation wrote is what a recording takes.
    code, _, err = run_script("predict", ["--checkpoint", checkpoint, "--data-dir", root, "--out", tmp_path / "none",
                                          "--temperature", "none"])
    assert code == 0, err
    assert not (tmp_path / "none" / "calibration.json").exists()
    assert "temperature" not in json.loads((tmp_path / "none" / "test_report.json").read_text())
    code, _, err = run_script("predict", ["--checkpoint", minirocket, "--data-dir", root, "--out", tmp_path / "own",
                                          "--adapt", "subject"])
    assert code == 0, err
    assert json.loads((tmp_path / "own" / "test_report.json").read_text())["features_standardised"] == "per subject"
    assert_refused(run_script("predict", ["--checkpoint", checkpoint, "--data-dir", root, "--out", tmp_path / "x",
                                          "--adapt", "subject"]), "minirocket")
