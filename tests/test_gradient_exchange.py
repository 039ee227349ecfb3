"""DDP exchanges gradients once per optimizer step, not once per micro-batch, eager and compiled:
counted with a DDP communication hook, since the weights alone cannot tell (an all-reduce of every
micro-batch averages to the same gradient)."""
import json
import sys

from conftest import TINY_DATA, run_subprocess

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]


def test_only_the_last_micro_batch_of_a_window_exchanges_gradients(tmp_path):
    out = tmp_path / "counts.json"
    # 544 windows over 2 ranks at 16 per micro-batch: 17 micro-batches per rank, 9 windows of 2 (the last of 1).
    result = run_subprocess([*TORCHRUN, "tests/scripts/count_allreduces.py", out, tmp_path, *TINY_DATA,
                             "--batch-size", "16", "--grad-accum-steps", "2", "--device", "cpu"], timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    counts = json.loads(out.read_text())
    for variant in ("eager", "compiled"):
        count = counts[variant]
        assert (count["micro_batches"], count["steps"]) == (17, 9), variant
        assert count["buckets_exchanged"] == count["steps"] * count["buckets"], (variant, count)
