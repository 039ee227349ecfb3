"""A run owns its folder: a fresh run moves an earlier run's files aside before its first save (and
leaves a user's files where they are), a run records only the settings it trained with, and an
automatic resume compares what the data is, not where it lies or how its kind was spelt."""
import json

import torch
import yaml

from conftest import TINY_DATA, load_checkpoint, run_in_process
from training.checkpoint.judge import changed_flags, run_differences
from training.config.cli import parse_config
from training.errors import EXIT_DIVERGED, EXIT_USAGE

# 17 training subjects x 8 windows: 5 steps of 32 per epoch, about a second an epoch.
SMALL = [*TINY_DATA, "--synthetic-windows-per-subject", "8"]


def files_in(folder):
    return {path.relative_to(folder).as_posix(): path.read_bytes() for path in sorted(folder.rglob("*"))
            if path.is_file() and not path.name.startswith(".")}


def test_a_fresh_run_moves_the_earlier_runs_files_aside_and_keeps_the_users(tmp_path):
    earlier = [*SMALL, "--epochs", "2", "--save-dir", tmp_path]
    code, _, err = run_in_process("main.py", earlier)
    assert code == 0, err
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "logs" / "notes.txt").write_text("mine too")  # beside TensorBoard's files, still the user's
    users = {"notes.txt", "logs/notes.txt"}
    before = files_in(tmp_path)
    assert "step-00000010.pt" in before and "calibration.json" in before

    code, out, err = run_in_process("main.py", [*SMALL, "--epochs", "1", "--save-dir", tmp_path, "--no-resume"])
    assert code == 0, err
    aside = tmp_path / "previous-1"
    assert f"into {aside}" in out
    # Every file of the earlier run, byte for byte, in previous-1; the user's file where it was.
    assert files_in(aside) == {name: data for name, data in before.items() if name not in users}
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert (tmp_path / "logs" / "notes.txt").read_text() == "mine too"
    # The folder holds this run alone: no step checkpoint of two epochs for a damaged last.pt to fall
    # back to, and the temperature beside best.pt is this run's.
    for path in tmp_path.glob("*.pt"):
        assert load_checkpoint(path)["config"]["epochs"] == 1, path.name
    assert json.loads((tmp_path / "calibration.json").read_text()) != json.loads(before["calibration.json"])
    assert [json.loads(line)["epoch"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1]


def test_a_fresh_run_that_stops_before_saving_leaves_the_earlier_run_in_place(tmp_path):
    # At --lr 1e6 BatchNorm's running variance overflows within the first epoch: nothing is saved.
    earlier = [*TINY_DATA, "--synthetic-windows-per-subject", "20", "--batch-size", "64", "--epochs", "1",
               "--save-dir", tmp_path]
    assert run_in_process("main.py", earlier)[0] == 0
    before = files_in(tmp_path)
    code, _, err = run_in_process("main.py", [*earlier, "--no-resume", "--lr", "1e6"])
    assert code == EXIT_DIVERGED and "nothing of this run was saved" in err, err
    assert files_in(tmp_path) == before and not (tmp_path / "previous-1").exists()


def test_a_finished_run_rerun_with_other_flags_records_the_settings_it_trained_with(tmp_path):
    flags = [*SMALL, "--epochs", "1", "--save-dir", tmp_path]
    assert run_in_process("main.py", flags)[0] == 0
    code, out, err = run_in_process("main.py", [*flags, "--weight-decay", "0.5"])
    assert code == 0 and "already trained for 1 of 1 epochs" in out, err
    config = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert config["weight_decay"] == load_checkpoint(tmp_path / "last.pt")["config"]["weight_decay"] != 0.5


def test_other_data_at_the_same_path_is_refused_and_the_same_data_elsewhere_resumes(tmp_path):
    from test_npz_dataset import windows, write_npz
    data = write_npz(tmp_path / "windows.npz", **windows(subjects=6, per_subject=8))
    flags = ["--dataset", "npz", "--data-dir", data, "--model", "cnn1d", "--no-figures", "--epochs", "2",
             "--batch-size", "8", "--save-dir", tmp_path / "run"]
    assert run_in_process("main.py", [*flags, "--stop-after-epochs", "1"])[0] == 0
    before = files_in(tmp_path / "run")
    write_npz(data, **windows(subjects=6, per_subject=8, seed=1))  # other windows under the same name
    code, out, err = run_in_process("main.py", flags)
    assert code == EXIT_USAGE and err.count("\n") == 1, err
    assert f"the data at --data-dir {data} (other windows than the run was trained on)" in err
    assert "RESUMING" not in out and files_in(tmp_path / "run") == before
    # Named with --resume PATH, the other data is taken as meant, and said.
    code, out, err = run_in_process("main.py", [*flags[:-1], tmp_path / "branch", "--resume", tmp_path / "run" /
                                                "last.pt"])
    assert code == 0 and "RESUMING" in out and "resumed on other data than" in err, err
    # The data the run was trained on, under another name: the same run, resumed.
    moved = write_npz(tmp_path / "renamed.npz", **windows(subjects=6, per_subject=8))
    code, out, err = run_in_process("main.py", [*flags[:3], moved, *flags[4:]])
    assert code == 0 and "RESUMING" in out, err


def test_a_dataset_kind_is_compared_by_what_it_resolves_to():
    saved = parse_config(SMALL).flags()  # --dataset synthetic
    auto = [flag if flag != "synthetic" else "auto" for flag in SMALL]  # no --data-dir: synthetic
    assert run_differences(saved, parse_config(auto)) == []
    assert run_differences(saved, parse_config([*auto, "--data-dir", "/data/har"])) != []


def test_a_models_own_setting_and_its_value_given_are_one_run():
    """A run saved with --feature-views 4 (minirocket's own) resumed without it is no change, and the
    other way round; another value is."""
    saved = parse_config(["--model", "minirocket", "--feature-views", "4", "--label-smoothing", "0.2"]).flags()
    assert changed_flags(saved, parse_config(["--model", "minirocket"])) == []
    assert changed_flags(parse_config(["--model", "minirocket"]).flags(),
                         parse_config(["--model", "minirocket", "--feature-views", "4"])) == []
    assert len(changed_flags(saved, parse_config(["--model", "minirocket", "--feature-views", "2"]))) == 1


def test_finished_folds_are_compared_by_what_their_settings_mean(tmp_path):
    cv = [*SMALL, "--cv-folds", "2", "--epochs", "1", "--no-test", "--save-dir", tmp_path]
    assert run_in_process("main.py", cv)[0] == 0
    auto = [flag if flag != "synthetic" else "auto" for flag in cv]
    code, out, err = run_in_process("main.py", auto)
    assert code == 0, err
    assert "fold 1/2 already finished" in out and "fold 2/2 already finished" in out and "=== fold" not in out


def test_another_validation_split_is_another_run():
    saved = parse_config(SMALL).flags()
    assert run_differences(saved, parse_config([*SMALL, "--val-split", "time"])) != []


def test_a_resumed_minirocket_keeps_its_fitted_parts_instead_of_fitting_them_to_other_windows(tmp_path):
    """Resumed on purpose on other windows, the run's fixed parts (and so its feature pool) are the
    checkpoint's: fitted again, the head would train on features its saved model never makes."""
    minirocket = [*SMALL, "--model", "minirocket", "--width", "840", "--epochs", "2", "--head-fit", "adamw"]
    code, _, err = run_in_process("main.py", [*minirocket, "--stop-after-epochs", "1", "--save-dir", tmp_path / "a"])
    assert code == 0, err
    code, out, err = run_in_process("main.py", [*minirocket, "--synthetic-seed", "5", "--resume",
                                                tmp_path / "a" / "last.pt", "--save-dir", tmp_path / "b"])
    assert code == 0, err
    assert "took minirocket's fixed parts from the checkpoint" in out + err and "fitted minirocket" not in out + err
    first, resumed = (load_checkpoint(tmp_path / name / "last.pt")["model"]["biases"] for name in ("a", "b"))
    assert torch.equal(first, resumed)


def test_a_best_pt_of_another_model_in_a_finished_run_is_refused_in_one_line_and_kept(tmp_path):
    runs = {name: [*SMALL, "--epochs", "1", "--model", name, "--save-dir", tmp_path / name]
            for name in ("cnn1d", "cnn_lstm")}
    for flags in runs.values():
        code, _, err = run_in_process("main.py", flags)
        assert code == 0, err
    foreign = (tmp_path / "cnn_lstm" / "best.pt").read_bytes()
    (tmp_path / "cnn1d" / "best.pt").write_bytes(foreign)
    code, _, err = run_in_process("main.py", runs["cnn1d"])  # finished: only its report runs again
    assert code == EXIT_USAGE and err.count("\n") == 1 and "Traceback" not in err, err
    assert "best.pt holds no weights of this run's model" in err
    assert (tmp_path / "cnn1d" / "best.pt").read_bytes() == foreign
