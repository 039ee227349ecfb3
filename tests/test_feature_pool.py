"""MiniRocket's features computed once (training.pool): what the pool holds, which view each
epoch trains on, and runs through main.py that prove it against transforming every batch."""
import errno
import json
import signal
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from conftest import TINY_DATA, load_checkpoint, read_metrics, run_in_process, run_subprocess
from data.augment import AugmentConfig, BatchAugmenter
from data.loaders import ShardedSampler, epoch_order
from data.splits import Split
from models import build_model
from test_resume import assert_same_state
from training.distributed.single import SingleDevice
from training.errors import UsageError
from training.pool.build import VIEW_SEED_STRIDE, PoolPlan, build_feature_pool
from training.pool.shares import POOL_SHARE_UNIT, pool_shares
from training.trainer import Trainer

# The head trained by epochs over the pool (a split this small would otherwise be solved by ridge).
MINIROCKET = [*TINY_DATA, "--model", "minirocket", "--width", "840", "--synthetic-windows-per-subject", "8",
              "--batch-size", "16", "--head-fit", "adamw"]
CPU = SingleDevice(torch.device("cpu"))
# The running interpreter's torchrun, two ranks on this machine.
TWO_RANKS = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]


class QuietLog:
    """The build's log: its closing line and every warning kept, its progress bar silent."""

    def __init__(self):
        self.line, self.warnings = None, []

    def progress(self, total, description):
        class Bar:
            def update(self, count):
                pass

            def close(self):
                pass
        return Bar()

    def info(self, line):
        self.line = line

    def warn(self, line):
        self.warnings.append(line)


def fitted_model():
    torch.manual_seed(0)
    model = build_model("minirocket", 3, 4, width=840, window_steps=64)
    model.fit(torch.randn(40, 3, 64).cumsum(dim=2) * 0.1)
    return model


def split(count, seed):
    rng = np.random.default_rng(seed)
    return Split(rng.normal(size=(count, 3, 64)).cumsum(axis=2).astype(np.float32) * 0.1,
                 rng.integers(0, 4, count), np.arange(count) % 5)


def test_the_pool_holds_the_features_of_each_view_and_of_the_other_splits():
    model, splits = fitted_model(), {"train": split(30, 1), "val": split(7, 2), "test": split(0, 3)}
    augment = BatchAugmenter(AugmentConfig(kinds=("scale", "jitter")), torch.zeros(3), torch.ones(3),
                             ("acc_x", "acc_y", "acc_z"), ("a", "b", "c", "d"))
    log = QuietLog()
    pool, views = build_feature_pool(model, splits, PoolPlan(views=3, augment=augment, seed=5), CPU, log)
    width = model.feature_mean.numel()
    assert "3 view(s) of 30 training windows + 7 other windows = 97 transformed once, " in log.line
    assert f" MiB in host memory ({width:,} B a window, uint8) (" in log.line
    assert views == 3
    train = torch.from_numpy(splits["train"].signals)
    features = torch.from_numpy(pool["train"].signals)
    assert features.shape == (90, model.feature_mean.numel())
    assert features.dtype == torch.uint8  # counts over T' <= 255 positions
    # What the head sees from the pool is what it would see from the windows, bit for bit.
    assert torch.equal(model.from_counts(features[:30]), model.features(train))  # view 0: the windows as they are
    torch.manual_seed(5 * VIEW_SEED_STRIDE + 2)
    augmented = augment(train, torch.from_numpy(splits["train"].labels))
    assert torch.equal(model.from_counts(features[60:]), model.features(augmented))  # view 2: its own augmentation
    assert not torch.equal(features[30:60], features[:30])
    assert np.array_equal(pool["train"].labels, np.tile(splits["train"].labels, 3))
    assert np.array_equal(pool["train"].subjects, np.tile(splits["train"].subjects, 3))
    assert torch.equal(model.from_counts(torch.from_numpy(pool["val"].signals)),
                       model.features(torch.from_numpy(splits["val"].signals)))
    assert pool["test"].signals.shape == (0, model.feature_mean.numel())
    # Without an augmenter every view would be the same: one is kept.
    assert build_feature_pool(model, splits, PoolPlan(views=3, seed=5), CPU, QuietLog())[1] == 1


def test_the_build_reports_what_it_transformed_and_what_the_pool_holds():
    model, splits = fitted_model(), {"train": split(30, 1), "val": split(7, 2), "test": split(5, 3)}
    augment = BatchAugmenter(AugmentConfig(kinds=("scale", "jitter")), torch.zeros(3), torch.ones(3),
                             ("acc_x", "acc_y", "acc_z"), ("a", "b", "c", "d"))
    figures = {}
    pool, _ = build_feature_pool(model, splits, PoolPlan(views=3, augment=augment, seed=5), CPU, QuietLog(),
                                 figures=figures)
    held = sum(part.signals.nbytes for part in pool.values())
    assert figures["windows"] == figures["transformed"] == 3 * 30 + 7 + 5
    assert (figures["views"], figures["train_windows"], figures["bytes"]) == (3, 30, held)
    assert figures["bytes_per_window"] == model.feature_mean.numel()  # one uint8 count per feature
    assert figures["augmented_windows"] == 2 * 30  # views 1 and 2; view 0 and the other splits as they are
    assert 0 < figures["augment_s"] < figures["seconds"]
    assert figures["windows_per_s"] == pytest.approx(figures["transformed"] / figures["seconds"])
    assert [rank["windows"] for rank in figures["per_rank"]] == [102]
    plain = {}
    build_feature_pool(model, splits, PoolPlan(views=3, seed=5), CPU, QuietLog(), figures=plain)
    assert (plain["views"], plain["windows"], plain["augmented_windows"], plain["augment_s"]) == (1, 42, 0, 0.0)


def test_the_ranks_shares_cover_the_pool_once_in_order_and_evenly():
    lengths = [2500, 2500, 300, 0, 7]
    for world_size in (1, 2, 3, 8):
        shares = pool_shares(lengths, world_size)
        pieces = [piece for share in shares for piece in share]
        windows = [(part, index) for part, first, stop in pieces for index in range(first, stop)]
        assert windows == [(part, index) for part, length in enumerate(lengths) for index in range(length)]
        assert all(first % POOL_SHARE_UNIT == 0 for _, first, _ in pieces)  # the model's batches, as one process's
        counts = [sum(stop - first for _, first, stop in share) for share in shares]
        assert max(counts) - min(counts) <= POOL_SHARE_UNIT, (world_size, counts)


def test_two_ranks_build_the_pool_in_shares_bit_for_bit_as_one_process(tmp_path):
    out = tmp_path / "pools.npz"
    result = run_subprocess([*TWO_RANKS,
                             "-m", "tests.scripts.pool_shares", out])
    assert result.returncode == 0, result.stderr
    pools = np.load(out)
    # Each rank transformed its share alone: 3 views of 5,000 training and 300 validation windows, split.
    shares = pool_shares([5000, 5000, 5000, 300, 0], 2)
    assert list(pools["transformed"]) == [sum(stop - first for _, first, stop in share) for share in shares]
    assert sum(pools["transformed"]) == 3 * 5000 + 300 and min(pools["transformed"]) > 7000
    for name in ("train", "val", "test"):
        shared, alone = pools[f"shared_{name}"], pools[f"alone_{name}"]
        assert shared.dtype == alone.dtype and shared.shape == alone.shape, name
        assert np.array_equal(shared, alone), name
    line = str(pools["line"])  # rank 0's closing line: each rank's windows, the pool's bytes and where
    first, second = pools["transformed"]
    assert f"= {3 * 5000 + 300:,} transformed once by 2 ranks ({first:,} at " in line and f" and {second:,} at " in line
    width = pools["shared_train"].shape[1]
    assert "windows/s in all" in line and f"in each rank's memory ({width} B a window, uint8)" in line


def test_the_model_takes_windows_or_their_features_alike():
    model = fitted_model().eval()
    windows = torch.randn(6, 3, 64).cumsum(dim=2) * 0.1
    assert torch.equal(model(windows), model(model.features(windows)))


def test_each_epoch_draws_its_view_in_the_order_it_would_have_had():
    for epoch in range(5):
        sampler = ShardedSampler(10, world_size=2, rank=1, seed=3, views=3)
        sampler.set_epoch(epoch, start=4)
        expected = epoch_order(10, 3, epoch)[4:]
        expected = torch.cat([expected, epoch_order(10, 3, epoch)[:len(sampler) * 2 - len(expected)]])[1::2]
        assert torch.equal(sampler.indices(), expected + (epoch % 3) * 10)


def test_one_view_without_augmentation_trains_the_weights_that_transforming_every_batch_does(tmp_path):
    # On a CPU the pool's head trains on one thread (epochs.threads_for_the_step), and a GEMM's sums split
    # over threads round otherwise: both runs take one, so that they differ only in where features come from.
    runs, threads = {}, torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for views in (1, 0):
            code, _, err = run_in_process("main.py", [*MINIROCKET, "--augment", "none", "--epochs", "2",
                                                      "--final-model", "validated",  # only a pool's head refits
                                                      "--feature-views", str(views), "--save-dir",
                                                      tmp_path / str(views)])
            assert code == 0, err
            runs[views] = load_checkpoint(tmp_path / str(views) / "last.pt")
    finally:
        torch.set_num_threads(threads)
    for name, tensor in runs[0]["model"].items():
        assert torch.equal(tensor, runs[1]["model"][name]), name
    for name, tensor in runs[0]["ema"]["weights"].items():
        assert torch.equal(tensor, runs[1]["ema"]["weights"][name]), name


def test_ddp_ranks_step_replicas_of_the_head_that_equal_one_process_with_the_global_batch(tmp_path):
    """--pool-head replicated (the default): 2 ranks x 8 take the steps one process takes with 16,
    bit for bit, with no gradient exchange; the epoch's loss figures count each window once."""
    same_lr = ["--lr-scaling", "none", "--epochs", "2", "--no-resume"]
    ddp = run_subprocess([*TWO_RANKS,
                          "main_multi_gpu.py", "--multi-gpu", "ddp", "--device", "cpu", *MINIROCKET, *same_lr,
                          "--batch-size", "8", "--save-dir", tmp_path / "ddp"])
    assert ddp.returncode == 0, ddp.stderr
    assert "the model replicated: each rank steps the whole global batch" in ddp.stdout
    runs = {"ddp": load_checkpoint(tmp_path / "ddp" / "last.pt")}
    for name, batch in (("one", "16"), ("half", "8")):
        code, _, err = run_in_process("main.py", [*MINIROCKET, *same_lr, "--batch-size", batch,
                                                  "--save-dir", tmp_path / name])
        assert code == 0, err
        runs[name] = load_checkpoint(tmp_path / name / "last.pt")
    assert runs["ddp"]["step"] == runs["one"]["step"] > 0
    assert_same_state(runs["one"], runs["ddp"])
    assert not torch.equal(runs["half"]["model"]["head.1.weight"], runs["one"]["model"]["head.1.weight"])
    ddp_epochs, one_epochs = (read_metrics(tmp_path / name) for name in ("ddp", "one"))
    for ddp_epoch, one_epoch in zip(ddp_epochs, one_epochs, strict=True):
        assert ddp_epoch["train_samples"] == one_epoch["train_samples"]
        assert ddp_epoch["train_loss"] == one_epoch["train_loss"]
    # Rank 1 killed in the second epoch (9 steps an epoch); torchrun restarts the ranks, which resume
    # from the step saved before and end where one process does.
    killed = run_subprocess([*TWO_RANKS,
                             "--max-restarts=1", "main_multi_gpu.py", "--multi-gpu", "ddp", "--device", "cpu",
                             *MINIROCKET, *same_lr[:-1], "--batch-size", "8", "--save-every-steps", "1",
                             "--save-dir", tmp_path / "killed"], env={"HAR_FAULT": "kill@11:rank=1"}, timeout=300)
    assert killed.returncode == 0, killed.stderr[-3000:]
    assert "RESUMING" in killed.stdout and "epoch 2, sample 32 of 136" in killed.stdout
    resumed = load_checkpoint(tmp_path / "killed" / "last.pt")
    assert_same_state(runs["one"], resumed)


def test_replicas_start_from_rank_0s_state_and_are_made_rank_0s_again_after_drifting(tmp_path):
    out = tmp_path / "aligned.json"
    result = run_subprocess([*TWO_RANKS,
                             "tests/scripts/align_replicas.py", out, tmp_path, *MINIROCKET, "--device", "cpu"])
    assert result.returncode == 0, result.stderr[-3000:]
    aligned = json.loads(out.read_text())
    assert aligned["replicated"]
    tensors = {part: row["tensors"] for part, row in aligned["parts"].items()}
    assert tensors == {"weights": 2, "moments": 4, "average": 2}  # the head's weight and bias in each
    assert all(row["same"] for row in aligned["parts"].values()), aligned
    assert aligned["wrapped_same"]  # a replica starts from rank 0's weights and buffers


def test_buffers_no_step_changes_are_not_sent_again_before_evaluation_or_a_save():
    sent = []
    strategy = SimpleNamespace(sync_buffers=sent.append)
    fixed, learned = fitted_model(), build_model("cnn1d", 3, 4, window_steps=64)  # BatchNorm's statistics move
    average = SimpleNamespace(module="the average")
    for model, expected in ((fixed, []), (learned, [learned, "the average"])):
        sent.clear()
        Trainer._sync_buffers(SimpleNamespace(model=model, strategy=strategy, step=SimpleNamespace(ema=average)))
        assert sent == expected


def test_a_run_killed_while_training_on_the_pool_resumes_bit_for_bit(tmp_path):
    run = [sys.executable, "main.py", *MINIROCKET, "--epochs", "2", "--feature-views", "4", "--save-every-steps", "1"]
    whole = run_subprocess([*run, "--save-dir", tmp_path / "whole"])
    assert whole.returncode == 0, whole.stderr
    assert "features: 2 view(s)" in whole.stdout  # two epochs reach two of the four views
    # 136 training windows at 16 a batch: 9 batches an epoch; killed in the second, which trains on
    # the second view.
    killed = run_subprocess([*run, "--save-dir", tmp_path / "killed"], env={"HAR_FAULT": "kill@11"})
    assert killed.returncode == -signal.SIGKILL
    resumed = run_subprocess([*run, "--save-dir", tmp_path / "killed"])
    assert resumed.returncode == 0 and "RESUMING" in resumed.stdout, resumed.stderr
    expected, actual = load_checkpoint(tmp_path / "whole" / "last.pt"), load_checkpoint(tmp_path / "killed" / "last.pt")
    assert actual["step"] == expected["step"]
    for name, tensor in expected["model"].items():
        assert torch.equal(tensor, actual["model"][name]), name


def test_a_pool_on_disk_is_the_pool_in_memory_reused_while_its_identity_holds(tmp_path):
    model, splits = fitted_model(), {"train": split(2500, 1), "val": split(7, 2), "test": split(0, 3)}
    augment = BatchAugmenter(AugmentConfig(kinds=("scale", "jitter")), torch.zeros(3), torch.ones(3),
                             ("acc_x", "acc_y", "acc_z"), ("a", "b", "c", "d"))
    memory, _ = build_feature_pool(model, splits, PoolPlan(views=2, augment=augment, seed=5), CPU, QuietLog())

    def on_disk(seed=5):
        log = QuietLog()
        plan = PoolPlan(views=2, augment=augment, seed=seed, store_root=tmp_path)
        pool, _ = build_feature_pool(model, splits, plan, CPU, log)
        everything = {name: part.signals[np.arange(len(part.signals))] for name, part in pool.items()}
        return everything, log.line + "".join(log.warnings)

    built, line = on_disk()
    assert "built: no earlier pool in this folder" in line
    for name, part in memory.items():
        assert np.array_equal(built[name], part.signals), name  # read back from the shards, bit for bit
    assert "reused whole" in on_disk()[1]
    shard = sorted(tmp_path.glob("*/part1-*.npy"))[1]  # the second view's second piece, cut short
    shard.write_bytes(shard.read_bytes()[:1000])
    left = shard.with_name(f".{shard.stem}.999999.tmp.npy")  # what a build killed while writing leaves
    left.write_bytes(b"partial")
    resumed, line = on_disk()
    assert "shards reused, the missing or damaged rebuilt" in line and not left.exists()
    assert f"rebuilding {shard}: it is cut short" in line
    assert all(np.array_equal(resumed[name], part.signals) for name, part in memory.items())
    other_seed = on_disk(seed=6)[1]  # another seed is another pool, and only the seed differs
    assert "other seed" in other_seed and "augmentation" not in other_seed, other_seed
    assert "other seed" in on_disk(seed=7)[1]


def test_a_full_disk_stops_the_build_in_one_line_and_keeps_the_shards_written(tmp_path, monkeypatch):
    model, splits = fitted_model(), {"train": split(2500, 1), "val": split(7, 2)}
    saved, real_save = [], np.save

    def save_until_full(path, counts):
        if len(saved) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_save(path, counts)
        saved.append(path)

    monkeypatch.setattr("training.pool.store.np.save", save_until_full)
    with pytest.raises(UsageError, match=r"\(No space left on device\); free space there and run the same command"):
        build_feature_pool(model, splits, PoolPlan(views=1, seed=5, store_root=tmp_path), CPU, QuietLog())
    assert len(list(tmp_path.glob("*/part*.npy"))) == 2 and not list(tmp_path.glob("*/.*"))  # no partial file
    monkeypatch.undo()
    log = QuietLog()
    pool, _ = build_feature_pool(model, splits, PoolPlan(views=1, seed=5, store_root=tmp_path), CPU, log)
    assert "2,048 windows' shards reused, the missing or damaged rebuilt" in log.line
    memory, _ = build_feature_pool(model, splits, PoolPlan(views=1, seed=5), CPU, QuietLog())
    assert np.array_equal(pool["train"].signals[np.arange(2500)], memory["train"].signals)
