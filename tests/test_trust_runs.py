"""Training runs that meet a user's mistakes: a refused or failed run leaves no trace and never splits an
earlier run, resumes never read the data as something it is not, the launcher's lines say what happened,
its bounds hold, and a config taken from a moved run folder continues that folder."""
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from conftest import REPO, TINY_DATA, load_checkpoint, run_in_process, run_subprocess
from data.build_store import main as build_store
from profiling.entry_points import env_without_torchrun
from test_bad_input import assert_refused, snapshot
from test_npz_dataset import windows, write_npz
from test_unequal_lengths import padded_arrays
from training.checkpoint import earlier_run
from training.errors import EXIT_DIVERGED, EXIT_PREEMPTED, UsageError

RUN = [*TINY_DATA, "--epochs", "1"]


def train(save_dir, *flags, script="main.py"):
    return run_in_process(script, [*RUN, "--save-dir", save_dir, *flags])


@pytest.fixture(scope="module")
def earlier(tmp_path_factory):
    """A finished run's folder, copied by each test that needs one."""
    folder = tmp_path_factory.mktemp("earlier") / "run"
    code, _, err = train(folder)
    assert code == 0, err
    return folder


# ---------------------------------------------------------------------------
# 1. A refused or failed command leaves no trace, and never half-moves an earlier run
# ---------------------------------------------------------------------------

def immutable(folder):
    """chattr +i: not even root may add or take entries (a stand-in for a folder the user cannot write)."""
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode:
        pytest.skip("needs chattr +i on this filesystem")


def test_an_earlier_run_that_cannot_be_moved_aside_is_refused_before_training(earlier, tmp_path):
    save_dir = tmp_path / "run"
    shutil.copytree(earlier, save_dir)
    immutable(save_dir / "logs")
    try:
        before = snapshot(save_dir)
        assert_refused(train(save_dir, "--no-resume"), "holds an earlier run", "logs", "cannot be moved aside")
        assert snapshot(save_dir) == before
        assert not (save_dir / "previous-1").exists()
    finally:
        subprocess.run(["chattr", "-i", str(save_dir / "logs")], check=True)


def test_a_move_aside_that_fails_halfway_puts_back_what_it_moved(earlier, tmp_path, monkeypatch):
    save_dir = tmp_path / "run"
    shutil.copytree(earlier, save_dir)
    files = earlier_run.earlier_run_files(save_dir)
    before = snapshot(save_dir)
    real_replace, calls = os.replace, []

    def replace_until_the_logs(source, target):
        calls.append(source)
        if "logs" in str(source) and "previous" in str(target):
            raise PermissionError(13, "Permission denied")
        real_replace(source, target)

    monkeypatch.setattr(earlier_run.os, "replace", replace_until_the_logs)
    with pytest.raises(UsageError, match="nothing was moved"):
        earlier_run.move_aside(save_dir, files, print)
    assert len(calls) > 2  # some had moved before the logs refused
    assert snapshot(save_dir) == before
    assert not (save_dir / "previous-1").exists()


# ---------------------------------------------------------------------------
# 2. No silent wrong answers: a resume reads the windows as they were trained, validation is never empty
# ---------------------------------------------------------------------------

def npz_run(path, save_dir, *flags):
    return run_in_process("main.py", ["--dataset", "npz", "--data-dir", path, "--epochs", "2", "--batch-size", "8",
                                      "--head-fit", "adamw", "--no-figures", "--save-dir", save_dir, *flags])


def test_resuming_a_model_of_whole_windows_on_nan_padded_ones_is_refused(tmp_path):
    path = write_npz(tmp_path / "w.npz", **windows())
    assert npz_run(path, tmp_path / "run", "--stop-after-epochs", "1")[0] == 0
    before = snapshot(tmp_path / "run")
    write_npz(path, **padded_arrays()[0])  # the same path, now NaN-padded windows
    assert_refused(npz_run(path, tmp_path / "run", "--resume", tmp_path / "run" / "last.pt"),
                   "windows that fill their 40 steps", "NaN-padded", "--no-resume")
    assert snapshot(tmp_path / "run") == before


def test_resuming_a_model_of_other_window_lengths_is_one_line_not_a_size_mismatch(tmp_path):
    path = write_npz(tmp_path / "w.npz", **windows(steps=64))
    assert npz_run(path, tmp_path / "run", "--model", "cnn1d", "--stop-after-epochs", "1")[0] == 0
    write_npz(path, **windows(steps=128))
    assert_refused(npz_run(path, tmp_path / "run", "--model", "cnn1d", "--resume", tmp_path / "run" / "last.pt"),
                   "windows of 64 steps", "windows of 128")


def test_time_validation_with_one_window_a_subject_is_refused_not_empty(tmp_path):
    path = write_npz(tmp_path / "w.npz", **windows(subjects=6, per_subject=1))
    line = assert_refused(npz_run(path, tmp_path / "run", "--val-split", "time"), "nothing is left to validate on")
    assert "--val-fraction 0" in line and not (tmp_path / "run").exists()


def test_the_same_windows_saved_compressed_are_the_same_data_to_a_resume(tmp_path):
    arrays = windows()
    path = write_npz(tmp_path / "w.npz", **arrays)
    assert npz_run(path, tmp_path / "run", "--stop-after-epochs", "1")[0] == 0
    np.savez_compressed(path, **{name: arrays[name] for name in reversed(list(arrays))})
    code, out, err = npz_run(path, tmp_path / "run")
    assert code == 0, err
    assert "RESUMING" in out and "other windows than" not in out + err
    arrays["signals"][0, 0, 0] += 1.0  # one value of other windows: refused as other data
    np.savez_compressed(path, **arrays)
    assert_refused(npz_run(path, tmp_path / "run", "--epochs", "3"), "other windows than the run was trained on")


# ---------------------------------------------------------------------------
# 3. Messages that tell the truth: what a stop saved, and one line for a rank's own failure
# ---------------------------------------------------------------------------

LAUNCH = [sys.executable, "main_multi_gpu.py", "--multi-gpu", "ddp", "--nproc-per-node", "2", "--device", "cpu",
          *RUN]


def test_sigterm_before_the_first_checkpoint_says_nothing_was_saved(tmp_path):
    """Both ranks wait at their first batch (HAR_FAULT=hang), which a stop signal ends without a save."""
    process = subprocess.Popen([str(part) for part in [*LAUNCH, "--save-dir", tmp_path]], cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=env_without_torchrun(HAR_FAULT="hang@0"))
    lines, deadline = [], time.monotonic() + 120
    while time.monotonic() < deadline and not any(line.startswith("lr schedule:") for line in lines):
        lines.append(process.stdout.readline())
    time.sleep(1.0)
    process.send_signal(signal.SIGTERM)
    out = "".join(lines) + process.communicate(timeout=120)[0]
    assert process.returncode == EXIT_PREEMPTED, out[-3000:]
    assert f"launcher received SIGTERM: nothing was saved: {tmp_path} holds no checkpoint" in out
    assert "saved a checkpoint" not in out


def test_a_ranks_own_error_line_is_not_followed_by_torchruns(tmp_path):
    result = run_subprocess([*LAUNCH, "--save-dir", tmp_path], env={"HAR_FAULT": "nanfrom@0"})
    assert result.returncode == EXIT_DIVERGED, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "NaN" in errors[0], result.stderr[-3000:]
    assert "failed (exitcode" not in result.stderr and "Traceback" not in result.stderr


# ---------------------------------------------------------------------------
# 4. Bounds: no more CPU processes than cores
# ---------------------------------------------------------------------------

def test_more_cpu_processes_than_cores_are_refused_before_torchrun(tmp_path):
    result = run_subprocess([sys.executable, "main_multi_gpu.py", "--multi-gpu", "ddp", "--nproc-per-node", "10000",
                             "--device", "cpu", *RUN, "--save-dir", tmp_path / "run"])
    line = assert_refused((result.returncode, result.stdout, result.stderr), "--nproc-per-node 10000", "core")
    assert "launching" not in result.stdout and not (tmp_path / "run").exists(), line


# ---------------------------------------------------------------------------
# 5. Tracebacks where a line belongs: an earlier feature pool kept behind a link
# ---------------------------------------------------------------------------

def test_an_earlier_pool_behind_a_link_is_unlinked_and_what_it_points_at_kept(tmp_path):
    store = tmp_path / "store"
    path = write_npz(tmp_path / "w.npz", **windows(subjects=6, per_subject=40, channels=3, steps=64))
    assert build_store([str(path), "--out", str(store), "--sample-rate", "50"]) in (0, None)
    flags = ["--dataset", "store", "--data-dir", store, "--epochs", "1", "--batch-size", "8", "--head-fit", "adamw",
             "--no-figures", "--save-dir", tmp_path / "run"]
    assert run_in_process("main.py", flags)[0] == 0
    features = tmp_path / "run" / "features"
    (pool,) = [folder for folder in features.iterdir() if folder.is_dir()]
    kept_elsewhere = tmp_path / "kept-pool"
    pool.rename(kept_elsewhere)
    pool.symlink_to(kept_elsewhere, target_is_directory=True)
    code, out, err = run_in_process("main.py", [*flags, "--no-resume", "--seed", "1"])  # another pool
    assert code == 0, err
    assert not pool.exists() and kept_elsewhere.is_dir() and any(kept_elsewhere.iterdir())


# ---------------------------------------------------------------------------
# 6. A moved run folder: its config.yaml continues it there
# ---------------------------------------------------------------------------

def test_a_config_taken_from_a_moved_run_folder_continues_that_folder(tmp_path):
    written = tmp_path / "first"
    assert train(written, "--epochs", "2", "--stop-after-epochs", "1")[0] == 0
    moved = tmp_path / "moved"
    written.rename(moved)
    code, out, err = run_in_process("main.py", ["--config", moved / "config.yaml"])
    assert code == 0, err
    assert f"continuing the run folder it sits in, {moved}" in out and "RESUMING" in out
    assert not written.exists()
    assert load_checkpoint(moved / "last.pt")["epoch"] == 2
    assert torch.load(moved / "last.pt", weights_only=True)["config"]["save_dir"] == str(moved)
