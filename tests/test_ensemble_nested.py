"""studies/ensemble_nested.py: each outer fold's score is that of its configurations' models with
their probabilities averaged, on the fold's held-out people, in studies.nested_cv's report form."""
import json

import numpy as np
import pytest

from data.splits import channel_names
from data.uci_har import CLASS_NAMES
from inference.bundle import load_bundle, probabilities
from studies.ensemble_nested import main
from studies.nested_cv import IDENTITY, REPORT
from tests.inference_fixtures import make_checkpoint
from training.errors import UsageError

NAMES = channel_names("flatten")


def outer_folds(tmp_path, configurations, folds=2):
    """Random windows per outer fold (people 5 and 6 held out) and an untrained model per configuration."""
    rng = np.random.default_rng(1)
    for fold in range(folds):
        subjects = np.repeat(np.arange(1, 7), 40)
        data = tmp_path / "windows" / f"outer-{fold}.npz"
        data.parent.mkdir(exist_ok=True)
        np.savez(data, signals=rng.normal(size=(240, len(NAMES), 128)).astype(np.float32),
                 labels=rng.integers(0, len(CLASS_NAMES), 240), subjects=subjects,
                 split=np.where(subjects > 4, "test", "train"), class_names=np.array(CLASS_NAMES),
                 channel_names=np.array(NAMES), sample_rate_hz=50.0)
        for seed, name in enumerate(configurations):
            (tmp_path / name / f"outer-{fold}").mkdir(parents=True, exist_ok=True)
            (tmp_path / name / f"outer-{fold}" / IDENTITY).write_text(json.dumps({"inputs": {"subjects": [5, 6]}}))
            make_checkpoint(tmp_path / name / f"outer-{fold}" / "best.pt", seed=10 * fold + seed, config={
                "model": "cnn1d", "mode": "flatten", "norm": "batch", "dropout": 0.0, "seed": 42,
                "val_fraction": 0.0, "dataset": "npz", "data_dir": str(data)})


def test_each_outer_fold_scores_its_members_probabilities_averaged(tmp_path, capsys):
    outer_folds(tmp_path, ("a", "b"))
    expected, alone = [], []
    for fold in range(2):
        with np.load(tmp_path / "windows" / f"outer-{fold}.npz") as arrays:
            test = arrays["split"] == "test"
            each = [probabilities(load_bundle(tmp_path / name / f"outer-{fold}" / "best.pt"), arrays["signals"][test],
                                  "cpu") for name in ("a", "b")]
            expected.append(float(np.mean(np.mean(each, axis=0).argmax(axis=1) == arrays["labels"][test])))
            alone.append(float(np.mean(each[0].argmax(axis=1) == arrays["labels"][test])))
    assert expected != alone  # the members disagree enough for the average to score otherwise
    assert main(["--out", str(tmp_path), "--names", "a,b", "--device", "cpu"]) == 0
    report = json.loads((tmp_path / "ensemble-a+b" / REPORT).read_text())
    assert [row["accuracy"] for row in report["folds"]] == pytest.approx(expected)
    assert report["mean"]["accuracy"] == pytest.approx(np.mean(expected))
    assert [row["subjects"] for row in report["folds"]] == [[5, 6], [5, 6]]
    assert "ensemble-a+b" in capsys.readouterr().out
    # Kept as a nested configuration's outer folds: the ensemble as best.pt, the held-out people beside it.
    for fold in range(2):
        kept = tmp_path / "ensemble-a+b" / f"outer-{fold}"
        assert load_bundle(kept / "best.pt").members == 2
        assert json.loads((kept / IDENTITY).read_text())["inputs"]["subjects"] == [5, 6]


def test_one_configuration_or_no_shared_outer_fold_is_refused(tmp_path):
    outer_folds(tmp_path, ("a",), folds=1)
    with pytest.raises(UsageError, match="two configurations or more"):
        main(["--out", str(tmp_path), "--names", "a"])
    with pytest.raises(UsageError, match="no outer fold has a best.pt under every one of a, missing"):
        main(["--out", str(tmp_path), "--names", "a,missing"])
