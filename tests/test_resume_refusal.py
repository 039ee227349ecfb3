"""Resume only what the command means: a --save-dir holding another run (other data, model or LR
schedule) is refused in one line; fallback checkpoints are files of their own; NaN/inf weights are
never resumed; the LR scaling says when it lifts the LR far above the default's."""
import os
import sys

import pytest
import torch

from conftest import TINY_DATA, load_checkpoint, read_metrics, run_in_process, run_subprocess
from training.checkpoint import files as ckpt
from training.checkpoint.judge import run_differences
from training.config.cli import parse_config
from training.config.settings import DEFAULT_LR
from training.errors import EXIT_USAGE, UsageError
from training.loop.step import scaling_warning

# 17 training subjects x 8 windows: 136 windows, 5 steps of 32 per epoch; a run of one epoch takes
# about a second.
SMALL = [*TINY_DATA, "--synthetic-windows-per-subject", "8"]


def error_lines(err):
    return [line for line in err.splitlines() if line.startswith("error:")]


def folder_bytes(folder):
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir()) if path.is_file()}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished one-epoch run: its folder, and the flags that made it."""
    save_dir = tmp_path_factory.mktemp("finished") / "run"
    flags = [*SMALL, "--epochs", "1", "--save-dir", save_dir]
    code, _, err = run_in_process("main.py", flags)
    assert code == 0, err
    return save_dir, flags


# ---------------------------------------------------------------------------
# Another run in the folder: refused; the same run: resumed
# ---------------------------------------------------------------------------

def test_a_finished_run_is_not_continued_by_a_command_with_other_epochs(finished_run):
    save_dir, flags = finished_run
    before = folder_bytes(save_dir)
    code, out, err = run_in_process("main.py", [*SMALL, "--save-dir", save_dir])  # --epochs 20, the default
    lines = error_lines(err)
    assert code == EXIT_USAGE and len(lines) == 1 and err.count("\n") == 1, err
    assert "holds a finished run (1 of 1 epochs)" in lines[0] and "--epochs 1 (this run: 20)" in lines[0]
    assert "--no-resume" in lines[0] and "another --save-dir" in lines[0]
    assert "RESUMING" not in out
    assert folder_bytes(save_dir) == before  # config.yaml, checkpoints and logs untouched


@pytest.mark.parametrize("changed, named", [
    (["--lr", "2e-3"], "--lr 0.001 (this run: 0.002)"),
    (["--batch-size", "16"], "--batch-size 32 (this run: 16)"),
    (["--grad-accum-steps", "2"], "--grad-accum-steps 1 (this run: 2)"),
    (["--seed", "7"], "--seed 42 (this run: 7)"),
    (["--synthetic-windows-per-subject", "9"], "--synthetic-windows-per-subject 8 (this run: 9)"),
    (["--warmup-epochs", "0.5"], "--warmup-epochs none (this run: 0.5)"),
], ids=["lr", "batch", "accumulation", "seed", "data", "warmup"])
def test_each_setting_of_the_schedule_data_or_seed_is_refused(finished_run, changed, named):
    save_dir, flags = finished_run
    code, _, err = run_in_process("main.py", [*flags, *changed])
    assert code == EXIT_USAGE and named in err, err


def test_a_finished_run_rerun_as_it_was_reports_again_without_training(finished_run):
    save_dir, flags = finished_run
    records = read_metrics(save_dir)
    code, out, err = run_in_process("main.py", [*flags, "--log-interval", "3"])  # a flag that changes nothing
    assert code == 0, err
    assert "already trained for 1 of 1 epochs" in out
    assert "warning: resumed with a changed flag: --log-interval: 10 in the checkpoint's run, 3 now" in err
    assert read_metrics(save_dir) == records


def test_an_unfinished_run_is_refused_with_other_flags_and_resumes_with_its_own(tmp_path):
    # Started with --no-resume, which its config.yaml records: the advice given must still continue it.
    flags = [*SMALL, "--epochs", "2", "--save-dir", tmp_path]
    code, out, err = run_in_process("main.py", [*flags, "--no-resume", "--stop-after-epochs", "1"])
    assert code == 0, err
    assert f"run the same command without --no-resume (it then resumes from {tmp_path})" in out
    code, _, err = run_in_process("main.py", [*flags, "--epochs", "3"])
    lines = error_lines(err)
    assert code == EXIT_USAGE and len(lines) == 1, err
    assert "holds an unfinished run (1 of 2 epochs done)" in lines[0] and "--epochs 2 (this run: 3)" in lines[0]
    advice = f"--config {tmp_path / 'config.yaml'} --resume auto"  # how to repeat its own flags
    assert advice in lines[0]
    code, out, err = run_in_process("main.py", advice.split())
    assert code == 0, err
    assert "RESUMING" in out and [r["epoch"] for r in read_metrics(tmp_path)] == [1, 2]


def test_a_checkpoint_named_with_resume_is_continued_on_purpose(finished_run, tmp_path):
    save_dir, _ = finished_run
    code, out, err = run_in_process("main.py", [*SMALL, "--epochs", "2", "--resume", save_dir / "last.pt",
                                                "--save-dir", tmp_path])
    assert code == 0, err
    assert "RESUMING" in out and "changed flag: --epochs: 1 in the checkpoint's run, 2 now" in err
    assert load_checkpoint(tmp_path / "last.pt")["epoch"] == 2


def test_settings_are_compared_by_what_they_mean():
    saved = parse_config([*SMALL, "--model", "transformer", "--epochs", "5"]).flags()
    same = [*SMALL, "--model", "transformer", "--epochs", "5"]
    assert run_differences(saved, parse_config([*same, "--width", "64", "--heads", "4"])) == []  # the defaults
    assert run_differences(saved, parse_config([*same, "--warmup-epochs", "1"])) == []  # min(2, 5 / 5)
    assert run_differences(saved, parse_config([*same, "--num-workers", "1", "--no-figures"])) == []
    windows = parse_config(["--dataset", "npz", "--data-dir", "~/windows.npz"]).flags()
    assert run_differences(windows, parse_config(["--dataset", "npz", "--data-dir",
                                                  os.path.expanduser("~/windows.npz")])) == []
    assert run_differences(windows, parse_config(["--dataset", "npz", "--data-dir", "other.npz"])) == [
        "--data-dir ~/windows.npz (this run: other.npz)"]
    # The warmup follows --epochs: only --epochs is named.
    assert run_differences(saved, parse_config([*same, "--epochs", "20"])) == ["--epochs 5 (this run: 20)"]
    older = {key: value for key, value in saved.items() if key != "seed"}  # a checkpoint from before --seed
    assert run_differences(older, parse_config([*same, "--seed", "1"])) == []


def test_main_py_points_multi_gpu_flags_to_main_multi_gpu_py(tmp_path):
    code, _, err = run_in_process("main.py", ["--multi-gpu", "dp", *SMALL, "--save-dir", tmp_path / "run"])
    lines = error_lines(err)
    assert code == EXIT_USAGE and len(lines) == 1, err
    assert "python main_multi_gpu.py --multi-gpu dp" in lines[0] and "torchrun" in lines[0]
    assert "unrecognized" not in lines[0] and not (tmp_path / "run").exists()


def test_ddp_ranks_refuse_together_and_the_scaled_lr_is_named(tmp_path):
    """Two ranks, --lr 3e-3 scaled to 6e-3: one warning; the same folder asked for more epochs: one
    error line for both ranks, exit 2, nothing written."""
    flags = ["main_multi_gpu.py", "--multi-gpu", "ddp", "--nproc-per-node", "2", "--device", "cpu", *SMALL,
             "--lr", "3e-3", "--save-dir", tmp_path]
    first = run_subprocess([sys.executable, *flags, "--epochs", "1"])
    assert first.returncode == 0, first.stderr[-3000:]
    warnings = [line for line in first.stderr.splitlines() if "peak LR" in line]
    assert len(warnings) == 1 and "--lr-scaling none" in warnings[0] and "6.00e-03" in warnings[0]
    before = folder_bytes(tmp_path)
    again = run_subprocess([sys.executable, *flags, "--epochs", "2"])
    assert again.returncode == EXIT_USAGE, again.stderr[-3000:]
    lines = error_lines(again.stderr)
    assert len(lines) == 1 and "--epochs 1 (this run: 2)" in lines[0], again.stderr[-3000:]
    assert again.stderr.strip().splitlines() == lines, again.stderr[-3000:]  # refused before any rank starts
    assert folder_bytes(tmp_path) == before


def test_lr_scaling_warns_far_above_the_default_only():
    assert scaling_warning(DEFAULT_LR, "linear", 4 * 32, 32, DEFAULT_LR) is None  # 4 GPUs at the default --lr
    assert scaling_warning(4e-3, "none", 4 * 32, 32, DEFAULT_LR) is None  # scaled by hand, scaling off
    assert scaling_warning(5e-3, "linear", 32, 32, DEFAULT_LR) is None  # one device: the LR asked for
    line = scaling_warning(4e-3, "linear", 4 * 32, 32, DEFAULT_LR)  # scaled by hand and scaled again
    assert line.startswith("peak LR 1.60e-02 is 16x") and "--lr-scaling none" in line and "\n" not in line
    assert "peak LR 5.66e-03" in scaling_warning(DEFAULT_LR, "sqrt", 32 * 32, 32, DEFAULT_LR)


# ---------------------------------------------------------------------------
# Fallback checkpoints are files of their own; NaN/inf weights are not resumed
# ---------------------------------------------------------------------------

def test_truncating_last_pt_in_place_leaves_the_fallbacks_whole_and_the_run_continues(tmp_path):
    straight, damaged = tmp_path / "straight", tmp_path / "damaged"
    common = [*SMALL, "--epochs", "2", "--keep-last", "1"]
    code, _, err = run_in_process("main.py", [*common, "--save-dir", straight])
    assert code == 0, err
    code, _, err = run_in_process("main.py", [*common, "--stop-after-epochs", "1", "--save-dir", damaged])
    assert code == 0, err
    names = ("last.pt", "step-00000005.pt", "best.pt")
    assert len({os.stat(damaged / name).st_ino for name in names}) == 3  # three files, not three names of one
    os.truncate(damaged / "last.pt", 1000)  # in place, as a tool writing over the name would
    for name in names[1:]:
        assert load_checkpoint(damaged / name)["step"] == 5
    code, out, err = run_in_process("main.py", [*common, "--save-dir", damaged])
    assert code == 0, err
    assert "last.pt is unreadable or truncated" in err and "falling back to step-00000005.pt (step 5)" in err
    assert "RESUMING from" in out
    # The fallback held the same state as last.pt did: the run ends where the undamaged one ended.
    expected, actual = load_checkpoint(straight / "last.pt"), load_checkpoint(damaged / "last.pt")
    assert actual["step"] == expected["step"] == 10
    for name, tensor in expected["model"].items():
        assert torch.equal(tensor, actual["model"][name]), name


def tiny_checkpoint(path, step, poison=None):
    """A file with what the resume path reads: a step, weights, a weight average, optimizer moments;
    `poison` names the part given an inf."""
    state = {"step": step, "model": {"w": torch.ones(3)}, "ema": {"weights": {"w": torch.ones(3)}},
             "optimizer": {"state": {0: {"step": torch.tensor(1.0), "exp_avg": torch.zeros(3)}}}}
    parts = {"model": state["model"]["w"], "ema": state["ema"]["weights"]["w"],
             "optimizer": state["optimizer"]["state"][0]["exp_avg"]}
    if poison:
        parts[poison][1] = float("inf")
    torch.save(state, path)


def test_best_pt_is_taken_when_it_is_further_on_than_the_numbered_files_left(tmp_path):
    tiny_checkpoint(tmp_path / "last.pt", 4)
    os.truncate(tmp_path / "last.pt", os.path.getsize(tmp_path / "last.pt") // 2)
    tiny_checkpoint(tmp_path / "step-00000002.pt", 2)
    tiny_checkpoint(tmp_path / "best.pt", 3)
    warnings = []
    path, checkpoint = ckpt.load_resume_checkpoint("auto", tmp_path, warnings.append)
    assert (path.name, checkpoint["step"]) == ("best.pt", 3)
    tiny_checkpoint(tmp_path / "best.pt", 1)
    path, _ = ckpt.load_resume_checkpoint("auto", tmp_path, warnings.append)
    assert path.name == "step-00000002.pt"
    assert warnings[-1] == f"falling back to step-00000002.pt (step 2), the newest checkpoint in {tmp_path} " \
                           "that loads with finite weights"


@pytest.mark.parametrize("poison, named", [("model", "model.w"), ("ema", "ema.w"),
                                           ("optimizer", "optimizer.state.0.exp_avg")])
def test_nonfinite_weights_are_not_resumed(tmp_path, poison, named):
    tiny_checkpoint(tmp_path / "last.pt", 4, poison)
    tiny_checkpoint(tmp_path / "step-00000003.pt", 3)
    warnings = []
    path, _ = ckpt.load_resume_checkpoint("auto", tmp_path, warnings.append)
    assert path.name == "step-00000003.pt"
    assert warnings[0] == f"checkpoint {tmp_path / 'last.pt'} holds NaN/inf values ({named})"
    with pytest.raises(UsageError, match=rf"last\.pt holds NaN/inf values \({named}\); point --resume at an "):
        ckpt.load_resume_checkpoint(tmp_path / "last.pt", tmp_path, warnings.append)
    (tmp_path / "step-00000003.pt").unlink()
    with pytest.raises(UsageError, match="no readable checkpoint with finite weights"):
        ckpt.load_resume_checkpoint("auto", tmp_path, warnings.append)


def test_a_run_refuses_to_resume_nan_weights_in_one_line(finished_run, tmp_path):
    save_dir, _ = finished_run
    checkpoint = load_checkpoint(save_dir / "last.pt")
    first = next(name for name, tensor in checkpoint["model"].items() if tensor.is_floating_point())
    checkpoint["model"][first] = checkpoint["model"][first] * float("nan")
    torch.save(checkpoint, tmp_path / "nan.pt")
    code, _, err = run_in_process("main.py", [*SMALL, "--epochs", "2", "--resume", tmp_path / "nan.pt",
                                              "--save-dir", tmp_path / "run"])
    lines = error_lines(err)
    assert code == EXIT_USAGE and len(lines) == 1 and err.count("\n") == 1, err
    assert f"{tmp_path / 'nan.pt'} holds NaN/inf values (model.{first})" in lines[0]
