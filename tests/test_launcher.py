"""main_multi_gpu.py's own launcher: the command it prints is one a user can keep, it starts CPU processes
where no GPU is visible as torchrun would, and after a stop signal it says what the workers left on disk."""
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import REPO, TINY_DATA, run_subprocess
from profiling.entry_points import env_without_torchrun
from training.checkpoint.files import LAST
from training.distributed.launch import saved_by_the_workers
from training.errors import EXIT_INTERRUPTED
from training.reporting.logger import format_memory

LAUNCH = [sys.executable, "main_multi_gpu.py", "--multi-gpu", "ddp", "--nproc-per-node", "2", *TINY_DATA]


@pytest.mark.skipif(torch.cuda.is_available(), reason="tests a machine without a GPU")
def test_without_a_gpu_the_launcher_starts_cpu_processes_and_prints_a_command_to_keep(tmp_path):
    result = run_subprocess([*LAUNCH, "--epochs", "1", "--save-dir", tmp_path])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "no GPU is visible: 2 CPU processes (gloo)" in result.stdout
    assert "run: ddp with 2 processes (gloo)" in result.stdout
    launching = next(line for line in result.stdout.splitlines() if line.startswith("launching: "))
    assert "-m torch.distributed.run --standalone --nproc-per-node=2 " in launching
    assert "--start-method" not in launching and "--run-path" not in launching


def test_ctrl_c_ends_with_one_interrupted_line_exit_130_and_the_truth_about_the_checkpoint(tmp_path):
    """Both ranks wait at their first batch (HAR_FAULT=hang), before any checkpoint; Ctrl-C reaches the
    launcher and its workers, as a terminal sends it to the whole process group."""
    process = subprocess.Popen([str(part) for part in [*LAUNCH, "--device", "cpu", "--save-dir", tmp_path]],
                               cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=env_without_torchrun(HAR_FAULT="hang@0"), start_new_session=True)
    lines = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any(line.startswith("lr schedule:") for line in lines):
        lines.append(process.stdout.readline())
    time.sleep(1.0)  # past the schedule line, into the first batch
    os.killpg(process.pid, signal.SIGINT)
    out = "".join(lines) + process.communicate(timeout=120)[0]
    assert process.returncode == EXIT_INTERRUPTED, out[-3000:]
    assert out.count("interrupted\n") == 1, out[-3000:]
    assert f"launcher received SIGINT: nothing was saved: {tmp_path} holds no checkpoint" in out
    assert "Traceback" not in out


def fake_checkpoint(path, epoch, step, position):
    torch.save({"epoch": epoch, "step": step, "epoch_position": position}, path)


def test_the_launchers_stop_line_reads_what_the_workers_left(tmp_path):
    assert saved_by_the_workers(tmp_path, None) == f"nothing was saved: {tmp_path} holds no checkpoint"
    fake_checkpoint(tmp_path / LAST, 1, 17, 0)
    before = (tmp_path / LAST).stat()
    version = (before.st_ino, before.st_mtime_ns, before.st_size)
    assert saved_by_the_workers(tmp_path, version) == (
        f"nothing was saved since this command started ({tmp_path / LAST} is the one from before, step 17)")
    fake_checkpoint(tmp_path / "next.pt", 1, 23, 192)
    (tmp_path / "next.pt").replace(tmp_path / LAST)  # as a save replaces it
    assert saved_by_the_workers(tmp_path, version) == (
        f"the workers saved a checkpoint ({tmp_path / LAST}: step 23, in epoch 2, 192 samples in); run the same "
        "command again to resume")


def test_the_epoch_line_names_up_to_four_devices_and_the_extremes_of_more():
    two = [{"device": f"rank{r}:cpu", "current_rss_gib": 0.3, "peak_rss_gib": 0.39 + r / 100} for r in range(2)]
    assert format_memory(two) == "mem rank0:cpu peak RSS 0.39 GiB, rank1:cpu peak RSS 0.40 GiB"
    sixteen = [{"device": f"rank{r}:cuda:{r % 8}", "allocated_gib": 1.0, "reserved_gib": 3.0,
                "peak_allocated_gib": 2.0 + (r == 5) - (r == 9)} for r in range(16)]
    line = format_memory(sixteen)
    assert line == "mem peak allocated max 3.00 GiB (rank5:cuda:5), min 1.00 GiB (rank9:cuda:1) of 16"
    assert len(line) < 100
