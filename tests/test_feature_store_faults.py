"""Faults of the feature pool on disk (training.pool.store): a shard changed in place, cut
short, of another type or shape, or left without its checksum is rebuilt with one line naming it and
why, never trained on; so are shards under this identity's name that another pool wrote, and a pool
whose augmentation would read other labels; a build killed while writing a shard loses that shard
alone; a folder that cannot be written stops the run in one line."""
import errno
import json
import shutil
import signal
import sys

import numpy as np
import pytest
import torch

from conftest import run_subprocess
from data.augment import AugmentConfig, BatchAugmenter
from data.errors import DataError
from data.splits import Split
from test_feature_pool import CPU, QuietLog, fitted_model, split
from test_store import store  # noqa: F401 (a fixture: the window store the runs read)
from training.errors import UsageError
from training.pool.build import PoolPlan, build_feature_pool


@pytest.fixture(scope="module")
def model_and_splits():
    # 2,500 training windows: shards of 1,024, 1,024 and 452 windows, then the validation split's.
    return fitted_model(), {"train": split(2500, 1), "val": split(7, 2)}


def build(splits, root, augment=None, seed=5, views=1, model=None):
    """(the pool read back whole, the log) of a build in `root`."""
    log, model = QuietLog(), fitted_model() if model is None else model
    plan = PoolPlan(views=views, augment=augment, seed=seed, store_root=root)
    pool, _ = build_feature_pool(model, splits, plan, CPU, log)
    return {name: part.signals[np.arange(len(part.signals))] for name, part in pool.items()}, log


def built_in_memory(splits, augment=None, seed=5, views=1, model=None):
    model = fitted_model() if model is None else model
    pool, _ = build_feature_pool(model, splits, PoolPlan(views=views, augment=augment, seed=seed), CPU, QuietLog())
    return {name: part.signals for name, part in pool.items()}


def on_disk(model_and_splits, root):
    model, splits = model_and_splits
    return build(splits, root, model=model)


def in_memory(model_and_splits):
    model, splits = model_and_splits
    return built_in_memory(splits, model=model)


def said(log):
    """The build's closing line and its warnings, as one text."""
    return log.line + "".join(log.warnings)


def assert_same_pool(pool, expected):
    assert pool.keys() == expected.keys()
    for name, rows in expected.items():
        assert rows.dtype == pool[name].dtype and np.array_equal(rows, pool[name]), name


def test_a_shard_whose_bytes_changed_in_place_is_rebuilt_with_one_line(model_and_splits, tmp_path):
    built, log = on_disk(model_and_splits, tmp_path)
    assert log.warnings == []
    shard = next(tmp_path.glob("*/part0-000001024.npy"))
    before = np.load(shard)
    data = bytearray(shard.read_bytes())
    data[-500:-490] = bytes(byte ^ 0xFF for byte in data[-500:-490])  # inside the counts, not the header
    shard.write_bytes(bytes(data))
    changed = np.load(shard, mmap_mode="r")
    assert changed.shape == before.shape and changed.dtype == before.dtype  # whole by its type and shape
    assert not np.array_equal(changed, before)
    rebuilt, log = on_disk(model_and_splits, tmp_path)
    assert len(log.warnings) == 1 and "\n" not in log.warnings[0], log.warnings
    assert shard.name in log.warnings[0] and "checksum" in log.warnings[0], log.warnings
    train_windows = len(model_and_splits[1]["train"])
    reused = train_windows + len(model_and_splits[1]["val"]) - len(before)
    assert f"{reused:,} windows' shards reused, the missing or damaged rebuilt" in log.line
    assert_same_pool(rebuilt, built)
    assert_same_pool(rebuilt, in_memory(model_and_splits))
    assert on_disk(model_and_splits, tmp_path)[1].warnings == []  # the rebuilt shard and its checksum agree


def cut_short(shard):
    shard.write_bytes(shard.read_bytes()[:1000])


def emptied(shard):
    shard.write_bytes(b"")  # what a crash of the machine can leave of a file renamed before it reached the disk


def of_another_type(shard):
    np.save(shard, np.load(shard).astype(np.uint16))


def of_another_shape(shard):
    np.save(shard, np.load(shard)[:-1])


def checksum_of(shard):
    checksums = [path for path in shard.parent.glob(f"{shard.stem}.*") if path != shard]
    assert len(checksums) == 1, checksums
    return checksums[0]


def without_its_checksum(shard):
    checksum_of(shard).unlink()  # what a build stopped between writing the shard and its checksum leaves


def with_a_garbled_checksum(shard):
    checksum_of(shard).write_bytes(bytes(range(256)))


def test_the_pool_on_disk_reads_any_positions_as_the_pool_in_memory_holds_them(model_and_splits, tmp_path):
    model, splits = model_and_splits
    pool, _ = build_feature_pool(model, splits, PoolPlan(views=1, seed=5, store_root=tmp_path), CPU, QuietLog())
    rows, expected = pool["train"].signals, in_memory(model_and_splits)["train"]
    block = np.random.default_rng(0).permutation(np.arange(1000, 1100))  # neighbours across two shards of 1,024
    for positions in (block, block[:1], np.array([2499, 3, 1500, 700, 3])):  # and scattered, one twice
        assert np.array_equal(rows[positions], expected[positions])
    last = sorted(tmp_path.rglob("part0-*.npy"))[-1]
    last.write_bytes(last.read_bytes()[:-100])
    with pytest.raises(DataError, match="cut short while training read it"):
        rows[np.arange(2400, 2500)]


@pytest.mark.parametrize("damage, why", [(cut_short, "cut short"), (emptied, "cut short"),
                                         (of_another_type, "uint16"), (of_another_shape, "[1023, "),
                                         (without_its_checksum, "no checksum"),
                                         (with_a_garbled_checksum, "differs from the checksum")])
def test_a_damaged_shard_is_rebuilt_with_one_line_naming_it_and_why(model_and_splits, tmp_path, damage, why):
    on_disk(model_and_splits, tmp_path)
    shard = next(tmp_path.glob("*/part0-000001024.npy"))
    damage(shard)
    rebuilt, log = on_disk(model_and_splits, tmp_path)
    assert len(log.warnings) == 1 and "\n" not in log.warnings[0], log.warnings
    assert shard.name in log.warnings[0] and why in log.warnings[0], log.warnings
    assert "the missing or damaged rebuilt" in log.line
    assert_same_pool(rebuilt, in_memory(model_and_splits))


def test_a_missing_shard_is_built_without_a_warning(model_and_splits, tmp_path):
    on_disk(model_and_splits, tmp_path)
    next(tmp_path.glob("*/part0-000001024.npy")).unlink()  # as a build stopped before reaching it leaves
    rebuilt, log = on_disk(model_and_splits, tmp_path)
    assert log.warnings == [] and "the missing or damaged rebuilt" in log.line
    assert_same_pool(rebuilt, in_memory(model_and_splits))


def shards(save_dir):
    return {path.name: path for path in (save_dir / "features").glob("*/part*.npy")}


def test_a_store_run_killed_while_writing_its_pool_loses_that_shard_alone(store, tmp_path):  # noqa: F811
    run = [sys.executable, "main.py", "--dataset", "store", "--data-dir", store, "--model", "minirocket",
           "--width", "840", "--feature-views", "4", "--epochs", "3", "--head-fit", "adamw", "--no-figures"]
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


def test_a_relabelled_training_split_gets_views_of_its_own_where_the_augmentation_reads_labels(tmp_path):
    # flip turns only class "a"'s windows: the same windows under other labels give other views.
    augment = BatchAugmenter(AugmentConfig(kinds=("flip",), flip_classes=("a",)), torch.zeros(3), torch.ones(3),
                             ("acc_x", "acc_y", "acc_z"), ("a", "b", "c", "d"))
    train = split(300, 1)
    splits = {"train": train, "val": split(7, 2)}
    build(splits, tmp_path, augment, views=2)
    relabelled = {**splits, "train": Split(train.signals, (train.labels + 1) % 4, train.subjects)}
    pool, log = build(relabelled, tmp_path, augment, views=2)
    line = said(log)
    assert "built: the pool in" in line and "other augmentation" in line, line
    expected = built_in_memory(relabelled, augment, views=2)
    assert_same_pool(pool, expected)
    assert not np.array_equal(expected["train"], built_in_memory(splits, augment, views=2)["train"])


def test_shards_of_another_pool_under_this_identitys_name_are_rebuilt_with_one_line(model_and_splits, tmp_path):
    _, splits = model_and_splits
    build(splits, tmp_path / "mine")
    build(splits, tmp_path / "other", seed=6)
    [mine], [other] = (tmp_path / "mine").iterdir(), (tmp_path / "other").iterdir()
    shutil.rmtree(mine)
    shutil.copytree(other, mine)  # seed 6's pool moved by hand under seed 5's name
    pool, log = build(splits, tmp_path / "mine")
    line = said(log)
    assert "built: its shards in" in line and "were of other seed (their identity.json)" in line, line
    assert_same_pool(pool, in_memory(model_and_splits))
    assert json.loads((mine / "identity.json").read_text())["seed"] == 5
    assert "reused whole" in said(build(splits, tmp_path / "mine")[1])
    (mine / "identity.json").write_text("[1, 2]")  # valid JSON, not an identity
    pool, log = build(splits, tmp_path / "mine")
    assert "have no readable identity.json" in said(log), said(log)
    assert_same_pool(pool, in_memory(model_and_splits))


def test_a_stray_identity_file_beside_the_pool_is_left_alone(model_and_splits, tmp_path):
    _, splits = model_and_splits
    stray = tmp_path / "0000000000000000"
    stray.mkdir()
    (stray / "identity.json").write_text("[1]")
    pool, log = build(splits, tmp_path)
    assert "built: the pool in 0000000000000000 was of other" in said(log), said(log)  # every field counts as changed
    assert_same_pool(pool, in_memory(model_and_splits))
    assert stray.is_dir() and "reused whole" in said(build(splits, tmp_path)[1])


def test_a_folder_the_pool_cannot_be_written_in_stops_the_run_in_one_line(model_and_splits, tmp_path, monkeypatch):
    _, splits = model_and_splits
    features = tmp_path / "features"
    features.write_text("a file where the pool's folder goes")
    with pytest.raises(UsageError, match=r"make .*features a writable folder") as refused:
        build(splits, features)
    assert "\n" not in str(refused.value) and features.read_text().startswith("a file")

    def full(path, write):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("training.pool.store.write_atomic", full)
    with pytest.raises(UsageError, match=r"\(No space left on device\); free space there"):
        build(splits, tmp_path / "elsewhere")
