"""The recipe chosen on the validation people (--recipe-choice, training/loop/recipe_choice.py): the
plain candidate is the run it stands for, bit for bit; a run that keeps its augmented views is the run
without the choice; the test split never moves the choice; too small a validation split keeps the
recipe as set and says so."""
import re

import numpy as np
import torch

from conftest import load_checkpoint, run_in_process
from test_npz_dataset import windows, write_npz

# 30 people x 40 windows, 17 train and 4 validate; an AdamW head over 3 views, weight average on.
ARGS = ["--dataset", "synthetic", "--synthetic-windows-per-subject", "40", "--model", "minirocket", "--width", "2000",
        "--head-fit", "adamw", "--feature-views", "3", "--epochs", "4", "--batch-size", "64", "--no-figures",
        "--final-model", "validated"]
# Noise of 20 standard deviations: views no validation person can recognise, so the plain windows win.
NOISE = ["--augment", "jitter", "--aug-jitter", "20"]


def train(save_dir, *flags, args=ARGS):
    code, out, err = run_in_process("main.py", [*args, "--save-dir", save_dir, *flags])
    assert code == 0, err
    return out


def assert_same_tensors(expected, actual):
    assert expected.keys() == actual.keys()
    for key, value in expected.items():
        if isinstance(value, dict):
            assert_same_tensors(value, actual[key])
        elif torch.is_tensor(value):
            assert torch.equal(value, actual[key]), key


def test_where_the_plain_windows_win_best_pt_is_the_run_trained_on_them_alone(tmp_path):
    console = train(tmp_path / "chosen", *NOISE)
    assert "recipe: the windows as they are, without augmentation: validation macro-F1" in console
    plain = train(tmp_path / "plain", "--augment", "none", "--recipe-choice", "fixed")
    assert "recipe:" not in plain
    chosen, alone = (load_checkpoint(tmp_path / name / "best.pt") for name in ("chosen", "plain"))
    assert_same_tensors(alone["model"], chosen["model"])
    assert_same_tensors(alone["ema"]["weights"], chosen["ema"]["weights"])
    last = load_checkpoint(tmp_path / "chosen" / "last.pt")
    best_epoch = re.search(r"(\d)\) on the windows as they are", console)[1]
    assert last["recipe"] == "plain" and last["epoch"] - last["epochs_since_best"] == int(best_epoch)
    again = train(tmp_path / "chosen", *NOISE)  # the same command: the choice is kept, not made again
    assert "recipe:" not in again and "evaluating the test split" in again


def test_a_run_that_keeps_its_augmented_views_is_the_run_without_the_choice(tmp_path):
    console = train(tmp_path / "chosen")
    assert "recipe: the augmented views: validation macro-F1" in console
    train(tmp_path / "fixed", "--recipe-choice", "fixed")
    for name in ("best.pt", "last.pt"):
        fixed, chosen = (load_checkpoint(tmp_path / run / name) for run in ("fixed", "chosen"))
        for part in ("model", "ema", "optimizer", "scheduler"):
            assert_same_tensors(fixed[part], chosen[part])
        assert (fixed["epoch"], fixed["step"], fixed["best_metric"]) == (chosen["epoch"], chosen["step"],
                                                                        chosen["best_metric"])
    assert load_checkpoint(tmp_path / "chosen" / "last.pt")["recipe"] == "augmented"


def test_the_test_labels_never_move_the_choice(tmp_path):
    arrays = windows(subjects=12, per_subject=30, channels=3, steps=64, classes=3)
    split = np.where(arrays["subjects"] > 9, "test", "train")
    shuffled = arrays["labels"].copy()
    test = split == "test"
    shuffled[test] = np.random.default_rng(5).permutation(shuffled[test])
    assert (shuffled[test] != arrays["labels"][test]).any()
    lines, weights = [], []
    for name, labels in (("kept", arrays["labels"]), ("shuffled", shuffled)):
        path = write_npz(tmp_path / f"{name}.npz", **{**arrays, "labels": labels}, split=split)
        args = ["--dataset", "npz", "--data-dir", path, "--model", "minirocket", "--width", "2000", "--head-fit",
                "adamw", "--feature-views", "3", "--epochs", "3", "--batch-size", "32", "--no-figures",
                "--val-subjects", "1,2,3"]
        console = train(tmp_path / name, args=args)
        lines.append(re.search(r"recipe: .*", console)[0])
        weights.append(load_checkpoint(tmp_path / name / "best.pt")["model"])
    assert lines[0] == lines[1]
    assert_same_tensors(weights[0], weights[1])


def test_one_validation_person_is_too_few_to_choose_on_and_the_recipe_as_set_is_kept(tmp_path):
    console = train(tmp_path / "run", "--val-subjects", "3")
    assert re.search(r"recipe: 40 validation windows of 1 person\(s\) are too few to choose on .*: the augmentations "
                     r"as set \(rotate,flip,scale,jitter,shift\) are kept", console)
    assert "recipe: the" not in console
    assert load_checkpoint(tmp_path / "run" / "last.pt")["recipe"] == ""


def test_the_plain_windows_must_win_by_more_than_the_margin(tmp_path, monkeypatch):
    from training.loop import recipe_choice
    monkeypatch.setattr(recipe_choice, "CHOICE_MARGIN", 1.0)  # no macro-F1 wins by more than 1
    console = train(tmp_path / "run", *NOISE)
    line = re.search(r"recipe: the augmented views: validation macro-F1 (\S+) .*, (\S+) \(epoch \d+\) on the windows",
                     console)
    assert line and float(line[2]) > float(line[1])  # the plain windows scored higher and still lost
    assert load_checkpoint(tmp_path / "run" / "last.pt")["recipe"] == "augmented"
