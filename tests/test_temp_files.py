"""What our processes write to the temporary directory is gone once they are stopped."""
from conftest import TINY_DATA
from profiling.host_sharing import Neighbours


def test_a_neighbour_stopped_while_paused_removes_its_scratch_save_dir(tmp_path, monkeypatch):
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))  # the neighbour's tempfile folder
    with Neighbours([*TINY_DATA, "--device", "cpu", "--warmup-steps", "1"], count=1, threads_per_rank=1) as running:
        assert len(list(temp.glob("har-profile-*"))) == 1  # its workload's --save-dir, made before READY
        running.pause()
    assert list(temp.glob("har-profile-*")) == []
