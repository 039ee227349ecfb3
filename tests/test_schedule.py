"""The LR arithmetic and the accumulation bookkeeping, as pure functions."""
import math

import pytest
import torch

from training.loop.step import (
    build_scheduler,
    global_batch_size,
    micro_step_plan,
    scaled_lr,
    steps_per_epoch,
    warmup_cosine,
)


@pytest.mark.parametrize("world, accum, expected", [(1, 1, 32), (2, 1, 64), (4, 2, 256), (8, 1, 256)])
def test_global_batch_counts_replicas_and_accumulation(world, accum, expected):
    assert global_batch_size(32, world, accum) == expected


@pytest.mark.parametrize("rule, world, expected", [
    ("linear", 1, 1e-3), ("linear", 2, 2e-3), ("linear", 4, 4e-3), ("linear", 8, 8e-3),
    ("sqrt", 4, 2e-3), ("sqrt", 8, 1e-3 * math.sqrt(8)), ("none", 8, 1e-3),
])
def test_scaled_lr_follows_the_rule(rule, world, expected):
    assert scaled_lr(1e-3, rule, global_batch_size(32, world, 1), 32) == pytest.approx(expected)


def test_scaled_lr_rejects_unknown_rule():
    with pytest.raises(ValueError):
        scaled_lr(1e-3, "cubic", 64, 32)


def test_warmup_ramps_linearly_then_cosine_reaches_zero():
    warmup, total = 10, 110
    ramp = [warmup_cosine(step, warmup, total) for step in range(warmup)]
    assert ramp == pytest.approx([(i + 1) / warmup for i in range(warmup)])
    assert warmup_cosine(warmup, warmup, total) == pytest.approx(1.0)
    assert warmup_cosine(warmup + 50, warmup, total) == pytest.approx(0.5)  # half-way through decay
    assert warmup_cosine(total, warmup, total) == pytest.approx(0.0, abs=1e-12)
    decay = [warmup_cosine(step, warmup, total) for step in range(warmup, total + 1)]
    assert all(a >= b for a, b in zip(decay, decay[1:], strict=False))


def test_no_warmup_starts_at_peak():
    assert warmup_cosine(0, 0, 100) == pytest.approx(1.0)


def test_scheduler_applies_the_multiplier_per_optimizer_step():
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=0.4)
    scheduler = build_scheduler(optimizer, warmup_steps=4, total_steps=20)
    seen = []
    for _ in range(20):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen == pytest.approx([0.4 * warmup_cosine(step, 4, 20) for step in range(20)])


@pytest.mark.parametrize("batches, accum, expected", [(10, 1, 10), (10, 2, 5), (10, 3, 4), (10, 20, 1)])
def test_steps_per_epoch_counts_a_partial_window(batches, accum, expected):
    assert steps_per_epoch(batches, accum) == expected


def test_micro_step_plan_windows_and_partial_last_window():
    plan = [micro_step_plan(i, 7, 3) for i in range(7)]
    assert plan == [(3, False), (3, False), (3, True), (3, False), (3, False), (3, True), (1, True)]
    # The losses of a window, each divided by its window size, weigh to exactly one mean.
    for start in (0, 3, 6):
        size = plan[start][0]
        assert sum(1 / plan[i][0] for i in range(start, min(7, start + size))) == pytest.approx(1.0)
    assert sum(step for _, step in plan) == steps_per_epoch(7, 3)


def test_micro_step_plan_without_accumulation_steps_every_batch():
    assert all(micro_step_plan(i, 5, 1) == (1, True) for i in range(5))
