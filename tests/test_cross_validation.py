"""Subject-wise cross-validation: the folds, the report, resuming a killed run, folds in parallel."""
import json
import signal
import sys

import numpy as np
import pytest
import torch

from conftest import TINY_DATA, load_checkpoint, run_in_process, run_subprocess
from crossval.folds import FOLDS_FILE, _claim_folder, fold_subjects
from data.sources import load_har_data
from outputs.safety import OutputRefused
from training.errors import UsageError

# 21 training subjects x 32 windows, 2 folds, 2 epochs, a checkpoint after every step.
CV = [*TINY_DATA, "--cv-folds", "2", "--ensemble", "--epochs", "2", "--no-test", "--save-every-steps", "1",
      "--augment", "rotate,scale,jitter,shift", "--ema-decay", "0.9"]
ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # the parallel run's processes get one thread each too


@pytest.mark.parametrize("folds", [2, 3, 7, 21])
def test_folds_partition_the_training_subjects_and_never_a_test_subject(folds):
    data = load_har_data("synthetic", synthetic_windows_per_subject=2)
    training = np.concatenate([data.train.subjects, data.val.subjects])
    groups = fold_subjects(training, folds, seed=5)
    flat = [subject for group in groups for subject in group]
    assert len(groups) == folds
    assert sorted(flat) == sorted(set(training.tolist()))  # every training subject, each once
    assert not set(flat) & set(data.test.subjects.tolist())
    assert max(map(len, groups)) - min(map(len, groups)) <= 1
    assert groups == fold_subjects(training, folds, seed=5)  # reproducible
    assert folds == 21 or groups != fold_subjects(training, folds, seed=6)


def test_a_folder_trained_with_other_folds_is_refused_unless_starting_over(tmp_path):
    _claim_folder(tmp_path, [[1, 2], [3]], fresh=False, writer=True)
    _claim_folder(tmp_path, [[1, 2], [3]], fresh=False, writer=True)  # the same folds resume
    with pytest.raises(UsageError, match="other folds"):  # another seed would leak validation subjects
        _claim_folder(tmp_path, [[1, 3], [2]], fresh=False, writer=False)
    _claim_folder(tmp_path, [[1, 3], [2]], fresh=True, writer=True)  # --no-resume starts over
    assert json.loads((tmp_path / FOLDS_FILE).read_text()) == [[1, 3], [2]]
    (tmp_path / FOLDS_FILE).write_text('[[1, 3], [')  # cut short: unknown folds, not other ones
    with pytest.raises(UsageError, match="cannot be read \\(damaged\\?\\), so the folds .* are unknown"):
        _claim_folder(tmp_path, [[1, 3], [2]], fresh=False, writer=True)


@pytest.mark.parametrize("obstacle, says", [
    ("ensemble.pt/", "ensemble.pt is a folder, where the cross-validation writes a file"),
    ("cv_report.json/", "cv_report.json is a folder"),
    ("test_report.json/", "test_report.json is a folder"),
    ("cv_folds.json/", "cv_folds.json is a folder"),
    ("fold-1", "fold-1 is a file, where the cross-validation keeps a folder"),
    ("refit", "refit is a file"),
])
def test_a_name_the_cross_validation_writes_held_by_something_else_is_refused_before_training(tmp_path, obstacle,
                                                                                             says):
    """Otherwise found by a traceback once every fold has trained."""
    path = tmp_path / obstacle.rstrip("/")
    path.mkdir() if obstacle.endswith("/") else path.write_text("keep")
    with pytest.raises(OutputRefused, match=says):
        _claim_folder(tmp_path, [[1, 2], [3]], fresh=False, writer=True)
    assert sorted(item.name for item in tmp_path.iterdir()) == [path.name]


def test_a_save_dir_that_is_a_file_is_refused_and_kept(tmp_path):
    (tmp_path / "cv").write_text("keep")
    with pytest.raises(OutputRefused, match="--save-dir .*cv is a file; point it at a folder"):
        _claim_folder(tmp_path / "cv", [[1, 2], [3]], fresh=False, writer=True)
    assert (tmp_path / "cv").read_text() == "keep"


@pytest.mark.parametrize("fresh", [False, True])
def test_a_folder_of_a_single_run_is_refused_and_its_files_kept(tmp_path, fresh):
    """Its test_report.json would be the ensemble's afterwards, with no earlier copy kept."""
    for name in ("best.pt", "test_report.json"):
        (tmp_path / name).write_text(name)
    with pytest.raises(UsageError, match=f"{tmp_path} holds a single run \\(best.pt\\), not a cross-validation"):
        _claim_folder(tmp_path, [[1, 2], [3]], fresh=fresh, writer=True)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["best.pt", "test_report.json"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("cv")
    result = run_subprocess([sys.executable, "main.py", *CV, "--figures", "--save-dir", save_dir], env=ONE_THREAD)
    assert result.returncode == 0, result.stderr
    return save_dir, result.stdout


def test_report_summarises_the_folds(uninterrupted):
    save_dir, stdout = uninterrupted
    report = json.loads((save_dir / "cv_report.json").read_text())
    assert len(report["folds"]) == 2
    pooled = np.zeros((6, 6), dtype=int)
    for fold in report["folds"]:
        fold_report = json.loads((save_dir / f"fold-{fold['fold']}" / "val_report.json").read_text())
        assert fold_report["subjects"] == fold["subjects"]
        assert fold["val_accuracy"] == fold_report["accuracy"] and fold["val_macro_f1"] == fold_report["macro_f1"]
        metrics = [json.loads(line) for line in
                   (save_dir / f"fold-{fold['fold']}" / "metrics.jsonl").read_text().splitlines()]
        assert fold["best_epoch"] == 1 + int(np.argmax([m["val_macro_f1"] for m in metrics]))
        assert fold["last_epoch_val_accuracy"] == metrics[-1]["val_acc"]
        # The fold's validation set is exactly its subjects' windows (32 each).
        assert fold_report["num_samples"] == 32 * len(fold["subjects"])
        pooled += np.array(fold_report["confusion_matrix"])
        assert not (save_dir / f"fold-{fold['fold']}" / "test_report.json").exists()  # --no-test
    assert len({s for f in report["folds"] for s in f["subjects"]}) == 21
    assert report["pooled_confusion_matrix"] == pooled.tolist()
    accuracies = [f["val_accuracy"] for f in report["folds"]]
    assert report["mean"]["accuracy"] == pytest.approx(np.mean(accuracies))
    assert report["std"]["accuracy"] == pytest.approx(np.std(accuracies))
    assert report["worst"]["accuracy"] == min(accuracies)
    assert (save_dir / "cv_confusion_matrix.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (save_dir / "fold-0" / "curves.png").is_file()
    # Every training person is validated once, by the fold that held them out.
    people = report["per_subject"]
    assert sorted(map(int, people)) == sorted(s for f in report["folds"] for s in f["subjects"])
    assert all(row["windows"] == 32 for row in people.values())
    assert people[report["worst_subject"]]["accuracy"] == min(row["accuracy"] for row in people.values())
    assert f"worst person: subject {report['worst_subject']}" in stdout
    assert "pooled accuracy" in stdout and stdout.count("=== fold") == 2


def test_killed_cv_run_resumes_at_its_fold_and_step(uninterrupted, tmp_path):
    # Fold 0 takes 2 x 11 steps (+ 2 epoch saves); the 30th save falls inside fold 1.
    killed = run_subprocess([sys.executable, "main.py", *CV, "--save-dir", tmp_path],
                            env={**ONE_THREAD, "HAR_FAULT": "kill@save:30"})
    assert killed.returncode == -signal.SIGKILL
    assert (tmp_path / "fold-0" / "val_report.json").exists() and not (tmp_path / "cv_report.json").exists()
    assert not (tmp_path / "ensemble.pt").exists()
    assert load_checkpoint(tmp_path / "fold-1" / "last.pt")["step"] < 20
    resumed = run_subprocess([sys.executable, "main.py", *CV, "--save-dir", tmp_path], env=ONE_THREAD)
    assert resumed.returncode == 0, resumed.stderr
    assert "fold 1/2 already finished" in resumed.stdout and "RESUMING" in resumed.stdout
    assert not list(tmp_path.rglob("*.png"))  # --no-figures, for the folds and the summary alike
    expected_dir, _ = uninterrupted
    for fold in ("fold-0", "fold-1"):
        expected = load_checkpoint(expected_dir / fold / "last.pt")
        actual = load_checkpoint(tmp_path / fold / "last.pt")
        assert expected["step"] == actual["step"]
        for key in ("model", "ema"):
            weights = expected[key] if key == "model" else expected[key]["weights"]
            other = actual[key] if key == "model" else actual[key]["weights"]
            assert all(torch.equal(weights[name], other[name]) for name in weights), (fold, key)
    assert json.loads((tmp_path / "cv_report.json").read_text())["folds"] == \
        json.loads((expected_dir / "cv_report.json").read_text())["folds"]
    expected, actual = (load_checkpoint(folder / "ensemble.pt")["members"] for folder in (expected_dir, tmp_path))
    assert [member["source"] for member in actual] == [str(tmp_path / f"fold-{k}" / "best.pt") for k in (0, 1)]
    for mine, theirs in zip(actual, expected, strict=True):
        assert all(torch.equal(mine["model"][name], theirs["model"][name]) for name in theirs["model"])


def run_files(folder):
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def test_a_finished_cv_run_again_with_another_model_or_schedule_is_refused(uninterrupted, tmp_path):
    import shutil

    from test_bad_input import assert_refused
    expected_dir, _ = uninterrupted
    copy = tmp_path / "cv"
    shutil.copytree(expected_dir, copy)  # copied files still match what each fold recorded
    code, out, err = run_in_process("main.py", [*CV, "--save-dir", copy])
    assert code == 0, err
    assert "fold 1/2 already finished" in out and "fold 2/2 already finished" in out and "=== fold" not in out
    before = run_files(copy)
    for flags, named in ((["--model", "transformer"], "--model: cnn1d (now: transformer)"),
                         (["--epochs", "3"], "--epochs: 2 (now: 3)"),
                         (["--augment", "none"], "--augment")):
        line = assert_refused(run_in_process("main.py", [*CV, *flags, "--save-dir", copy]), "fold 1/2", named,
                              "--no-resume")
        assert "finished fold 1/2 trained with other settings" in line
    assert run_files(copy) == before  # nothing trained, nothing written


def test_a_fold_recorded_with_a_setting_that_no_longer_counts_is_still_finished(uninterrupted, tmp_path):
    # Folds recorded --ensemble (and the launch's flags) among their settings before those stopped
    # counting: such a folder still resumes as finished.
    import shutil
    copy = tmp_path / "cv"
    shutil.copytree(uninterrupted[0], copy)
    identity = copy / "fold-0" / "cv_identity.json"
    record = json.loads(identity.read_text())
    record["inputs"].update({"--ensemble": True, "--backend": "gloo"})
    identity.write_text(json.dumps(record))
    code, out, err = run_in_process("main.py", [*CV, "--save-dir", copy])
    assert code == 0, err
    assert "fold 1/2 already finished" in out and "=== fold" not in out


def test_a_fresh_start_with_a_class_the_data_lacks_leaves_the_finished_folds(uninterrupted, tmp_path):
    # --no-resume clears each fold before training it again: a flag every fold would refuse is
    # refused before the first is cleared.
    import shutil

    from test_bad_input import assert_refused
    copy = tmp_path / "cv"
    shutil.copytree(uninterrupted[0], copy)
    before = run_files(copy)
    assert_refused(run_in_process("main.py", [*CV, "--augment", "flip", "--aug-flip-classes", "NOPE", "--no-resume",
                                              "--save-dir", copy]), "'NOPE'")
    assert run_files(copy) == before


def test_a_fresh_start_leaves_a_fold_another_run_is_training(uninterrupted, tmp_path):
    # --no-resume clears a fold only once it holds the fold's lock: a run training there keeps it.
    import shutil

    from test_bad_input import assert_refused
    from training.run_inputs import SaveDirLock
    copy = tmp_path / "cv"
    shutil.copytree(uninterrupted[0], copy)
    busy = SaveDirLock(copy / "fold-0").acquire()  # as the run training fold 1 holds it
    try:
        before = run_files(copy / "fold-0")
        assert_refused(run_in_process("main.py", [*CV, "--no-resume", "--save-dir", copy]), "fold-0", "in use")
        assert run_files(copy / "fold-0") == before
    finally:
        busy.release()


def test_a_damaged_finished_fold_is_trained_again_alone_and_equals_the_undamaged_fold(uninterrupted, tmp_path):
    import shutil
    expected_dir, _ = uninterrupted
    copy = tmp_path / "cv"
    shutil.copytree(expected_dir, copy)
    best = copy / "fold-1" / "best.pt"
    truncated = best.read_bytes()[:-100]
    best.write_bytes(truncated)  # truncated after the fold finished
    (copy / "fold-1" / "notes.txt").write_text("the user's own")
    result = run_subprocess([sys.executable, "main.py", *CV, "--save-dir", copy], env=ONE_THREAD)
    assert result.returncode == 0, result.stderr
    assert "fold 1/2 already finished" in result.stdout and result.stdout.count("=== fold") == 1
    assert "fold 2/2: best.pt is not what was written" in result.stdout
    # The damaged run's files moved aside, as a single run's --no-resume moves them; the user's file stays.
    assert (copy / "fold-1" / "previous-1" / "best.pt").read_bytes() == truncated
    assert (copy / "fold-1" / "notes.txt").read_text() == "the user's own"
    for name in ("best.pt", "last.pt"):
        expected, actual = (load_checkpoint(folder / "fold-1" / name) for folder in (expected_dir, copy))
        assert expected["step"] == actual["step"]
        assert all(torch.equal(expected["model"][key], actual["model"][key]) for key in expected["model"])
    assert (copy / "fold-1" / "metrics.jsonl").read_text().count("\n") == 2  # two epochs, not four
    assert json.loads((copy / "cv_report.json").read_text())["folds"] == \
        json.loads((expected_dir / "cv_report.json").read_text())["folds"]
    expected, actual = (load_checkpoint(folder / "ensemble.pt")["members"] for folder in (expected_dir, copy))
    for mine, theirs in zip(actual, expected, strict=True):
        assert all(torch.equal(mine["model"][name], theirs["model"][name]) for name in theirs["model"])


def test_folds_and_the_refit_run_concurrently_under_torchrun_with_the_same_results(uninterrupted, tmp_path):
    result = run_subprocess([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             "main_multi_gpu.py", "--multi-gpu", "ddp", "--device", "cpu", "--backend", "gloo", *CV,
                             "--refit", "--save-dir", tmp_path / "cv"], env=ONE_THREAD)
    assert result.returncode == 0, result.stderr
    # A fold is a one-process run: its config.yaml repeats it with main.py, without the launch's flags.
    from training.config.cli import parse_config
    assert parse_config(["--config", str(tmp_path / "cv" / "fold-0" / "config.yaml")]).hardware.backend == "auto"
    expected_dir, _ = uninterrupted
    report = json.loads((tmp_path / "cv" / "cv_report.json").read_text())
    assert report["folds"] == json.loads((expected_dir / "cv_report.json").read_text())["folds"]
    assert result.stdout.count("pooled accuracy") == 1  # rank 0 alone summarises
    assert report["refit"]["save_dir"] == str(tmp_path / "cv" / "refit")
    assert report["ensemble"]["members"] == ["fold-0/best.pt", "fold-1/best.pt", "refit/best.pt"]
    # The refit is the plain run on every training subject: the same weights, bit for bit.
    alone = run_subprocess([sys.executable, "main.py", *CV[:CV.index("--cv-folds")], *CV[CV.index("--epochs"):],
                            "--val-fraction", "0", "--save-dir", tmp_path / "alone"], env=ONE_THREAD)
    assert alone.returncode == 0, alone.stderr
    assert "train 672 windows / 21 subjects, val 0" in alone.stdout  # 21 subjects x 32 windows, none held out
    refit, plain = (load_checkpoint(tmp_path / name / "last.pt") for name in ("cv/refit", "alone"))
    assert refit["step"] == plain["step"] == 2 * 21  # 672 windows / batch 32, two epochs
    assert all(torch.equal(refit["model"][name], plain["model"][name]) for name in plain["model"])


def test_without_a_validation_split_best_pt_is_the_last_epoch(tmp_path):
    code, out, err = run_in_process("main.py", [*TINY_DATA, "--epochs", "2", "--val-fraction", "0", "--save-dir",
                                                tmp_path])
    assert code == 0, err
    assert "no validation" in out and "test split (last epoch's weights: no validation split)" in out
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [record["val_macro_f1"] for record in records] == [None, None]
    best, last = load_checkpoint(tmp_path / "best.pt"), load_checkpoint(tmp_path / "last.pt")
    assert best["step"] == last["step"]
    assert all(torch.equal(best["model"][name], last["model"][name]) for name in last["model"])
    assert json.loads((tmp_path / "test_report.json").read_text())["accuracy"] > 0.3
    assert not (tmp_path / "val_report.json").exists()


def test_a_paused_fold_stops_the_cv_run_until_the_same_command_runs_again(tmp_path):
    flags = [*TINY_DATA, "--cv-folds", "2", "--epochs", "2", "--no-test", "--save-dir", tmp_path]
    code, out, err = run_in_process("main.py", [*flags, "--stop-after-epochs", "1"])
    assert code == 0, err
    assert "fold 1/2 is not finished" in out and not (tmp_path / "fold-1").exists()
    assert not (tmp_path / "cv_report.json").exists()
    code, out, err = run_in_process("main.py", flags)
    assert code == 0, err
    assert "RESUMING" in out and len(json.loads((tmp_path / "cv_report.json").read_text())["folds"]) == 2


@pytest.mark.parametrize("flags, message", [
    (["--cv-folds", "1"], "--cv-folds must be 0 (off) or at least 2"),
    (["--cv-folds", "40"], "more than the 21 training subjects"),
    (["--cv-folds", "3", "--resume", "x.pt"], "each fold resumes from its own"),
    (["--cv-folds", "3", "--val-subjects", "1"], "drop --val-subjects"),
    (["--val-subjects", "2,99"], "validation subject(s) 2, 99 are not in the training split"),
    (["--augment", "rotate,mirror"], "unknown augmentation 'mirror'"),
    (["--ema-decay", "1"], "--ema-decay must be in [0, 1)"),
    (["--refit"], "--refit follows cross-validation"),
    (["--ensemble"], "--ensemble joins the models of a cross-validation"),
    (["--val-fraction", "0", "--early-stopping-patience", "3"], "needs a validation split"),
    (["--val-fraction", "1"], "--val-fraction must be at least 0 and below 1"),
])
def test_bad_cv_and_recipe_flags_give_one_line(tmp_path, flags, message):
    code, _, err = run_in_process("main.py", [*TINY_DATA, *flags, "--save-dir", tmp_path / "bad"])
    assert code == 2 and message in err and err.count("\n") == 1 and "Traceback" not in err


def test_nested_outer_folds_hold_each_person_out_of_training_once(tmp_path):
    from studies.nested_cv import write_outer_folds
    from test_bad_input import write_fake_uci
    root = write_fake_uci(tmp_path / "UCI HAR Dataset")  # training subjects 1, 3, 5
    files = write_outer_folds(root, tmp_path / "windows", folds=3, seed=0)
    assert sorted(s for _, subjects in files for s in subjects) == [1, 3, 5]
    for path, subjects in files:
        data = load_har_data("npz", path, val_fraction=0.0)
        assert sorted(set(data.test.subjects.tolist())) == subjects
        assert not set(data.train.subjects.tolist()) & set(subjects)  # no outer person trains
        assert len(data.train) + len(data.test) == 12  # every training window, the dataset's test split unused
        assert data.channel_names == load_har_data("uci-har", root).channel_names
    assert files == write_outer_folds(root, tmp_path / "windows", folds=3, seed=0)  # kept, not redealt


def test_nested_summary_names_the_worst_fold_and_person(tmp_path):
    from studies.nested_cv import REPORT, format_summary, summarise
    rows = [{"fold": 0, "accuracy": 0.9, "macro_f1": 0.8,
             "per_subject": {"1": {"accuracy": 0.95}, "2": {"accuracy": 0.85}}},
            {"fold": 1, "accuracy": 0.8, "macro_f1": 0.7, "per_subject": {"3": {"accuracy": 0.8}}}]
    summary = summarise(rows, ["--epochs", "1"], outer_folds=7)
    assert summary["mean"]["accuracy"] == pytest.approx(0.85) and summary["worst_fold"]["fold"] == 1
    assert summary["outer_folds"] == 7 and len(summary["folds"]) == 2  # a partial estimate says so
    assert summary["worst_person"] == {"subject": "3", "accuracy": 0.8}
    accuracies = [0.95, 0.85, 0.8]
    mean = sum(accuracies) / 3
    std = (sum((a - mean) ** 2 for a in accuracies) / 3) ** 0.5  # over people, not folds
    assert summary["people"] == pytest.approx({"mean": mean, "median": 0.85, "std": std, "below_0.9": 2})
    (tmp_path / "partial").mkdir()
    (tmp_path / "partial" / REPORT).write_text(json.dumps(summary))
    assert "partial (2 of 7)" in format_summary(tmp_path)


def test_nested_outer_fold_under_torchrun_is_a_ddp_run_of_the_same_flags(tmp_path):
    from studies.nested_cv import outer_command
    from training.config.cli import parse_config
    flags = ["--cv-folds", "5", "--ensemble", "--refit"]
    alone = outer_command(tmp_path / "outer-0.npz", tmp_path / "run", flags)
    ranked = outer_command(tmp_path / "outer-0.npz", tmp_path / "run", flags, nproc_per_node=2)
    assert ranked[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    script = next(i for i, part in enumerate(ranked) if part.endswith("main_multi_gpu.py"))
    config = parse_config(ranked[script + 1:], multi_gpu=True)
    assert config.parallel.multi_gpu == "ddp"
    assert alone[1].endswith("main.py") and config.replace(multi_gpu="none") == parse_config(alone[2:])
