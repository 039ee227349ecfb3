"""Expected calibration error and temperature scaling: the ECE of honest probabilities is near 0 and
of overconfident ones is not; a temperature fitted on logits scaled by a known factor finds it; the
argmax never moves."""
import numpy as np
import pytest
import torch

from evaluation.calibration import (
    expected_calibration_error,
    fit_temperature,
    mean_nll,
    per_subject_calibration,
    scaled,
)
from inference.temperature import read_temperature, write_calibration
from training.errors import UsageError


def draws(logits, seed=0):
    """Labels drawn from softmax(logits): probabilities that are calibrated by construction."""
    probabilities = torch.softmax(torch.as_tensor(logits), dim=1).numpy()
    rng = np.random.default_rng(seed)
    cumulative = probabilities.cumsum(axis=1)
    labels = (rng.random((len(probabilities), 1)) > cumulative).sum(axis=1)
    return probabilities, np.minimum(labels, probabilities.shape[1] - 1)


@pytest.fixture(scope="module")
def logits():
    return np.random.default_rng(1).normal(0, 2.0, (20_000, 6))


def test_ece_is_near_zero_for_calibrated_and_high_for_overconfident_probabilities(logits):
    honest, labels = draws(logits)
    assert expected_calibration_error(honest, labels) < 0.015
    overconfident = torch.softmax(torch.as_tensor(logits) * 3.0, dim=1).numpy()
    assert expected_calibration_error(overconfident, labels) > 0.1


def test_ece_by_hand():
    # Two bins used out of 15: confidences 0.9 (both right) and 0.5 (one right of two).
    probabilities = np.array([[0.9, 0.1], [0.9, 0.1], [0.5, 0.5], [0.5, 0.5]])
    labels = np.array([0, 0, 0, 1])
    assert expected_calibration_error(probabilities, labels) == pytest.approx((2 * 0.1 + 2 * 0.0) / 4)
    people = per_subject_calibration(probabilities, labels, [1, 1, 2, 2])
    assert people == {"1": pytest.approx(0.1), "2": pytest.approx(0.0)}


@pytest.mark.parametrize("factor", [0.4, 2.5])
def test_temperature_recovers_a_known_scaling(logits, factor):
    honest, labels = draws(logits, seed=2)
    distorted = torch.softmax(torch.as_tensor(logits) * factor, dim=1).numpy()
    temperature = fit_temperature(distorted, labels)
    assert temperature == pytest.approx(factor, rel=0.05)
    rescaled = scaled(distorted, temperature)
    np.testing.assert_allclose(rescaled, honest, atol=0.03)
    assert np.array_equal(rescaled.argmax(axis=1), distorted.argmax(axis=1))
    assert expected_calibration_error(rescaled, labels) < expected_calibration_error(distorted, labels)


def test_the_fitted_temperature_has_the_least_nll_in_the_range_or_is_its_end(logits):
    logits = logits[:2000]  # every temperature of the grid scores every window: fewer keep it quick
    probabilities = torch.softmax(torch.as_tensor(logits) * 2.0, dim=1).numpy()
    _, labels = draws(logits, seed=3)
    fitted = fit_temperature(probabilities, labels)
    grid = np.exp(np.linspace(np.log(0.01), np.log(100.0), 401))  # steps of 2.3%
    assert mean_nll(scaled(probabilities, fitted), labels) <= min(mean_nll(scaled(probabilities, t), labels)
                                                                   for t in grid) + 1e-12
    assert fit_temperature(np.array([[1.0, 0.0], [0.0, 1.0]]), [0, 1]) == 0.01  # always right: as sharp as allowed
    assert fit_temperature(np.array([[0.9, 0.1], [0.1, 0.9]]), [1, 0]) == 100.0  # always wrong: as flat as allowed


def test_temperature_one_gives_the_probabilities_back(logits):
    probabilities = torch.softmax(torch.as_tensor(logits[:50]), dim=1).numpy()
    np.testing.assert_allclose(scaled(probabilities, 1.0), probabilities)
    np.testing.assert_allclose(scaled(probabilities, 1.0 + 1e-12), probabilities, atol=1e-9)


def test_temperature_file_and_bad_values(tmp_path):
    write_calibration(tmp_path / "calibration.json", 0.42, {"fitted_on": "validation"})
    assert read_temperature(str(tmp_path / "calibration.json")) == 0.42
    assert read_temperature("1.5") == 1.5
    for bad in ("0", "-1", "nan", str(tmp_path / "missing.json")):
        with pytest.raises(UsageError):
            read_temperature(bad)
    (tmp_path / "other.json").write_text('{"something": 1}')
    with pytest.raises(UsageError, match="not a calibration.json"):
        read_temperature(str(tmp_path / "other.json"))


def test_a_training_run_fits_its_temperature_on_validation_as_predict_does_and_predict_takes_it(tmp_path):
    import json

    from conftest import TINY_DATA, run_in_process
    from inference.temperature import run_temperature
    from test_predict import run_script

    code, out, err = run_in_process("main.py", [*TINY_DATA, "--epochs", "1", "--save-dir", tmp_path / "run"])
    assert code == 0, err
    written = json.loads((tmp_path / "run" / "calibration.json").read_text())
    assert written["checkpoint"] == "best.pt" and written["windows"] > 0
    report = json.loads((tmp_path / "run" / "test_report.json").read_text())
    assert report["temperature"]["value"] == written["temperature"] and 0 <= report["ece"] <= 1
    assert f"at temperature {written['temperature']:.3f}" in out
    # predict.py rebuilds the run's validation split and fits the same temperature on best.pt's probabilities.
    code, _, err = run_script("predict", ["--checkpoint", tmp_path / "run" / "best.pt", "--dataset", "synthetic",
                                          "--out", tmp_path / "eval"])
    assert code == 0, err
    refitted = json.loads((tmp_path / "eval" / "calibration.json").read_text())["temperature"]
    assert refitted == pytest.approx(written["temperature"], rel=1e-3)
    # A recording takes the run's temperature for best.pt only: another checkpoint's weights were not fitted.
    assert run_temperature(tmp_path / "run" / "best.pt") == written["temperature"]
    assert run_temperature(tmp_path / "run" / "last.pt") == 1.0
    assert run_temperature(tmp_path / "elsewhere" / "best.pt") == 1.0


def test_a_run_without_a_validation_split_fits_no_temperature(tmp_path):
    import json

    from conftest import TINY_DATA, run_in_process

    (tmp_path / "calibration.json").write_text('{"temperature": 0.5, "checkpoint": "best.pt"}')  # an earlier run's
    code, out, err = run_in_process("main.py", [*TINY_DATA, "--epochs", "1", "--val-fraction", "0",
                                                "--save-dir", tmp_path])
    assert code == 0, err
    assert not (tmp_path / "calibration.json").exists()
    assert "temperature" not in json.loads((tmp_path / "test_report.json").read_text())
    assert "no validation split to fit one on" in out
