"""studies/tta_nested.py: the copies it averages are the transforms they claim to be, and its
'none' row is the plain model's accuracy on each outer fold's people."""
import numpy as np
import pytest

from data.augment import sensor_triples
from data.splits import channel_names
from data.uci_har import CLASS_NAMES
from inference.bundle import load_bundle, probabilities
from studies.tta_nested import axis_rotation, main, transformed
from tests.inference_fixtures import make_checkpoint

NAMES = channel_names("flatten")
TRIPLES = sensor_triples(NAMES)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_axis_rotation_is_proper_and_turns_by_the_angle(axis):
    matrix = axis_rotation(axis, 10)
    np.testing.assert_allclose(matrix @ matrix.T, np.eye(3), atol=1e-12)
    assert np.linalg.det(matrix) == pytest.approx(1.0)
    assert matrix[axis, axis] == 1.0 and np.trace(matrix) == pytest.approx(1 + 2 * np.cos(np.radians(10)))
    np.testing.assert_allclose(axis_rotation(axis, 0), np.eye(3))


def test_copies_rotate_flip_shift_and_scale_every_sensor_together():
    windows = np.random.default_rng(0).normal(size=(4, len(NAMES), 16)).astype(np.float32)
    rotated = transformed(windows, "rotate", (2, 10), TRIPLES)
    for triple in TRIPLES:
        np.testing.assert_allclose(np.linalg.norm(rotated[:, triple], axis=1),
                                   np.linalg.norm(windows[:, triple], axis=1), rtol=1e-5)
        np.testing.assert_allclose(rotated[:, triple[2]], windows[:, triple[2]])  # z is the axis
    assert not np.allclose(rotated, windows)
    flipped = transformed(windows, "flip", None, TRIPLES)
    for x, y, z in TRIPLES:
        np.testing.assert_allclose(flipped[:, [x, y, z]], windows[:, [x, y, z]] * np.array([1, -1, -1])[:, None])
    np.testing.assert_array_equal(transformed(transformed(windows, "shift", 4, TRIPLES), "shift", -4, TRIPLES),
                                  windows)
    np.testing.assert_allclose(transformed(windows, "scale", 1.1, TRIPLES), windows * 1.1, rtol=1e-6)


def test_none_row_is_the_plain_accuracy_of_each_outer_fold(tmp_path, capsys):
    rng = np.random.default_rng(1)
    plain = []
    for fold in range(2):
        subjects = np.repeat(np.arange(1, 7), 10)
        data = tmp_path / f"outer-{fold}.npz"
        np.savez(data, signals=rng.normal(size=(60, len(NAMES), 128)).astype(np.float32),
                 labels=rng.integers(0, len(CLASS_NAMES), 60), subjects=subjects,
                 split=np.where(subjects > 4, "test", "train"), class_names=np.array(CLASS_NAMES),
                 channel_names=np.array(NAMES), sample_rate_hz=50.0)
        (tmp_path / "run" / f"outer-{fold}").mkdir(parents=True)
        checkpoint = make_checkpoint(tmp_path / "run" / f"outer-{fold}" / "best.pt", seed=fold, config={
            "model": "cnn1d", "mode": "flatten", "norm": "batch", "dropout": 0.0, "seed": 42,
            "val_fraction": 0.0, "dataset": "npz", "data_dir": str(data)})
        with np.load(data) as arrays:
            test = arrays["split"] == "test"
            predicted = probabilities(load_bundle(checkpoint), arrays["signals"][test], "cpu").argmax(axis=1)
            plain.append(float(np.mean(predicted == arrays["labels"][test])))
    main(["--run", str(tmp_path / "run"), "--device", "cpu"])
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[2:]}
    assert set(rows) == {"none", "shift", "rotate", "scale", "shift+rotate", "flip"}
    assert [float(value) for value in rows["none"][-2:]] == pytest.approx(plain, abs=5e-5)
    assert float(rows["none"][1]) == pytest.approx(np.mean(plain), abs=5e-5)
