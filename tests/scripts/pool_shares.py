"""Under torchrun: MiniRocket's feature pool built in shares by 2 gloo ranks, and on rank 0 the same
pool built by one process alone, both written to OUT.npz with the windows each rank transformed.

Usage (from the repository root): python -m torch.distributed.run --standalone --nproc-per-node=2
    -m tests.scripts.pool_shares OUT.npz
"""
import sys

import numpy as np
import torch

from data.augment import AugmentConfig, BatchAugmenter
from data.splits import Split
from models import build_model
from training.distributed.ddp import DistributedStrategy, RankPlacement
from training.distributed.single import SingleDevice
from training.distributed.strategy import distributed_env
from training.pool.build import PoolPlan, build_feature_pool


class Log:
    def progress(self, total, description):
        self.total = total
        return self

    def update(self, count):
        pass

    def close(self):
        pass

    def info(self, line):
        self.line = line


def windows(count, seed):
    rng = np.random.default_rng(seed)
    return Split(rng.normal(size=(count, 3, 64)).cumsum(axis=2).astype(np.float32) * 0.1,
                 rng.integers(0, 4, count), np.arange(count) % 5)


def main(out):
    torch.manual_seed(0)
    model = build_model("minirocket", 3, 4, width=840, window_steps=64)
    model.fit(torch.randn(40, 3, 64).cumsum(dim=2) * 0.1)
    # A training split of a few chunks, so that rank 1's share starts past a view's first chunk,
    # inside that view's random stream.
    splits = {"train": windows(5000, 1), "val": windows(300, 2), "test": windows(0, 3)}
    augment = BatchAugmenter(AugmentConfig(kinds=("scale", "jitter")), torch.zeros(3), torch.ones(3),
                             ("acc_x", "acc_y", "acc_z"), ("a", "b", "c", "d"))
    placement = RankPlacement(device_type="cpu", backend="gloo", gpu_ids=None, timeout_s=120, ranks=distributed_env())
    strategy, log = DistributedStrategy(placement=placement, sync_bn=False), Log()
    shared, _ = build_feature_pool(model, splits, PoolPlan(views=3, augment=augment, seed=5), strategy, log)
    transformed = strategy.gather_objects(log.total)
    if strategy.is_main:
        alone, _ = build_feature_pool(model, splits, PoolPlan(views=3, augment=augment, seed=5),
                                      SingleDevice(torch.device("cpu")), Log())
        np.savez(out, transformed=transformed, line=log.line,
                 **{f"shared_{name}": split.signals for name, split in shared.items()},
                 **{f"alone_{name}": split.signals for name, split in alone.items()})
    strategy.close()


if __name__ == "__main__":
    main(sys.argv[1])
