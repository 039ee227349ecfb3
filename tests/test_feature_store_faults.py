"""Faults of the feature pool on disk (training.loop.feature_store): a build killed while writing a
shard loses that shard alone."""
import signal
import sys

import numpy as np
import pytest

from conftest import run_subprocess
from test_store import build, synthetic_npz


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    folder = tmp_path_factory.mktemp("store")
    build(synthetic_npz(folder / "windows.npz"), folder / "store", "--dtype", "float32", "--workers", "1")
    return folder / "store"


def shards(save_dir):
    return {path.name: path for path in (save_dir / "features").glob("*/part*.npy")}


def test_a_store_run_killed_while_writing_its_pool_loses_that_shard_alone(store, tmp_path):
    run = [sys.executable, "main.py", "--dataset", "store", "--data-dir", store, "--model", "minirocket",
           "--width", "840", "--feature-views", "4", "--epochs", "3", "--no-figures"]
    straight = run_subprocess([*run, "--save-dir", tmp_path / "straight"])
    assert straight.returncode == 0, straight.stderr[-3000:]
    expected = shards(tmp_path / "straight")
    assert len(expected) >= 5, expected  # the three views three epochs reach, then the other splits
    killed = run_subprocess([*run, "--save-dir", tmp_path / "killed"], env={"HAR_FAULT": "kill@shard:3"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    kept = shards(tmp_path / "killed")
    assert len(kept) == 2, kept  # the third was being written: only its temporary file is there
    assert len(list((tmp_path / "killed" / "features").glob("*/.*.tmp.*"))) == 1
    kept_files = {name: (path.stat().st_ino, path.stat().st_mtime_ns) for name, path in kept.items()}
    kept_windows = sum(len(np.load(path, mmap_mode="r")) for path in kept.values())
    resumed = run_subprocess([*run, "--save-dir", tmp_path / "killed"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"{kept_windows:,} windows' shards reused, the missing or damaged rebuilt" in resumed.stdout
    assert "warning" not in resumed.stderr, resumed.stderr  # nothing damaged: the partial file is not a shard
    after = shards(tmp_path / "killed")
    for name, (inode, mtime) in kept_files.items():  # reused, not written again
        assert (after[name].stat().st_ino, after[name].stat().st_mtime_ns) == (inode, mtime), name
    assert not list((tmp_path / "killed" / "features").glob("*/.*"))  # the partial file is gone
    assert sorted(after) == sorted(expected)
    for name, path in expected.items():
        assert after[name].parent.name == path.parent.name  # the same identity
        assert after[name].read_bytes() == path.read_bytes(), name  # bit for bit
