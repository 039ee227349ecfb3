"""The multi-process strategies beyond plain DDP, on CPU (gloo). --multi-gpu fsdp: the same weights as
one process and as DDP, 1/N of the model state per rank, an exact resume after a rank dies, and
checkpoints that move between FSDP, DDP, one device and predict.py. --grad-compression: DDP with
gradients sent in half precision trains close to, and not exactly like, full precision."""
import json
import sys

import pytest
import torch

from conftest import (
    REPO,
    TINY_DATA,
    load_checkpoint,
    max_abs_difference,
    one_intra_op_thread,
    read_metrics,
    requires_cuda,
    run_in_process,
    run_subprocess,
)

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
# The transformer, so that each encoder block is a sharded unit of its own; GroupNorm, no dropout and
# no augmentation, so that two ranks of 16 and one process of 32 take the same steps. The weight
# average stays on: it is sharded like the model and must come out the same too.
SAME_STEPS = [*TINY_DATA, "--model", "transformer", "--norm", "group", "--dropout", "0", "--augment", "none",
              "--lr-scaling", "none", "--label-smoothing", "0", "--epochs", "1", "--no-resume"]
TOLERANCE = 1e-4  # float32 summation order; DDP against one process meets 2e-5


def launch(mode, save_dir, *extra, env=None):
    result = run_subprocess([*TORCHRUN, "main_multi_gpu.py", "--multi-gpu", mode, "--device", "cpu", *SAME_STEPS,
                             "--batch-size", "16", "--save-dir", save_dir, *extra], env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One epoch each: FSDP and DDP on 2 ranks x 16, one process x 32."""
    root = tmp_path_factory.mktemp("fsdp")
    out = {"fsdp": launch("fsdp", root / "fsdp").stdout, "ddp": launch("ddp", root / "ddp").stdout}
    with one_intra_op_thread():  # as each torchrun worker computes
        code, _, err = run_in_process("main.py", [*SAME_STEPS, "--batch-size", "32", "--save-dir", root / "one"])
    assert code == 0, err
    return root, out


def test_fsdp_takes_the_steps_of_one_process_and_of_ddp(runs):
    root, out = runs
    fsdp, ddp, one = (load_checkpoint(root / name / "last.pt") for name in ("fsdp", "ddp", "one"))
    assert fsdp["step"] == ddp["step"] == one["step"] == 17
    assert "run: fsdp with 2 processes" in out["fsdp"]
    assert max_abs_difference(fsdp["model"], one["model"]) < TOLERANCE
    assert max_abs_difference(fsdp["model"], ddp["model"]) < TOLERANCE
    assert max_abs_difference(fsdp["ema"]["weights"], one["ema"]["weights"]) < TOLERANCE
    # Saved in torch's own format: numbered parameters, the same moments as one process's.
    assert fsdp["optimizer"]["param_groups"][0]["params"] == one["optimizer"]["param_groups"][0]["params"]
    for index, moments in one["optimizer"]["state"].items():
        assert (fsdp["optimizer"]["state"][index]["exp_avg"] - moments["exp_avg"]).abs().max() < TOLERANCE


def test_each_rank_holds_half_the_model_state(runs):
    root, _ = runs
    fsdp, ddp = (read_metrics(root / name)[-1]["model_state"] for name in ("fsdp", "ddp"))
    for kind in ("parameters_mb", "gradients_mb", "optimizer_mb"):
        assert sum(row[kind] for row in fsdp) == pytest.approx(ddp[0][kind], rel=0.01)  # all of it, once
        assert max(row[kind] for row in fsdp) < 0.55 * ddp[0][kind]  # each rank about half


def test_checkpoints_move_between_fsdp_ddp_one_device_and_predict(runs, tmp_path):
    root, _ = runs
    # DDP continues FSDP's run for a second epoch, and FSDP continues the one-process run.
    launch("ddp", tmp_path / "ddp-from-fsdp", "--epochs", "2", "--resume", root / "fsdp" / "last.pt")
    launch("fsdp", tmp_path / "fsdp-from-one", "--epochs", "2", "--resume", root / "one" / "last.pt")
    for name in ("ddp-from-fsdp", "fsdp-from-one"):
        assert load_checkpoint(tmp_path / name / "last.pt")["step"] == 34
    from inference.bundle import load_bundle
    bundle = load_bundle(root / "fsdp" / "best.pt")  # no process group, no FSDP
    with torch.no_grad():
        assert bundle.model(torch.zeros(2, 9, 128)).shape == (2, 6)


def test_a_killed_fsdp_rank_restarts_and_the_run_ends_as_uninterrupted(runs, tmp_path):
    """Rank 1 dies mid-epoch; torchrun restarts the group, which resumes from the step saved just before."""
    root, _ = runs
    resumable = [flag for flag in SAME_STEPS if flag != "--no-resume"]  # the restarted group must resume
    result = run_subprocess([*TORCHRUN, "--max-restarts=1", "main_multi_gpu.py", "--multi-gpu", "fsdp", "--device",
                             "cpu", *resumable, "--batch-size", "16", "--save-every-steps", "1",
                             "--save-dir", tmp_path], env={"HAR_FAULT": "kill@9:rank=1"}, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "RESUMING" in result.stdout and "sample 288 of 544" in result.stdout  # 9 steps of 32 were saved
    resumed, straight = load_checkpoint(tmp_path / "last.pt"), load_checkpoint(root / "fsdp" / "last.pt")
    assert resumed["step"] == straight["step"]
    for name, tensor in straight["model"].items():
        assert torch.equal(tensor, resumed["model"][name]), name
    for name, tensor in straight["ema"]["weights"].items():
        assert torch.equal(tensor, resumed["ema"]["weights"][name]), ("ema", name)
    assert json.loads((tmp_path / "test_report.json").read_text())["accuracy"] == \
        json.loads((root / "fsdp" / "test_report.json").read_text())["accuracy"]


# Clipping off: FSDP sums the gradient's norm shard by shard, in another order than one tensor's norm,
# and AMP's bf16 forward turns that last bit into visible differences within a few steps. Without it,
# both strategies reduce the same fp32 gradients and step the same AdamW: the weights come out equal.
AMP_RUNS = [*TINY_DATA, "--synthetic-windows-per-subject", "16", "--batch-size", "16", "--dropout", "0",
            "--augment", "none", "--label-smoothing", "0", "--epochs", "1", "--head-fit", "adamw",
            "--pool-head", "ddp", "--max-grad-norm", "0", "--amp"]


def fsdp_against_ddp(tmp_path, nproc, *flags):
    out = tmp_path / "figures.json"
    result = run_subprocess([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                             "tests/scripts/fsdp_against_ddp.py", out, tmp_path, *AMP_RUNS, *flags], timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out.read_text())


def test_fsdp_with_amp_trains_every_model_and_norm_as_ddp_with_amp_does(tmp_path):
    figures = fsdp_against_ddp(tmp_path, 2, "--device", "cpu")
    # fp16's GradScaler (CUDA only in training) over sharded gradients, run on CPU: an overflow in one
    # rank's shard makes every rank skip its step and halve its scale.
    assert figures.pop("overflow") == [{"stepped": False, "scale": 512.0}] * 2
    assert {key.split("/")[0] for key in figures} == {"cnn1d", "cnn_lstm", "transformer", "minirocket"}
    for configuration, figure in figures.items():
        assert figure["precision"] == "precision: AMP bf16 autocast", configuration
        assert figure["ddp_movement"] > 1e-3, configuration  # it trained
        assert figure["max_abs_difference"] == 0.0, (configuration, figure)


@requires_cuda
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_fsdp_with_amp_on_a_gpu_trains_as_ddp_with_amp_does(tmp_path, dtype):
    figures = fsdp_against_ddp(tmp_path, 1, "--device", "cuda", "--amp-dtype", dtype)
    figures.pop("overflow")
    for configuration, figure in figures.items():
        scaler = " with GradScaler" if dtype == "fp16" else ""
        assert figure["precision"] == f"precision: AMP {dtype} autocast{scaler}", configuration
        assert figure["max_abs_difference"] < 1e-6, (configuration, figure)


@pytest.mark.parametrize("kind", ["fp16", "bf16"])
def test_half_precision_gradients_train_close_to_full_precision(runs, tmp_path, kind):
    root, _ = runs
    result = launch("ddp", tmp_path, "--grad-compression", kind)
    assert f"gradients sent as {kind}" in result.stdout
    compressed, full = load_checkpoint(tmp_path / "last.pt"), load_checkpoint(root / "ddp" / "last.pt")
    difference = max_abs_difference(compressed["model"], full["model"])
    assert 0 < difference < 1e-2, difference  # rounded on the wire, so not equal; still the same run


def test_bf16_compression_is_refused_in_one_line_where_the_backend_cannot_sum_bf16(monkeypatch):
    from training.distributed import ddp as strategy
    from training.errors import UsageError

    def cannot_sum(tensor, *args, **kwargs):
        raise RuntimeError("Invalid scalar type\nException raised from ...")
    monkeypatch.setattr(strategy.dist, "all_reduce", cannot_sum)
    monkeypatch.setattr(strategy.dist, "get_backend", lambda: "gloo")
    with pytest.raises(UsageError, match=r"^--grad-compression bf16: this gloo cannot all-reduce bf16 tensors "
                                         r"\(Invalid scalar type\); use --grad-compression fp16$"):
        strategy.require_bfloat16_all_reduce(torch.device("cpu"))


def test_the_bf16_hook_sends_bf16_and_writes_the_average_back_into_the_gradients():
    import torch.distributed as dist

    from training.distributed.ddp import bfloat16_compress_hook

    class Bucket:
        def __init__(self, tensor):
            self.tensor = tensor

        def buffer(self):
            return self.tensor
    # 1 + 2**-10 is exact in fp32 and fp16 (10 mantissa bits) but rounds to 1 in bf16 (7 bits).
    gradients = torch.tensor([1 + 2 ** -10, 3.0])
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        written = bfloat16_compress_hook(None, Bucket(gradients)).wait()
    finally:
        dist.destroy_process_group()
    assert written is gradients and gradients.dtype == torch.float32
    assert gradients.tolist() == [1.0, 3.0]


def test_every_strategy_offers_what_the_protocol_lists():
    import inspect

    from training.distributed.ddp import DistributedStrategy
    from training.distributed.fsdp import FullyShardedStrategy
    from training.distributed.single import SingleDevice
    from training.distributed.strategy import DataParallelStrategy, Strategy
    methods = [name for name, member in vars(Strategy).items()
               if inspect.isfunction(member) and not name.startswith("_")]
    assert "wrap" in methods and "sync_buffers" in methods
    for kind in (SingleDevice, DataParallelStrategy, DistributedStrategy, FullyShardedStrategy):
        for name in [*methods, "data_parallel_size", "other_gpus"]:
            assert callable(getattr(kind, name, None)) or isinstance(getattr(kind, name, None), property), (kind, name)


CLOSE_SCRIPT = """
import gc, json
from models import build_model
from training.distributed.ddp import DistributedStrategy, RankPlacement
from training.distributed.fsdp import FullyShardedStrategy
from training.distributed.strategy import distributed_env
collections = []
collect = gc.collect
gc.collect = lambda *args: collections.append(1) or collect(*args)
precision = type("FullPrecision", (), {"enabled": False})()
placement = RankPlacement(device_type="cpu", backend="gloo", gpu_ids=None, timeout_s=60, ranks=distributed_env())
counts = {}
for name, make, replicate in [
        ("replicated", lambda: DistributedStrategy(placement=placement, sync_bn=False), True),
        ("ddp", lambda: DistributedStrategy(placement=placement, sync_bn=False), False),
        ("fsdp", lambda: FullyShardedStrategy(placement=placement, reshard_after_forward=True), False)]:
    strategy = make()
    if replicate:
        strategy.replicate_model()
    strategy.wrap(build_model("cnn1d", in_channels=3, num_classes=2), precision)
    collections.clear()
    strategy.close()
    counts[name] = len(collections)
print(json.dumps(counts))
"""


def test_closing_collects_garbage_only_where_a_wrapped_model_must_go_before_its_group(tmp_path):
    """A DDP or FSDP module is freed while its process group still exists (a full collection); a
    replicated head has none, and skips the collection, a sizeable pause once torch._dynamo is loaded."""
    script = tmp_path / "close.py"
    script.write_text(CLOSE_SCRIPT)
    result = run_subprocess([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1",
                             script], timeout=120, env={"PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"replicated": 0, "ddp": 1, "fsdp": 1}
