"""The compiled compare-and-count (models.minirocket_compiled) that a large pool on a CPU takes: the
same counts as the eager path, and the eager path kept, in one line, wherever it fails."""
import pickle

import numpy as np
import pytest
import torch

import models.minirocket as minirocket
from models import build_model
from models.minirocket_compiled import compiled_positive_counts, positive_counts
from test_feature_pool import CPU, QuietLog, split
from training.pool.build import PoolPlan, build_feature_pool


def fitted(seed=0):
    torch.manual_seed(seed)
    model = build_model("minirocket", 3, 4, width=840, window_steps=64)
    model.fit(torch.randn(40, 3, 64).cumsum(dim=2) * 0.1)
    return model


class Lines(QuietLog):
    def __init__(self):
        super().__init__()
        self.lines = []

    def info(self, line):
        super().info(line)
        self.lines.append(line)


def test_a_large_pool_on_a_cpu_is_counted_by_the_compiled_loop_bit_for_bit(monkeypatch):
    monkeypatch.setattr(minirocket, "COMPILED_COUNT_WINDOWS", 100)
    splits = {"train": split(150, 1), "val": split(70, 2), "test": split(0, 3)}
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the chunks of 64 windows go one per thread, each calling the loop
    try:
        eager, _ = build_feature_pool(fitted(), splits, PoolPlan(views=1, seed=5), CPU, QuietLog())
        compiled_model, log = fitted(), Lines()
        compiled, _ = build_feature_pool(compiled_model, splits, PoolPlan(views=1, seed=5), CPU, log)
    finally:
        torch.set_num_threads(threads)
    assert compiled_model._count is not None
    assert log.lines[0].startswith("transform: comparisons counted by a compiled loop (220 windows; ready in ")
    for name in ("train", "val"):
        assert np.array_equal(compiled[name].signals, eager[name].signals)


@pytest.mark.parametrize("loop, said", [
    (lambda outputs, biases: (_ for _ in ()).throw(RuntimeError("no C++ compiler found\nmore")),
     "counting eagerly, the compiled loop failed (RuntimeError: no C++ compiler found)"),
    (lambda outputs, biases: positive_counts(outputs, biases) + 1,
     "counting eagerly, the compiled loop's counts differed from the eager ones on a check"),
], ids=["fails", "differs"])
def test_a_compiled_loop_that_fails_or_differs_leaves_the_eager_counts_in_one_line(monkeypatch, loop, said):
    monkeypatch.setattr(minirocket, "compiled_positive_counts", lambda: loop)
    model, lines, windows = fitted(), [], torch.randn(70, 3, 64).cumsum(dim=2)
    before = model.pool_features(windows)
    model.prepare_pool(10**9, lines.append)
    assert lines == [f"transform: {said}"]
    assert model._count is None and torch.equal(model.pool_features(windows), before)


def test_a_small_pool_or_padded_windows_keep_the_eager_counts_without_a_word(monkeypatch):
    monkeypatch.setattr(minirocket, "compiled_positive_counts", lambda: pytest.fail("compiled for a small pool"))
    lines = []
    fitted().prepare_pool(minirocket.COMPILED_COUNT_WINDOWS - 1, lines.append)
    padded = fitted()
    padded.fit(torch.randn(40, 3, 64).cumsum(dim=2), padded=True)
    padded.prepare_pool(10**9, lines.append)
    assert lines == []


def test_a_pool_reused_from_disk_prepares_for_no_window(tmp_path):
    model, asked = fitted(), []
    model.prepare_pool = lambda windows, say: asked.append(windows)
    splits = {"train": split(150, 1), "val": split(70, 2)}
    for _ in range(2):
        build_feature_pool(model, splits, PoolPlan(views=1, seed=5, store_root=tmp_path), CPU, QuietLog())
    assert asked == [220, 0]  # built, then reused whole: nothing to compile for


def test_the_chunks_of_a_build_call_only_the_graphs_the_check_compiled(monkeypatch):
    """The build's chunks run on worker threads of one torch thread each, with their own grad mode;
    a graph compiled for another state would count the pool unchecked."""
    graphs, real_compile = [], torch.compile

    def counting(graph, example_inputs):
        graphs.append(graph)
        return graph.forward
    monkeypatch.setattr(torch, "compile", lambda function, **options: real_compile(function, backend=counting,
                                                                                  **options))
    torch.compiler.reset()
    compiled_positive_counts.cache_clear()
    monkeypatch.setattr(minirocket, "COMPILED_COUNT_WINDOWS", 100)
    model, lines, threads = fitted(), [], torch.get_num_threads()
    windows = torch.randn(129, 3, 64).cumsum(dim=2)  # chunks of 64, 64 and 1
    try:
        model.prepare_pool(200, lines.append)
        checked = len(graphs)
        torch.set_num_threads(2)
        pooled = model.pool_features(windows)
    finally:
        torch.set_num_threads(threads)
        compiled_positive_counts.cache_clear()
        torch.compiler.reset()
    assert checked > 0 and len(graphs) == checked, lines
    assert torch.equal(pooled, fitted().pool_features(windows))


def test_a_prepared_model_pickles_and_counts_eagerly_where_it_is_unpickled(monkeypatch):
    monkeypatch.setattr(minirocket, "compiled_positive_counts", lambda: lambda outputs, biases: positive_counts(
        outputs, biases))
    model = fitted()
    model.prepare_pool(10**9, [].append)
    assert model._count is not None
    copy = pickle.loads(pickle.dumps(model))
    windows = torch.randn(5, 3, 64).cumsum(dim=2)
    assert copy._count is None and torch.equal(copy.pool_features(windows), model.pool_features(windows))
