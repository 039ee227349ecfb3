"""The checkpoint's format lives in training/checkpoint/format.py alone: no other module reads a
checkpoint's keys, a checkpoint written today holds the keys it always held, and one written before
the newer keys existed reads as it always did."""
import ast
import math
import re
from dataclasses import fields
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from data.layout import Layout
from inference_fixtures import make_checkpoint
from training.checkpoint.format import (
    PER_GPU_RULE_KEY,
    SavedRun,
    nonfinite_tensor,
    run_checkpoint,
    run_metadata,
)
from training.checkpoint.judge import judge, trained_to_the_end
from training.checkpoint.train_state import TrainState
from training.config.cli import REPO
from training.config.settings import RunConfig

FORMAT_MODULE = "training/checkpoint/format.py"
SCANNED = ("training", "inference", "crossval", "evaluation", "studies", "profiling", "benchmarks")
PARTS = ("model", "optimizer", "scaler", "ema", "rng", "scheduler")  # Trainer.build's stateful parts
# Keys no dict but a checkpoint holds (class names and members are a report's too): read from any name,
# they are a checkpoint's.
OWN_KEYS = {"normalization", "in_channels", "num_classes", "channel_names", "sample_rate_hz", "window_steps",
            "preprocessing", "data_identity", "planned_epochs", "global_batch_size", PER_GPU_RULE_KEY,
            "epoch_position", "epochs_since_best", "best_metric", "epoch_loss_sum", "epoch_samples"}
# Names a loaded checkpoint (or an ensemble's member) goes by, and SavedRun's dict: any key read from them
# is a checkpoint's.
CHECKPOINT_NAME = re.compile(r"(.*_)?(checkpoint|ckpt)|member|part|raw")
# Reads left in functions of training/trainer.py that the format's change did not reach; each is to go
# through SavedRun (saved.normalization, saved.weights) when that function is next changed.
NOT_YET_MOVED = set()  # (file, function) pairs allowed to read keys themselves: none


def receiver_name(node):
    """The name a subscript or .get() reads from: `checkpoint` of checkpoint[...] or inputs.checkpoint[...]."""
    while isinstance(node, ast.Subscript):  # checkpoint["a"]["b"] reads "a" from the checkpoint
        node = node.value
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def key_reads(tree):
    """(receiver, key node, line) for every subscript read, .get() and `in` test of the module."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            yield node.value, node.slice, node.lineno
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and node.args):
            yield node.func.value, node.args[0], node.lineno
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.In, ast.NotIn)):
            yield node.comparators[0], node.left, node.lineno


def reads_a_checkpoint_key(receiver, key):
    literal = key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else None
    return literal in OWN_KEYS or CHECKPOINT_NAME.fullmatch(receiver_name(receiver).lower()) is not None


def enclosing_functions(tree):
    """line -> the name of the innermost function holding it."""
    where = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for line in range(node.lineno, node.end_lineno + 1):
                if line not in where or where[line][0] < node.lineno:
                    where[line] = (node.lineno, node.name)
    return {line: name for line, (_, name) in where.items()}


def checkpoint_key_reads(root):
    """'path:line (function)' for every read of a checkpoint's key outside the format module."""
    found = []
    for path in sorted(p for folder in SCANNED for p in (root / folder).rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative == FORMAT_MODULE:
            continue
        tree = ast.parse(path.read_text())
        functions = enclosing_functions(tree)
        for receiver, key, line in key_reads(tree):
            function = functions.get(line, "")
            if reads_a_checkpoint_key(receiver, key) and (relative, function) not in NOT_YET_MOVED:
                found.append(f"{relative}:{line} ({function or 'module'})")
    return list(dict.fromkeys(found))


def test_only_the_format_module_reads_a_checkpoints_keys():
    assert checkpoint_key_reads(REPO) == [], "read these through training/checkpoint/format.py's SavedRun"


def test_the_scan_sees_each_way_a_key_is_read(tmp_path):
    """The scan is not blind: each form of read it stands guard over is found, and a like read of another
    dict is not."""
    module = tmp_path / "training" / "reader.py"
    module.parent.mkdir()
    module.write_text("def read(checkpoint, inputs, report, member):\n"
                      "    a = checkpoint['config']\n"
                      "    b = inputs.checkpoint.get('layout')\n"
                      "    c = 'ema' in checkpoint\n"
                      "    d = report['window_steps']\n"
                      "    e = member[key]\n"
                      "    f = 'config' in SavedRun(checkpoint).raw\n"
                      "    g = report['config'], report.get('accuracy'), 'model' in report\n")
    for folder in SCANNED[1:]:
        (tmp_path / folder).mkdir()
    assert sorted(checkpoint_key_reads(tmp_path)) == [f"training/reader.py:{line} (read)" for line in range(2, 8)]


def tiny_data(described=None):
    """The attributes run_metadata reads of a HarData, for 4 channels x 16 steps and 3 classes."""
    layout = Layout.named(("x", "y", "z", "w"), ("a", "b", "c"), sample_rate_hz=50, window_steps=16,
                          preprocessing="raw")
    return SimpleNamespace(train=SimpleNamespace(signals=np.zeros((2, 4, 16), dtype=np.float32)),
                           class_names=layout.class_names, layout=layout, described=described,
                           identity="windows-1234")


def written_checkpoint(config=None):
    """What CheckpointManager.save writes for a run of `config` on tiny_data (parts as plain dicts)."""
    config = config or RunConfig()
    metadata = {**run_metadata(config=config, data=tiny_data(), normalization={"mean": torch.zeros(4),
                                                                               "std": torch.ones(4)},
                               world_size=1, global_batch=32, batch_layout={"world_size": 1}, planned_epochs=3),
                PER_GPU_RULE_KEY: False}
    parts = {"model": {"weight": torch.ones(2)}, "optimizer": {"state": {}}, "scaler": {}, "ema": None,
             "rng": [], "scheduler": {}}
    return run_checkpoint(metadata, TrainState(epoch=1, step=7).state_dict(), parts)


def test_a_checkpoint_holds_the_keys_it_always_held():
    metadata = ("config", "planned_epochs", "normalization", "world_size", "global_batch_size", "layout",
                "in_channels", "num_classes", "class_names", "channel_names", "sample_rate_hz", "window_steps",
                "preprocessing", "description", "data_identity", PER_GPU_RULE_KEY)
    state = [item.name for item in fields(TrainState)]
    checkpoint = written_checkpoint()
    assert list(checkpoint) == [*metadata, *state, *PARTS]
    layout_keys = ("class_names", "channel_names", "sample_rate_hz", "window_steps", "preprocessing", "description")
    assert {name: checkpoint[name] for name in layout_keys} == {
        "class_names": ["a", "b", "c"], "channel_names": ["x", "y", "z", "w"], "sample_rate_hz": 50.0,
        "window_steps": 16, "preprocessing": "raw", "description": None}
    assert isinstance(checkpoint["sample_rate_hz"], float) and checkpoint["in_channels"] == 4


# Keys a checkpoint written before they existed lacks; the config lacks --lr-reference-batch likewise.
NEWER_KEYS = ("planned_epochs", "data_identity", "layout", PER_GPU_RULE_KEY, "channel_names", "window_steps",
              "description", "epoch_position", "epochs_since_best", "epoch_loss_sum", "epoch_samples", "ema")


def old_checkpoint():
    checkpoint = {key: value for key, value in written_checkpoint().items() if key not in NEWER_KEYS}
    checkpoint["config"] = {flag: value for flag, value in checkpoint["config"].items()
                            if flag != "lr_reference_batch"}
    return checkpoint


def test_a_checkpoint_from_before_the_newer_keys_reads_as_it_always_did():
    saved = SavedRun(old_checkpoint())
    assert saved.planned_epochs(99) == RunConfig().optim.epochs  # its --epochs
    assert saved.data_identity is None and saved.batch_layout is None and saved.part("ema") is None
    assert saved.lr_scales_by_per_gpu_batch()  # begun before --lr-reference-batch
    assert saved.data_layout() is None  # no channel_names: an older file's layout is not read
    assert saved.progress() == (1, 7, 0) and saved.epochs_since_best == 0
    state = TrainState(epoch_position=5, epochs_since_best=2)
    state.load_state_dict(saved.train_state)
    assert (state.epoch, state.step, state.epoch_position, state.epochs_since_best) == (1, 7, 0, 0)
    assert saved.inference_weights() is saved.weights  # no average: the trained weights
    assert not trained_to_the_end(saved)
    judgement = judge(saved.raw, "last.pt", RunConfig())
    assert judgement.refusal is None and judgement.warnings == []


def test_the_newer_keys_are_read_where_they_are_written():
    saved = SavedRun(written_checkpoint(RunConfig().replace(epochs=5)))
    assert saved.planned_epochs(99) == 3 and saved.data_identity == "windows-1234"
    assert saved.batch_layout == {"world_size": 1} and not saved.lr_scales_by_per_gpu_batch()
    layout = saved.data_layout()
    assert layout.window_steps == 16 and layout.channels == ("x", "y", "z", "w") and layout.sample_rate_hz == 50.0
    assert layout.as_json() == tiny_data().layout.as_json()  # read back as it was written


def test_an_old_checkpoint_without_a_description_predicts(tmp_path):
    from inference.bundle import load_bundle
    bundle = load_bundle(make_checkpoint(tmp_path / "old.pt"))  # the keys predict.py has always read, no more
    assert bundle.described is None and bundle.window_steps == 128 and bundle.members == 1


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_one_finite_check_for_resuming_and_predicting(bad):
    weights = {"a": torch.ones(3), "b": torch.tensor([1.0, bad]), "c": torch.tensor([bad]), "n": torch.tensor([1])}
    assert nonfinite_tensor(weights.items()) == "b"
    assert nonfinite_tensor(SavedRun({"model": weights}).trained_tensors()) == "model.b"
    assert nonfinite_tensor(SavedRun({"model": {}, "ema": {"weights": {"w": weights["c"]}}}).trained_tensors()) \
        == "ema.w"
    assert nonfinite_tensor({"a": weights["a"], "n": weights["n"]}.items()) is None
