"""The final model trained on every training person after validation chose (--final-model,
training/loop/refit.py): what the choice keeps, what the final pass trains on, and that a run stopped
in it ends where an uninterrupted one does."""
import json
import re
import signal
import sys

import numpy as np
import pytest
import torch

from conftest import load_checkpoint, run_in_process, run_subprocess
from data.splits import Split
from training.loop.refit import everyone

# 30 people x 40 windows: 17 train, 4 validate, 9 are the test. The AdamW head (auto would solve
# this few windows by ridge) over 3 views, with the weight average on.
ARGS = ["--dataset", "synthetic", "--synthetic-windows-per-subject", "40", "--model", "minirocket", "--width", "2000",
        "--head-fit", "adamw", "--feature-views", "3", "--epochs", "4", "--batch-size", "64", "--no-figures"]


def train(save_dir, *extra):
    code, out, err = run_in_process("main.py", [*ARGS, "--save-dir", save_dir, *extra])
    assert code == 0, err
    return out


def weights(path):
    return load_checkpoint(path)["model"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(save dir, console) of the same run keeping the validated weights and training everyone's."""
    made = {}
    for final in ("validated", "everyone"):
        save_dir = tmp_path_factory.mktemp(final)
        made[final] = save_dir, train(save_dir, "--final-model", final)
    return made


def test_the_pool_of_everyone_holds_each_view_of_both_groups_in_that_views_place():
    train = Split(np.arange(3 * 4)[:, None], np.arange(12) % 2, np.zeros(12))  # 3 views of 4 windows
    val = Split(100 + np.arange(3 * 2)[:, None], np.ones(6), np.ones(6))  # 3 views of 2 windows
    joined = everyone(train, val, 3)
    assert joined.signals[:, 0].tolist() == [0, 1, 2, 3, 100, 101, 4, 5, 6, 7, 102, 103, 8, 9, 10, 11, 104, 105]
    assert joined.subjects.tolist() == [0] * 4 + [1] * 2 + [0] * 4 + [1] * 2 + [0] * 4 + [1] * 2


def test_validation_chooses_with_the_same_model_either_way(runs):
    """The validation report and the temperature are the chosen model's under both settings: the
    final pass starts after them."""
    (validated, _), (everyone_dir, _) = runs["validated"], runs["everyone"]
    for name in ("val_report.json", "calibration.json"):
        kept, refitted = (json.loads((folder / name).read_text()) for folder in (validated, everyone_dir))
        kept.pop("checkpoint", None), refitted.pop("checkpoint", None), refitted.pop("fitted_on", None)
        kept.pop("fitted_on", None)
        assert kept == refitted, name


def test_the_final_model_trains_for_the_chosen_epochs_on_every_training_person(runs):
    (validated, _), (everyone_dir, console) = runs["validated"], runs["everyone"]
    chosen = load_checkpoint(validated / "last.pt")
    chosen_epoch = chosen["epoch"] - chosen["epochs_since_best"]
    final = load_checkpoint(everyone_dir / "last.pt")
    assert final["refitted"] and final["epoch"] == chosen_epoch
    windows = re.search(r"train (\d+) windows .* val (\d+) /", console)
    people = int(windows[1]) + int(windows[2])
    assert f"on every training person ({people:,} windows" in console
    assert f"for the {chosen_epoch} epoch(s) validation chose" in console
    head = [name for name in chosen["model"] if name.startswith("head")]
    assert head and any(not torch.equal(weights(validated / "best.pt")[name], weights(everyone_dir / "best.pt")[name])
                        for name in head)
    test_report = json.loads((everyone_dir / "test_report.json").read_text())
    fitted = json.loads((validated / "calibration.json").read_text())["temperature"]
    assert test_report["temperature"]["value"] == fitted


# The run saves after each of its 4 epochs, then once the recipe is chosen, then the final model.
@pytest.mark.parametrize("save, after", [(5, "the recipe's choice"), (6, "the final model")])
def test_a_run_killed_while_saving_what_follows_its_epochs_trains_it_again_to_the_same_weights(runs, tmp_path, save,
                                                                                                 after):
    everyone_dir, _ = runs["everyone"]
    command = [sys.executable, "main.py", *ARGS, "--save-dir", tmp_path]
    killed = run_subprocess(command, env={"HAR_FAULT": f"kill@save:{save}"})
    assert killed.returncode == -signal.SIGKILL, after
    stood = load_checkpoint(tmp_path / "last.pt")
    assert not stood["refitted"] and bool(stood["recipe"]) == (save == 6)
    resumed = run_subprocess(command)
    assert resumed.returncode == 0, resumed.stderr
    assert "final model: epoch 1/" in resumed.stdout  # trained again, not found
    for name in ("best.pt", "last.pt"):
        expected, actual = weights(everyone_dir / name), weights(tmp_path / name)
        assert all(torch.equal(expected[key], actual[key]) for key in expected), name
    again = run_subprocess(command)  # a finished run only reports
    assert again.returncode == 0 and "the final model was trained; evaluating the test split" in again.stdout
    assert json.loads((tmp_path / "test_report.json").read_text())["accuracy"] == \
        json.loads((everyone_dir / "test_report.json").read_text())["accuracy"]


def test_a_head_solved_by_ridge_is_reported_on_validation_and_then_solved_on_every_training_person(tmp_path):
    args = [a for a in ARGS if a not in ("--head-fit", "adamw")]
    code, out, err = run_in_process("main.py", [*args, "--save-dir", tmp_path / "everyone"])
    assert code == 0, err
    windows = re.search(r"train (\d+) windows .* val (\d+) /", out)
    assert f"head: ridge regression on {int(windows[1]):,} training windows" in out
    assert f"the validation people included: {int(windows[1]) + int(windows[2]):,} training windows" in out
    kept = tmp_path / "kept"
    code, out, err = run_in_process("main.py", [*args, "--save-dir", kept, "--final-model", "validated"])
    assert code == 0, err
    assert "final model" not in out
    for name in ("val_report.json", "calibration.json"):  # the same solve on the training people reported
        assert json.loads((kept / name).read_text())["accuracy" if name[0] == "v" else "temperature"] == \
            json.loads((tmp_path / "everyone" / name).read_text())["accuracy" if name[0] == "v" else "temperature"]
    solved = [weights(folder / "best.pt")["head.1.weight"] for folder in (kept, tmp_path / "everyone")]
    assert not torch.equal(*solved)


def test_evaluating_a_final_model_takes_the_temperature_its_run_fitted_before_it_saw_the_validation_people(runs,
                                                                                                          tmp_path):
    everyone_dir, _ = runs["everyone"]
    command = [sys.executable, "predict.py", "--checkpoint", everyone_dir / "best.pt", "--dataset", "synthetic"]
    scored = run_subprocess([*command, "--out", tmp_path / "test"])
    assert scored.returncode == 0, scored.stderr
    written = json.loads((tmp_path / "test" / "calibration.json").read_text())
    assert written["temperature"] == json.loads((everyone_dir / "calibration.json").read_text())["temperature"]
    assert "before this final model trained on it" in written["fitted_on"]
    val = run_subprocess([*command, "--split", "val", "--out", tmp_path / "val"])
    assert val.returncode == 0, val.stderr
    assert "not a held-out estimate" in val.stderr


def test_a_run_begun_before_the_final_model_ends_as_it_would_have_then(tmp_path):
    """A checkpoint whose flags lack --final-model and --recipe-choice (written before they existed)
    resumes to its validated weights: no recipe pass, no final model."""
    train(tmp_path, "--epochs", "2", "--stop-after-epochs", "1")
    checkpoint = load_checkpoint(tmp_path / "last.pt")
    for flag in ("final_model", "recipe_choice"):
        checkpoint["config"].pop(flag)
    torch.save(checkpoint, tmp_path / "last.pt")
    console = train(tmp_path, "--epochs", "2")
    assert "this run began before --final-model and --recipe-choice" in console
    assert "recipe:" not in console and "final model:" not in console
    assert not load_checkpoint(tmp_path / "last.pt")["refitted"]
    assert "best checkpoint by validation macro-F1" in console
