"""studies.nested_cv: bad arguments in one line, cached windows and finished outer folds reused only
when they match what made them."""
import contextlib
import io
import json
import sys

import numpy as np
import pytest

from conftest import run_subprocess
from studies import nested_cv
from test_bad_input import assert_refused, edit_line, write_fake_uci
from training.entry_point import run_entry_point

TRAINING = ["--model", "cnn1d", "--epochs", "1", "--val-fraction", "0", "--batch-size", "4", "--no-figures"]


def run_nested(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run_entry_point(nested_cv.main, [str(part) for part in argv])
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def root(tmp_path):
    return write_fake_uci(tmp_path / "UCI HAR Dataset")  # training subjects 1, 3, 5


@pytest.mark.parametrize("argv, names", [
    (["--outer-folds", "1"], ["--outer-folds must be at least 2, got 1"]),
    (["--outer-folds", "4"], ["--outer-folds 4 is more than the 3 training subjects"]),
    (["--nproc-per-node", "0"], ["--nproc-per-node must be at least 1, got 0"]),
    (["--outer-only", "3"], ["--outer-only 3 is not an outer fold", "0..2"]),
    (["--outer-only", "a"], ["expected comma-separated outer fold numbers"]),
    (["--name", "../elsewhere"], ["plain folder name"]),
    (["--bogus"], ["unrecognized arguments: --bogus"]),
    (["--", "--save-dir", "x"], ["--save-dir after --", "drop it"]),
    (["--", "--epochs", "zero"], ["the training flags after --", "--epochs"]),
])
def test_bad_arguments_are_one_line(root, tmp_path, argv, names):
    base = ["--data-dir", root, "--out", tmp_path / "out", "--name", "a", "--outer-folds", "3"]  # argv's win
    assert_refused(run_nested([*base, *argv]), *names)
    assert not (tmp_path / "out" / "a").exists()


def test_a_missing_layout_or_name_is_one_line(tmp_path):
    assert_refused(run_nested(["--data-dir", tmp_path / "none", "--out", tmp_path / "out", "--name", "a"]),
                   "not a UCI HAR layout")
    assert_refused(run_nested(["--out", tmp_path / "out", "--name", "a"]), "--data-dir and --name are needed")
    assert_refused(run_nested(["--data-dir", tmp_path]), "the following arguments are required: --out")


def test_cached_windows_are_rewritten_when_their_data_changed(root, tmp_path):
    files = nested_cv.write_outer_folds(root, tmp_path / "windows", folds=3, seed=0)
    written = {path: path.stat().st_mtime_ns for path, _ in files}
    assert nested_cv.write_outer_folds(root, tmp_path / "windows", folds=3, seed=0) == files
    assert {path: path.stat().st_mtime_ns for path, _ in files} == written  # the same data: kept as they are
    signals = root / "train" / "Inertial Signals" / "body_acc_x_train.txt"
    edit_line(signals, 2, lambda line: " ".join(f"{float(value) + 1:.7e}" for value in line.split()))  # new data
    nested_cv.write_outer_folds(root, tmp_path / "windows", folds=3, seed=0)
    nested_cv.write_outer_folds(root, tmp_path / "fresh", folds=3, seed=0)
    for path, _ in files:
        with np.load(path) as kept, np.load(tmp_path / "fresh" / path.name) as fresh:
            assert kept.files == fresh.files
            for name in kept.files:
                np.testing.assert_array_equal(kept[name], fresh[name])


def test_a_finished_outer_fold_is_kept_refused_with_other_flags_and_redone_when_damaged(root, tmp_path):
    command = [sys.executable, "-m", "studies.nested_cv", "--data-dir", root, "--out", tmp_path / "out",
               "--name", "cfg", "--outer-folds", "3", "--outer-only", "0", "--", *TRAINING]
    first = run_subprocess(command, env={"OMP_NUM_THREADS": "1"})
    assert first.returncode == 0, first.stderr
    report = tmp_path / "out" / "cfg" / "outer-0" / "test_report.json"
    expected = json.loads(report.read_text())
    code, out, err = run_nested(command[3:])
    assert code == 0, err
    assert "outer fold 1/3" not in out and "cfg (1 of 3)" in out  # kept, not trained again
    line = assert_refused(run_nested([*command[3:-len(TRAINING)], *TRAINING, "--epochs", "2"]),
                          "outer-0 was trained with other flags", "another --name")
    assert "--name cfg" in line
    report.write_text(report.read_text()[:-20])  # damaged after it finished
    again = run_subprocess(command, env={"OMP_NUM_THREADS": "1"})
    assert again.returncode == 0, again.stderr
    assert "outer fold 1: test_report.json is not what was written" in again.stdout
    repaired = json.loads(report.read_text())
    assert repaired["accuracy"] == expected["accuracy"] and repaired["per_subject"] == expected["per_subject"]


def test_a_damaged_wall_time_is_left_out_with_a_warning(tmp_path, capsys):
    (tmp_path / "wall_s.txt").write_text("twelve\n")
    assert nested_cv.wall_seconds(tmp_path / "wall_s.txt") is None
    assert "does not hold a number of seconds" in capsys.readouterr().err
    (tmp_path / "wall_s.txt").write_text("12\n")
    assert nested_cv.wall_seconds(tmp_path / "wall_s.txt") == 12.0
    assert nested_cv.wall_seconds(tmp_path / "missing.txt") is None
