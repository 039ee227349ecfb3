"""What our processes write to the temporary directory is gone once they are stopped."""
import tempfile

from conftest import TINY_DATA
from profiling.host_sharing import Neighbours
from training.distributed.launch import run_torchrun


def test_a_neighbour_stopped_while_paused_removes_its_scratch_save_dir(tmp_path, monkeypatch):
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))  # the neighbour's tempfile folder
    with Neighbours([*TINY_DATA, "--device", "cpu", "--warmup-steps", "1"], count=1, threads_per_rank=1) as running:
        assert len(list(temp.glob("har-profile-*"))) == 1  # its workload's --save-dir, made before READY
        running.pause()
    assert list(temp.glob("har-profile-*")) == []


def test_the_self_launcher_leaves_no_torchrun_log_folder(tmp_path, monkeypatch):
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # where this process's torchrun would write
    # torchrun would set it in this process for its workers, and later tests' processes would inherit it
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    script = tmp_path / "worker.py"
    script.write_text("import os\nassert os.environ['WORLD_SIZE'] == '2'\n")
    assert run_torchrun(["--standalone", "--nproc-per-node=2", str(script)]) == 0
    assert list(temp.iterdir()) == []
