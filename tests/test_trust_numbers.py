"""Numbers that would turn into nonsense, flags that would do nothing, and stores the trainer would
reject: each refused in one line (or, for --adapt subject on a person of one window, done without and
said), with nothing on disk touched."""
import json
import sys

import numpy as np
import pytest
import torch

from conftest import TINY_DATA, run_in_process, run_subprocess
from data.errors import DataError
from data.store import WindowStore
from evaluation.calibration import TEMPERATURE_RANGE, fit_temperature
from inference.adaptation import adapted_per_group
from inference.bundle import probabilities
from inference_fixtures import make_checkpoint, synthetic_stream, write_csv
from models import build_model
from test_adaptation import CHANNELS, CLASSES, STEPS, bundle_of
from test_bad_input import assert_refused, snapshot
from test_predict import read_rows, run_script
from test_predict_new_people import mixed_minirocket, predict  # noqa: F401 (a fixture)
from test_store import build_here, synthetic_npz, write_recording

# --- Numbers that become nonsense ------------------------------------------------------------------

@pytest.mark.parametrize("temperature", ["1e308", "1e-320", "1000"])
def test_a_temperature_at_the_edges_of_float_is_refused(minirocket, recording, temperature, tmp_path):
    assert_refused(predict(minirocket, recording, tmp_path / "given", "--temperature", temperature),
                   "--temperature must be between", f"got {temperature}")
    calibration = tmp_path / "calibration.json"
    calibration.write_text(json.dumps({"temperature": float(temperature)}))
    assert_refused(predict(minirocket, recording, tmp_path / "file", "--temperature", calibration), str(calibration))
    assert not (tmp_path / "given").exists() and not (tmp_path / "file").exists()


def test_a_fitted_temperature_stays_in_the_range_predict_py_reads():
    """Windows the model is sure of and always wrong about pull the fit towards infinity."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 6, 200)
    probabilities = np.full((200, 6), 1e-6)
    probabilities[np.arange(200), (labels + 1) % 6] = 1.0
    assert TEMPERATURE_RANGE[0] <= fit_temperature(probabilities, labels) <= TEMPERATURE_RANGE[1]


def test_adapting_on_one_window_is_refused_and_the_recording_classified_without(minirocket, tmp_path):
    one_window = write_csv(tmp_path / "short.csv", *synthetic_stream(2.56))
    assert_refused(predict(minirocket, one_window, tmp_path / "adapted", "--adapt", "recording"),
                   "1 window(s), too few to standardise")
    assert not (tmp_path / "adapted").exists()
    code, _, err = predict(minirocket, one_window, tmp_path / "plain")
    assert code == 0, err
    assert np.isfinite(float(read_rows(tmp_path / "plain" / "windows.csv")[0]["confidence"]))


def test_a_person_with_one_window_keeps_the_training_statistics_and_the_others_adapt(capsys):
    rng = np.random.default_rng(0)
    training = rng.standard_normal((40, CHANNELS, STEPS)).astype(np.float32)
    windows = 2 * rng.standard_normal((41, CHANNELS, STEPS)).astype(np.float32) + 0.5  # people unlike the training
    torch.manual_seed(0)
    net = build_model("minirocket", CHANNELS, CLASSES, dropout=0.0, window_steps=STEPS, width=840)
    net.fit(training)
    bundle, cpu = bundle_of(net), torch.device("cpu")
    people = np.array([1] * 40 + [2])
    adapted = adapted_per_group(bundle, windows, people, cpu)
    assert "subject 2 has 1 window" in capsys.readouterr().err
    np.testing.assert_allclose(adapted[-1], probabilities(bundle, windows[-1:], cpu)[0], atol=1e-6)
    assert np.isfinite(adapted).all() and np.abs(adapted[:40] - probabilities(bundle, windows[:40], cpu)).max() > 1e-3


def test_adapting_on_a_channel_that_never_changes_gives_finite_confidences(mixed_minirocket, tmp_path):  # noqa: F811
    time_s, acc, gyro = synthetic_stream(30.0)
    gyro[:, 1] = 0.0
    still = write_csv(tmp_path / "still_gyro.csv", time_s, acc, gyro)
    code, out, err = predict(mixed_minirocket, still, tmp_path / "out", "--adapt", "recording")
    assert code == 0, err
    rows = read_rows(tmp_path / "out" / "windows.csv")
    assert all(np.isfinite(float(row["confidence"])) for row in rows)
    assert "features standardised on this recording" in out


# --- Flags that do nothing, said nowhere -----------------------------------------------------------

def test_feature_views_on_a_model_without_fixed_features_is_refused(tmp_path):
    save_dir = tmp_path / "run"
    for views in ("8", "4"):  # 4 is minirocket's own: given to another model, it does nothing either
        assert_refused(run_in_process("main.py", [*TINY_DATA, "--feature-views", views, "--save-dir", save_dir]),
                       "--feature-views", "--model cnn1d")
    assert not save_dir.exists()


def test_an_ensemble_of_two_models_is_refused_before_it_is_written(minirocket, tmp_path):
    cnn = make_checkpoint(tmp_path / "cnn.pt")
    out = tmp_path / "ensemble.pt"
    assert_refused(run_script("inference.ensemble", [cnn, minirocket, "--out", out]),
                   str(minirocket), "must be one model")
    assert not out.exists()


def test_a_run_without_test_or_validation_split_claims_no_report(tmp_path):
    save_dir = tmp_path / "run"
    code, out, err = run_in_process("main.py", [*TINY_DATA, "--epochs", "1", "--no-test", "--val-fraction", "0",
                                     "--save-dir", save_dir])
    assert code == 0, err
    assert not (save_dir / "val_report.json").exists()
    assert "val_report.json" not in out + err and "no report was written" in out + err


# --- The store builder: never a store the trainer rejects ------------------------------------------

def build_refused(source, out, *flags):
    """data.build_store as a command: refused in one line, with no manifest written and a store that
    was there left as it was."""
    before = snapshot(out)
    result = run_subprocess([sys.executable, "-m", "data.build_store", source, "--out", out, "--workers", "1", *flags],
                            timeout=120)
    line = assert_refused((result.returncode, result.stdout, result.stderr))
    assert snapshot(out) == before if before else not (out / "manifest.json").exists()
    return line


@pytest.fixture(scope="module")
def recordings(tmp_path_factory):
    folder = tmp_path_factory.mktemp("recordings")
    for subject in (1, 2, 3):
        write_recording(folder, f"s{subject}.npz", subject, seed=subject)
    return folder


@pytest.mark.parametrize("flags, names", [
    (["--test-subjects", "a,b"], ["--test-subjects", "'a,b'"]),
    (["--window-steps", "100000000000000000000"], ["--window-steps", "65,536"]),
    (["--test-subjects", "9"], ["test split empty", "(1,2,3)", "removed again"]),
    (["--class-names", ","], ["--class-names", "two distinct"]),
])
def test_a_build_that_would_fail_or_make_a_store_the_trainer_rejects_is_refused(recordings, tmp_path, flags, names):
    line = build_refused(recordings, tmp_path / "store", *flags)
    assert all(name in line for name in names), line


@pytest.mark.parametrize("edit, names", [
    (lambda manifest: manifest.update(test_subjects=[]), ["test split is empty"]),
    (lambda manifest: manifest["layout"]["classes"][0].update(name=""), ["classes", "non-empty"]),
])
def test_a_store_with_no_test_windows_or_blank_class_names_is_refused_when_opened(recordings, tmp_path, edit, names):
    build_here(recordings, tmp_path / "store", "--test-subjects", "2")
    manifest_path = tmp_path / "store" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    edit(manifest)
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(DataError) as refused:
        WindowStore(tmp_path / "store")
    assert all(name in str(refused.value) for name in names), refused.value


def test_a_build_of_another_dtype_over_a_finished_store_is_refused(recordings, tmp_path):
    build_here(recordings, tmp_path / "store", "--test-subjects", "2")  # float32
    line = build_refused(recordings, tmp_path / "store", "--test-subjects", "2", "--dtype", "float16")
    assert "float32" in line and "float16" in line and "another --out" in line


def test_windows_without_a_rate_are_refused_until_sample_rate_gives_it(tmp_path):
    arrays = dict(np.load(synthetic_npz(tmp_path / "windows.npz")))
    del arrays["sample_rate_hz"]
    np.savez(tmp_path / "no_rate.npz", **arrays)
    line = build_refused(tmp_path / "no_rate.npz", tmp_path / "store")
    assert "--sample-rate" in line
    build_here(tmp_path / "no_rate.npz", tmp_path / "store", "--sample-rate", "50")
    assert WindowStore(tmp_path / "store").layout.sample_rate_hz == 50.0
