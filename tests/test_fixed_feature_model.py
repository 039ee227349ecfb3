"""A second model whose features do not learn is one file: declared here through the contract's pool
hooks alone (models/contract.py), it is trained by main.py over a feature pool on disk, reused while its
identity holds, and built again when its fixed parts change, with nothing in the trainer or the pool
(training/pool/) naming it."""
import numpy as np
import pytest
import torch
from torch import nn

from conftest import load_checkpoint, run_in_process
from models import MODELS
from models.contract import HARModel
from test_feature_pool import CPU, QuietLog, split
from test_store import store  # noqa: F401 (a fixture: the window store the run reads)
from training.pool.build import PoolPlan, build_feature_pool

PROJECTIONS = 24


class RandomProjectionPPV(HARModel):
    """Fixed random projections of the channels, each pooled over time as the share of steps above a
    threshold fitted to the training windows; only the linear head learns. Its pool holds the counts of
    steps above, as uint8, which from_counts divides by the steps."""
    DROPOUT = 0.0
    TAKES_WINDOW_STEPS = True
    FIXED_FEATURES = True
    FEATURE_VIEWS = 2
    FITS_TO_DATA = True
    FIXED_BUFFERS = True
    LINEAR_HEAD = True

    def __init__(self, in_channels, num_classes, dropout, norm, window_steps=128):
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.register_buffer("projection", torch.randn(PROJECTIONS, in_channels, generator=generator, device="cpu"))
        self.register_buffer("threshold", torch.zeros(PROJECTIONS, device="cpu"))
        self.steps = window_steps
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(PROJECTIONS, num_classes))

    def fit(self, signals, padded=False):
        sample = torch.as_tensor(np.asarray(signals[np.arange(min(64, len(signals)))]), dtype=torch.float32)
        self.threshold.copy_(self._projected(sample).transpose(0, 1).flatten(1).median(dim=1).values)

    def _projected(self, windows):
        return torch.einsum("pc,bct->bpt", self.projection, windows.float())

    @torch.no_grad()
    def pool_features(self, windows):
        return (self._projected(windows) > self.threshold[:, None]).sum(dim=2).to(torch.uint8)

    def from_counts(self, stored):
        return stored if stored.is_floating_point() else stored.float() / self.steps

    def forward(self, x):
        return self.head(self.from_counts(x if x.dim() == 2 else self.pool_features(x)))


def test_a_model_declared_in_one_file_trains_on_its_pool_on_disk_through_main(store, tmp_path, monkeypatch):  # noqa: F811
    # Registered under a name of its own: --model's choices are the registry's names when the command is parsed.
    monkeypatch.setitem(MODELS, "random-ppv", RandomProjectionPPV)
    run = ["--dataset", "store", "--data-dir", store, "--model", "random-ppv", "--feature-views", "2", "--epochs", "2",
           "--head-fit", "adamw", "--batch-size", "32", "--no-figures", "--no-resume", "--save-dir", tmp_path / "run"]
    code, out, err = run_in_process("main.py", run)
    assert code == 0, err
    assert "features: 2 view(s) of " in out and " on disk in " in out and "built: no earlier pool" in out, out
    saved = load_checkpoint(tmp_path / "run" / "last.pt")["model"]
    assert set(saved) == {"projection", "threshold", "head.1.weight", "head.1.bias"}  # this model's weights
    assert saved["head.1.weight"].shape[1] == PROJECTIONS
    code, out, err = run_in_process("main.py", run)
    assert code == 0, err
    assert "reused whole (the same identity)" in out, out


def test_the_pool_of_such_a_model_is_its_features_and_its_identity_follows_its_fixed_parts(tmp_path):
    model = RandomProjectionPPV(3, 4, 0.0, "batch", window_steps=64)
    splits = {"train": split(40, 1), "val": split(7, 2)}
    model.fit(splits["train"].signals)
    memory, _ = build_feature_pool(model, splits, PoolPlan(views=1, seed=5), CPU, QuietLog())
    for name, part in splits.items():  # what the head reads from the pool is what the windows give it
        windows = torch.from_numpy(part.signals)
        assert torch.equal(model.from_counts(torch.from_numpy(memory[name].signals)),
                           model.from_counts(model.pool_features(windows))), name
    log = QuietLog()
    on_disk, _ = build_feature_pool(model, splits, PoolPlan(views=1, seed=5, store_root=tmp_path), CPU, log)
    assert "built: no earlier pool in this folder" in log.line
    assert all(np.array_equal(on_disk[name].signals[np.arange(len(part))], memory[name].signals)
               for name, part in splits.items())
    model.threshold.add_(0.5)  # a fixed part changed: another pool, built with the reason named
    log = QuietLog()
    build_feature_pool(model, splits, PoolPlan(views=1, seed=5, store_root=tmp_path), CPU, log)
    assert "built: the pool in " in log.line and "was of other model" in log.line, log.line


def test_a_model_without_fixed_features_has_nothing_to_pool():
    class Learnt(HARModel):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(3, 2)

    with pytest.raises(NotImplementedError, match="Learnt has no fixed features to pool"):
        Learnt().pool_features(torch.zeros(1, 3, 8))
    stored = torch.ones(2, 3)
    assert Learnt().from_counts(stored) is stored and Learnt().pool_identity_parts() == []
