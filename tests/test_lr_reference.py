"""The peak LR follows the global batch against --lr-reference-batch, however the batch is split, and a run
begun before the reference batch existed resumes with the LR it had."""
import pytest
import torch

from conftest import TINY_DATA, load_checkpoint, run_in_process
from training.checkpoint.format import PER_GPU_RULE_KEY
from training.loop.step import global_batch_size, scaled_lr


@pytest.mark.parametrize("per_gpu, replicas, accumulation", [(32, 1, 1), (8, 1, 4), (4, 8, 1), (2, 4, 4)])
def test_one_global_batch_trains_at_one_lr_however_it_is_split(per_gpu, replicas, accumulation):
    global_batch = global_batch_size(per_gpu, replicas, accumulation)
    assert global_batch == 32
    assert scaled_lr(1e-3, "linear", global_batch, 32) == pytest.approx(1e-3)
    assert scaled_lr(1e-3, "linear", global_batch_size(per_gpu, 2 * replicas, accumulation), 32) == pytest.approx(2e-3)


def peak_lr(save_dir):
    checkpoint = load_checkpoint(save_dir / "last.pt")
    return checkpoint["optimizer"]["param_groups"][0]["initial_lr"], checkpoint


def train(save_dir, *flags):
    code, out, err = run_in_process("main.py", [*TINY_DATA, "--save-dir", save_dir, *flags])
    assert code == 0, err
    return out


def test_accumulating_the_default_global_batch_keeps_the_default_lr_and_the_line_says_why(tmp_path):
    out = train(tmp_path / "accumulated", "--batch-size", "8", "--grad-accum-steps", "4", "--epochs", "1")
    assert ("lr: --lr 1.00e-03 for a global batch of 32 (--lr-reference-batch), linear scaling: global batch 32 "
            "(8 per GPU x 1 replicas x 4 accumulation), x 32/32 -> peak 1.00e-03") in out
    assert peak_lr(tmp_path / "accumulated")[0] == pytest.approx(1e-3)
    train(tmp_path / "reference", "--batch-size", "8", "--lr-reference-batch", "8", "--epochs", "1")
    assert peak_lr(tmp_path / "reference")[0] == pytest.approx(1e-3)


def test_a_run_begun_before_the_reference_batch_resumes_with_its_own_lr(tmp_path):
    save_dir = tmp_path / "run"
    train(save_dir, "--batch-size", "16", "--epochs", "2", "--stop-after-epochs", "1")
    lr, checkpoint = peak_lr(save_dir)
    assert lr == pytest.approx(5e-4) and checkpoint[PER_GPU_RULE_KEY] is False  # 16 of the reference 32
    # As the checkpoints of that time were: no reference batch among the flags, no rule key.
    del checkpoint["config"]["lr_reference_batch"], checkpoint[PER_GPU_RULE_KEY]
    checkpoint["optimizer"]["param_groups"] = [{**group, "initial_lr": 1e-3}
                                               for group in checkpoint["optimizer"]["param_groups"]]
    torch.save(checkpoint, save_dir / "last.pt")
    out = train(save_dir, "--batch-size", "16", "--epochs", "2")
    assert "x 16/16 -> peak 1.00e-03 (this run began before --lr-reference-batch" in out
    lr, checkpoint = peak_lr(save_dir)
    assert lr == pytest.approx(1e-3) and checkpoint[PER_GPU_RULE_KEY] is True  # and so on, to its end
    assert checkpoint["epoch"] == 2
