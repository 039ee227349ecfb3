"""What only a GPU exercises, through the real entry points: AMP with and without a GradScaler,
the fused AdamW, DataParallel and DDP on one GPU, checkpoints moving between devices, the CUDA
random stream across a kill, memory figures, both data paths, and inference on a CUDA-trained
checkpoint. On a GPU machine: `python -m pytest -q -m cuda`; without one every test is skipped."""
import contextlib
import csv
import json
import math
import re
import shutil
import signal
import sys
import textwrap
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from conftest import (
    CUDA_MARKS,
    TINY_DATA,
    load_checkpoint,
    max_abs_difference,
    read_metrics,
    run_in_process,
    run_subprocess,
)
from test_predict import run_script
from test_resume import RUN, assert_same_state
from test_training_runs import EQUIVALENT, torchrun

pytestmark = CUDA_MARKS  # pytest.mark.cuda, and skipped where torch sees no GPU

CUDA = ["--device", "cuda"]
# test_resume's run (accumulation, a save every step, augmentation, EMA, dropout) with the same
# kernels in every process, so that a resumed run can be compared bit for bit.
RUN_CUDA = [*RUN, *CUDA, "--deterministic"]
# Full fp32 in subprocesses: cuDNN convolutions use TF32 by default, which rounds inputs to 10 bits and
# would swamp the float tolerance below. cuBLAS gets a fixed workspace, so it repeats its sums.
FP32_ENV = {"NVIDIA_TF32_OVERRIDE": "0", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
# Summation order and kernel choice only; runs that really differ are orders of magnitude apart.
CUDA_WEIGHT_TOLERANCE = 1e-4
INITIAL_SCALE = 2.0 ** 16  # GradScaler's default
STEPS_PER_EPOCH = 17  # TINY_DATA: 544 training windows at batch 32
TWO_GPUS = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")


@contextlib.contextmanager
def full_fp32():
    """The in-process counterpart of FP32_ENV."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def assert_finite(weights):
    bad = [name for name, tensor in weights.items() if tensor.is_floating_point() and not torch.isfinite(tensor).all()]
    assert not bad, f"non-finite tensors: {bad}"


def parameter_names(model="cnn1d"):
    from models import build_model
    return [name for name, _ in build_model(model, 9, 6).named_parameters()]


def largest_difference(a, b):
    """Largest |difference| over the weights, the weight average and the optimizer moments."""
    moments = [max_abs_difference(a["optimizer"]["state"][index], b["optimizer"]["state"][index])
               for index in a["optimizer"]["state"]]
    return max(max_abs_difference(a["model"], b["model"]), max_abs_difference(a["ema"]["weights"], b["ema"]["weights"]),
               *moments)


# ---------------------------------------------------------------------------
# Mixed precision, the GradScaler and the fused AdamW
# ---------------------------------------------------------------------------

def test_bf16_amp_trains_without_a_grad_scaler(tmp_path):
    code, out, err = run_in_process("main.py", [*TINY_DATA, *CUDA, "--amp", "--amp-dtype", "bf16", "--epochs", "2",
                                                "--save-dir", tmp_path])
    assert code == 0, err
    assert "precision: AMP bf16 autocast" in out and "GradScaler" not in out
    checkpoint = load_checkpoint(tmp_path / "last.pt")
    assert checkpoint["scaler"] == {}  # a disabled scaler has no state
    assert_finite(checkpoint["model"])
    first, second = read_metrics(tmp_path)
    assert second["train_loss"] < first["train_loss"]


def test_fp16_amp_with_the_fused_adamw_counts_only_the_steps_it_took(tmp_path):
    code, out, err = run_in_process("main.py", [*TINY_DATA, *CUDA, "--amp", "--amp-dtype", "fp16", "--epochs", "2",
                                                "--save-dir", tmp_path])
    assert code == 0, err
    assert "precision: AMP fp16 autocast with GradScaler" in out
    checkpoint = load_checkpoint(tmp_path / "last.pt")
    assert all(group["fused"] for group in checkpoint["optimizer"]["param_groups"])
    scaler = checkpoint["scaler"]
    assert 0 < scaler["scale"] <= INITIAL_SCALE and scaler["growth_interval"] > checkpoint["step"]
    # The scale cannot grow within its interval, so each halving is one skipped step; the fused
    # kernel must not count those in the moments' bias correction.
    skipped = round(math.log2(INITIAL_SCALE / scaler["scale"]))
    assert checkpoint["step"] == 2 * STEPS_PER_EPOCH
    assert {int(state["step"]) for state in checkpoint["optimizer"]["state"].values()} == {
        checkpoint["step"] - skipped}
    assert_finite(checkpoint["model"])


NAN_MICRO_BATCH = 20  # batch 32, no accumulation: optimizer step 21, the 4th of epoch 2


@pytest.fixture(scope="module")
def fp16_run_with_a_nan_batch(tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("fp16-nan")
    result = run_subprocess([sys.executable, "main.py", *TINY_DATA, *CUDA, "--amp", "--amp-dtype", "fp16",
                             "--epochs", "2", "--save-every-steps", "1", "--keep-last", "40", "--save-dir", save_dir],
                            env={"HAR_FAULT": f"nan@{NAN_MICRO_BATCH}"})
    assert result.returncode == 0, result.stderr[-3000:]
    return save_dir


def test_fp16_step_with_a_nan_batch_is_skipped_without_touching_weights_or_moments(fp16_run_with_a_nan_batch):
    before, skipped, after = (load_checkpoint(fp16_run_with_a_nan_batch / f"step-{step:08d}.pt")
                              for step in (NAN_MICRO_BATCH, NAN_MICRO_BATCH + 1, NAN_MICRO_BATCH + 2))
    assert skipped["scaler"]["scale"] == before["scaler"]["scale"] * skipped["scaler"]["backoff_factor"]
    for name in parameter_names():
        assert torch.equal(before["model"][name], skipped["model"][name]), name
    for index, moments in before["optimizer"]["state"].items():
        for key, tensor in moments.items():
            assert torch.equal(tensor, skipped["optimizer"]["state"][index][key]), (index, key)
    # The control: the next step trains again.
    assert any(not torch.equal(skipped["model"][name], after["model"][name]) for name in parameter_names())


def test_fp16_nan_batch_leaves_no_nan_in_batchnorm_statistics(fp16_run_with_a_nan_batch):
    """The GradScaler skips the optimizer step, but the forward pass has already folded the NaN batch
    into BatchNorm's running mean and variance, which validation, best.pt and predict.py use."""
    final = load_checkpoint(fp16_run_with_a_nan_batch / "last.pt")
    assert_finite(final["model"])
    assert_finite(final["ema"]["weights"])


# ---------------------------------------------------------------------------
# DataParallel and DDP on the GPUs there are
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_data_parallel_on_one_gpu_under_amp(tmp_path, dtype):
    code, out, err = run_in_process("main_multi_gpu.py", ["--multi-gpu", "dp", "--gpu-ids", "0", *TINY_DATA, *CUDA,
                                                          "--amp", "--amp-dtype", dtype, "--epochs", "1",
                                                          "--save-dir", tmp_path])
    assert code == 0, err
    assert "dp over GPUs 0" in out and f"AMP {dtype} autocast" in out
    checkpoint = load_checkpoint(tmp_path / "last.pt")
    assert set(checkpoint["model"]) >= set(parameter_names())  # the bare model: no module./model. prefixes
    assert_finite(checkpoint["model"])
    assert read_metrics(tmp_path)[0]["memory"][0]["device"] == "cuda:0"


def test_data_parallel_replicas_compute_in_the_runs_autocast_dtype():
    """DataParallel's replica threads re-enter autocast without a dtype (fp16 on CUDA), so each replica
    enters the run's own. Two replicas on GPU 0 take the threaded path one GPU never takes otherwise."""
    from torch.nn.parallel import parallel_apply

    from training.distributed.strategy import _AutocastForward
    from training.loop.step import Precision
    device = torch.device("cuda", 0)
    precision = Precision(device, True, "bf16")
    replica = _AutocastForward(torch.nn.Linear(8, 4).to(device), precision)
    inputs = [(torch.randn(3, 8, device=device),) for _ in range(2)]
    with precision.autocast():
        outputs = parallel_apply([replica, replica], inputs, devices=[device, device])
    assert [output.dtype for output in outputs] == [torch.bfloat16, torch.bfloat16]


@pytest.fixture(scope="module")
def one_process_fp32(tmp_path_factory):
    """One process x 32 in fp32 on GPU 0: what the multi-rank runs below must reproduce."""
    save_dir = tmp_path_factory.mktemp("one-process")
    with full_fp32():
        code, _, err = run_in_process("main.py", [*EQUIVALENT, *CUDA, "--no-amp", "--batch-size", "32",
                                                  "--epochs", "2", "--save-dir", save_dir])
    assert code == 0, err
    return load_checkpoint(save_dir / "last.pt")


def test_the_cuda_tolerance_separates_a_different_run(tmp_path, one_process_fp32):
    """The control for the comparisons below: half the batch per step is another run."""
    with full_fp32():
        code, _, err = run_in_process("main.py", [*EQUIVALENT, *CUDA, "--no-amp", "--batch-size", "16",
                                                  "--epochs", "1", "--save-dir", tmp_path])
    assert code == 0, err
    half = load_checkpoint(tmp_path / "last.pt")
    assert max_abs_difference(half["model"], one_process_fp32["model"]) > 50 * CUDA_WEIGHT_TOLERANCE


@pytest.mark.parametrize("backend, gpu_ids", [("gloo", [0]), pytest.param("nccl", [0, 1], marks=TWO_GPUS)])
def test_ddp_two_ranks_on_cuda_equal_one_process(tmp_path, one_process_fp32, backend, gpu_ids):
    """torchrun, 2 ranks x 16 == one process x 32. NCCL refuses two ranks on one device; gloo
    shares GPU 0 between them, so every collective here carries CUDA tensors over gloo."""
    ddp = run_subprocess([*torchrun(), "--standalone", "--nproc_per_node=2", "main_multi_gpu.py", "--multi-gpu",
                          "ddp", *CUDA, "--backend", backend, "--gpu-ids", ",".join(map(str, gpu_ids)),
                          *EQUIVALENT, "--no-amp", "--batch-size", "16", "--epochs", "2",
                          "--save-dir", tmp_path], env=FP32_ENV)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    assert f"ddp with 2 processes ({backend})" in ddp.stdout
    memory = read_metrics(tmp_path)[-1]["memory"]
    assert [entry["device"] for entry in memory] == [f"rank{rank}:cuda:{gpu_ids[rank % len(gpu_ids)]}"
                                                     for rank in range(2)]
    assert all(entry["allocated_gib"] > 0 for entry in memory)
    checkpoint = load_checkpoint(tmp_path / "last.pt")
    assert checkpoint["step"] == one_process_fp32["step"] == 2 * STEPS_PER_EPOCH
    assert max_abs_difference(checkpoint["model"], one_process_fp32["model"]) < CUDA_WEIGHT_TOLERANCE


def test_replicas_of_the_head_record_their_steps_on_a_gpu_and_equal_one_process(tmp_path):
    """The default's head under 2-rank DDP (--pool-head replicated, gloo sharing GPU 0): each rank
    records its step as a CUDA graph of the whole global batch, and the run ends with the weights,
    moments and average of one process stepping that batch."""
    run = [*TINY_DATA, *CUDA, "--model", "minirocket", "--width", "840", "--head-fit", "adamw", "--no-amp",
           "--lr-scaling", "none", "--epochs", "2", "--deterministic", "--cuda-graphs", "--no-resume"]
    ddp = run_subprocess([*torchrun(), "--standalone", "--nproc_per_node=2", "main_multi_gpu.py", "--multi-gpu",
                          "ddp", "--backend", "gloo", "--gpu-ids", "0", *run, "--batch-size", "16",
                          "--save-dir", tmp_path / "ddp"], env=FP32_ENV)
    one = run_subprocess([sys.executable, "main.py", *run, "--batch-size", "32", "--save-dir", tmp_path / "one"],
                         env=FP32_ENV)
    for done in (ddp, one):
        assert done.returncode == 0, done.stderr[-3000:]
        assert "runs eagerly" not in done.stderr and "recording the step failed" not in done.stderr
    assert "the model replicated: each rank steps the whole global batch" in ddp.stdout
    runs = {name: load_checkpoint(tmp_path / name / "last.pt") for name in ("ddp", "one")}
    assert runs["ddp"]["step"] == runs["one"]["step"] > 0
    assert largest_difference(runs["ddp"], runs["one"]) < CUDA_WEIGHT_TOLERANCE


def test_ddp_one_nccl_rank_through_the_launcher_equals_one_process(tmp_path, one_process_fp32):
    """NCCL for the gradients, the gloo side group for stop requests and RNG states, on one GPU."""
    result = run_subprocess([sys.executable, "main_multi_gpu.py", "--multi-gpu", "ddp", "--nproc-per-node", "1",
                             *CUDA, "--gpu-ids", "0", *EQUIVALENT, "--no-amp", "--batch-size", "32", "--epochs", "2",
                             "--save-dir", tmp_path], env=FP32_ENV)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ddp with 1 processes (nccl)" in result.stdout
    assert read_metrics(tmp_path)[-1]["memory"][0]["device"] == "rank0:cuda:0"
    checkpoint = load_checkpoint(tmp_path / "last.pt")
    assert len(checkpoint["rng"]) == 1 and checkpoint["rng"][0]["cuda"] is not None  # gathered over gloo
    assert max_abs_difference(checkpoint["model"], one_process_fp32["model"]) < CUDA_WEIGHT_TOLERANCE


@pytest.mark.parametrize("backend, gpu_ids", [("gloo", "0"), pytest.param("nccl", "0,1", marks=TWO_GPUS)])
def test_ddp_evaluation_gathers_uneven_cuda_shards_once_each(tmp_path, backend, gpu_ids):
    """33 windows a subject: the 297 test windows split 149 / 148 over two ranks."""
    result = run_subprocess([*torchrun(), "--standalone", "--nproc_per_node=2", "main_multi_gpu.py", "--multi-gpu",
                             "ddp", *CUDA, "--backend", backend, "--gpu-ids", gpu_ids, *TINY_DATA,
                             "--synthetic-windows-per-subject", "33", "--epochs", "1", "--save-dir", tmp_path])
    assert result.returncode == 0, result.stderr[-3000:]
    test_report = json.loads((tmp_path / "test_report.json").read_text())
    assert test_report["num_samples"] == 9 * 33 and len(test_report["subjects"]) == 9
    val_report = json.loads((tmp_path / "val_report.json").read_text())
    assert val_report["num_samples"] == 33 * len(val_report["subjects"])


# ---------------------------------------------------------------------------
# Checkpoints between devices
# ---------------------------------------------------------------------------

def test_a_cuda_run_continues_on_cpu_and_back(tmp_path):
    common = [*TINY_DATA, "--epochs", "3", "--stop-after-epochs", "1", "--save-dir", tmp_path]
    for epoch, device in enumerate(("cuda", "cpu", "cuda"), start=1):
        code, out, err = run_in_process("main.py", [*common, "--device", device])
        assert code == 0, err
        assert ("RESUMING" in out) == (epoch > 1)
        checkpoint = load_checkpoint(tmp_path / "last.pt")
        assert checkpoint["epoch"] == epoch and checkpoint["step"] == epoch * STEPS_PER_EPOCH
        assert_finite(checkpoint["model"])
    records = read_metrics(tmp_path)
    assert [record["memory"][0]["device"] for record in records] == ["cuda:0", "cpu", "cuda:0"]
    assert (tmp_path / "test_report.json").is_file()


def test_a_cpu_checkpoint_continues_on_cuda_under_fp16_with_the_fused_adamw(tmp_path):
    """A checkpoint's optimizer groups carry `fused`; a CPU run's None must not replace the fused
    kernel the CUDA run built, which the fp16 GradScaler hands its scale and inf flag to."""
    common = [*TINY_DATA, "--epochs", "2", "--save-dir", tmp_path]
    code, _, err = run_in_process("main.py", [*common, "--device", "cpu", "--stop-after-epochs", "1"])
    assert code == 0, err
    code, out, err = run_in_process("main.py", [*common, *CUDA, "--amp", "--amp-dtype", "fp16"])
    assert code == 0, err
    assert "RESUMING" in out
    checkpoint = load_checkpoint(tmp_path / "last.pt")
    assert checkpoint["epoch"] == 2 and checkpoint["scaler"]["scale"] > 0
    assert all(group["fused"] for group in checkpoint["optimizer"]["param_groups"])
    assert_finite(checkpoint["model"])


@pytest.fixture(scope="module")
def cuda_trained(tmp_path_factory):
    """One epoch of two on GPU 0: best.pt to predict with, last.pt to resume."""
    save_dir = tmp_path_factory.mktemp("cuda-trained")
    code, _, err = run_in_process("main.py", [*TINY_DATA, *CUDA, "--epochs", "2", "--stop-after-epochs", "1",
                                              "--save-dir", save_dir])
    assert code == 0, err
    return save_dir


def move_to_a_missing_gpu(source, target):
    """Re-save `source` with every tensor recorded as stored on a GPU this machine lacks, as a run on
    cuda:3 leaves its checkpoint for a one-GPU machine: only a load with map_location can read it."""
    tag = f"cuda:{torch.cuda.device_count()}"
    script = textwrap.dedent(f"""
        import torch, torch.serialization
        state = torch.load({str(source)!r}, map_location="cpu", weights_only=True)
        torch.serialization.register_package(0, lambda storage: {tag!r}, lambda storage, location: None)
        torch.save(state, {str(target)!r})
    """)
    result = run_subprocess([sys.executable, "-c", script])
    assert result.returncode == 0, result.stderr
    with pytest.raises(RuntimeError, match="CUDA device"):
        torch.load(target, weights_only=True)  # the crafted file really names a missing GPU
    return target


def test_a_checkpoint_from_another_gpu_index_resumes_predicts_and_exports(tmp_path, cuda_trained, recording):
    elsewhere = move_to_a_missing_gpu(cuda_trained / "last.pt", tmp_path / "from-another-gpu.pt")
    code, out, err = run_in_process("main.py", [*TINY_DATA, *CUDA, "--epochs", "2", "--resume", elsewhere,
                                                "--save-dir", tmp_path / "resumed"])
    assert code == 0, err
    assert "RESUMING" in out and load_checkpoint(tmp_path / "resumed" / "last.pt")["epoch"] == 2
    code, _, err = run_script("predict", ["--checkpoint", elsewhere, "--recording", recording, "--device", "cuda",
                                          "--out", tmp_path / "predicted"])
    assert code == 0, err
    code, _, err = run_script("export", ["--checkpoint", elsewhere, "--format", "torchscript",
                                         "--out", tmp_path / "model.pt"])
    assert code == 0, err


def read_probabilities(out_dir):
    with open(out_dir / "windows.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    columns = [name for name in rows[0] if name not in ("start_s", "end_s", "predicted", "confidence")]
    return np.array([[float(row[name]) for name in columns] for row in rows])


def test_predict_and_export_take_a_cuda_trained_checkpoint(tmp_path, cuda_trained, recording):
    best = cuda_trained / "best.pt"
    for device in ("cuda", "cpu"):
        with full_fp32():
            code, _, err = run_script("predict", ["--checkpoint", best, "--recording", recording, "--device", device,
                                                  "--out", tmp_path / device])
        assert code == 0, err
    on_gpu, on_cpu = read_probabilities(tmp_path / "cuda"), read_probabilities(tmp_path / "cpu")
    assert on_gpu.shape == on_cpu.shape and on_gpu.shape[1] == 6
    np.testing.assert_allclose(on_gpu, on_cpu, atol=1e-4, rtol=0)
    code, out, err = run_script("export", ["--checkpoint", best, "--format", "torchscript", "--out", tmp_path / "m.pt"])
    assert code == 0, err
    difference = float(re.search(r"largest logit difference (\S+)", out).group(1))
    assert difference < 1e-4


# ---------------------------------------------------------------------------
# The CUDA random stream across a kill
# ---------------------------------------------------------------------------

def test_cuda_random_state_round_trips_through_a_checkpoint(tmp_path):
    from training.checkpoint.train_state import capture_random_streams, restore_random_streams
    device = torch.device("cuda", 0)
    torch.manual_seed(3)
    torch.rand(5, device=device)  # somewhere along the stream, not at its seed
    state = capture_random_streams(device)
    assert state["cuda"].device.type == "cpu" and state["cuda"].dtype == torch.uint8
    expected = torch.rand(1000, device=device), torch.nn.functional.dropout(torch.ones(1000, device=device), 0.5)
    torch.save({"rng": [state]}, tmp_path / "rng.pt")
    torch.rand(7, device=device)
    restore_random_streams(load_checkpoint(tmp_path / "rng.pt")["rng"][0], device)
    again = torch.rand(1000, device=device), torch.nn.functional.dropout(torch.ones(1000, device=device), 0.5)
    assert all(torch.equal(a, b) for a, b in zip(expected, again, strict=True))


@pytest.fixture(scope="module")
def cuda_uninterrupted(tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("cuda-uninterrupted")
    result = run_subprocess([*RUN_CUDA, "--save-dir", save_dir], env=FP32_ENV)
    assert result.returncode == 0, result.stderr[-3000:]
    return save_dir


def kill_at_micro_batch_7(save_dir, run=RUN_CUDA):
    """Micro-batch 6 trained, its accumulation window's step not taken; last.pt is from step 3."""
    killed = run_subprocess([*run, "--save-dir", save_dir], env={**FP32_ENV, "HAR_FAULT": "kill@7"})
    assert killed.returncode == -signal.SIGKILL
    assert load_checkpoint(save_dir / "last.pt")["step"] == 3


def resume(save_dir, run=RUN_CUDA):
    resumed = run_subprocess([*run, "--save-dir", save_dir], env=FP32_ENV)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "RESUMING" in resumed.stdout
    return resumed


def test_deterministic_cuda_runs_repeat_bit_for_bit(tmp_path, cuda_uninterrupted):
    again = run_subprocess([*RUN_CUDA, "--save-dir", tmp_path], env=FP32_ENV)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "| deterministic algorithms" in again.stdout
    assert_same_state(load_checkpoint(cuda_uninterrupted / "last.pt"), load_checkpoint(tmp_path / "last.pt"))


def test_cuda_random_stream_comes_back_after_a_mid_epoch_kill(tmp_path, cuda_uninterrupted):
    """Dropout and augmentation draw from the GPU's generator: a resumed run must take it up where
    the killed one saved it, and with --deterministic give the uninterrupted run's state bit for bit."""
    reference = load_checkpoint(cuda_uninterrupted / "last.pt")
    kill_at_micro_batch_7(tmp_path / "killed")
    shutil.copytree(tmp_path / "killed", tmp_path / "control")
    control = load_checkpoint(tmp_path / "control" / "last.pt")
    control["rng"][0]["cuda"] = None  # the control: everything but the GPU's stream comes back
    torch.save(control, tmp_path / "control" / "last.pt")
    for name in ("killed", "control"):
        resume(tmp_path / name)
    assert_same_state(reference, load_checkpoint(tmp_path / "killed" / "last.pt"))
    assert largest_difference(reference, load_checkpoint(tmp_path / "control" / "last.pt")) > 1e-4


def test_a_cuda_run_killed_mid_epoch_continues_on_cpu_at_the_same_sample(tmp_path, cuda_uninterrupted):
    """Another device cannot give the same weights, but the same layout continues exactly where
    it stopped: the same samples, steps and learning rates as the uninterrupted CUDA run."""
    kill_at_micro_batch_7(tmp_path)
    assert load_checkpoint(tmp_path / "last.pt")["rng"][0]["cuda"] is not None
    resumed = resume(tmp_path, run=[*RUN, "--device", "cpu"])
    assert "weights will differ" not in resumed.stderr
    fields = ("epoch", "step", "train_samples", "lr")
    assert [[record[key] for key in fields] for record in read_metrics(tmp_path)] == [
        [record[key] for key in fields] for record in read_metrics(cuda_uninterrupted)]
    assert read_metrics(tmp_path)[-1]["memory"][0]["device"] == "cpu"


# ---------------------------------------------------------------------------
# Memory figures and the two data paths
# ---------------------------------------------------------------------------

def test_metrics_record_the_gpus_memory_every_epoch(tmp_path):
    result = run_subprocess([sys.executable, "main.py", *TINY_DATA, *CUDA, "--epochs", "2", "--save-dir", tmp_path])
    assert result.returncode == 0, result.stderr[-3000:]
    for record in read_metrics(tmp_path):
        (entry,) = record["memory"]
        assert entry["device"] == "cuda:0"
        assert 0 < entry["allocated_gib"] <= entry["peak_allocated_gib"]
        assert entry["allocated_gib"] <= entry["reserved_gib"]
    assert "(alloc/peak/reserved)" in result.stdout


def test_reset_peaks_starts_a_new_peak_window():
    from training.reporting.logger import GIB, read_memory, reset_peaks
    device = torch.device("cuda", 0)
    block = torch.empty(64 * 2**20, dtype=torch.uint8, device=device)
    del block
    allocated, peak, _ = read_memory(device)
    assert peak >= allocated + 64 * 2**20 / GIB
    reset_peaks(device)
    allocated, peak, _ = read_memory(device)
    assert peak == allocated


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_batches_are_pinned_and_equal_the_device_resident_ones(workers):
    from data.loaders import DeviceResidentLoader, ShardedSampler, make_loader
    rng = np.random.default_rng(0)
    split = SimpleNamespace(signals=rng.standard_normal((40, 9, 16)).astype(np.float32),
                            labels=(np.arange(40) % 6).astype(np.int64))
    sampler = ShardedSampler(40, seed=5)
    sampler.set_epoch(1)
    device = torch.device("cuda", 0)
    host = list(make_loader(split, 8, sampler, num_workers=workers, pin_memory=True))
    assert all(signals.is_pinned() and labels.is_pinned() for signals, labels in host)
    resident = list(DeviceResidentLoader(split, 8, sampler, device))
    assert len(host) == len(resident) == 5
    for (signals, labels), (on_device, labels_on_device) in zip(host, resident, strict=True):
        assert on_device.device == device
        assert torch.equal(signals.to(device, non_blocking=True), on_device)
        assert torch.equal(labels.to(device, non_blocking=True), labels_on_device)


def test_both_data_paths_train_the_same_on_cuda(tmp_path):
    weights, logs = {}, {}
    for path, workers in (("device", "0"), ("dataloader", "2")):
        with full_fp32():
            code, out, err = run_in_process("main.py", [*EQUIVALENT, *CUDA, "--no-amp", "--epochs", "1",
                                                        "--data-path", path, "--num-workers", workers,
                                                        "--save-dir", tmp_path / path])
        assert code == 0, err
        weights[path], logs[path] = load_checkpoint(tmp_path / path / "last.pt")["model"], out
    assert "data path: splits kept on the device" in logs["device"]
    assert "data path: DataLoader with 2 worker(s)" in logs["dataloader"]
    assert max_abs_difference(weights["device"], weights["dataloader"]) < CUDA_WEIGHT_TOLERANCE


@TWO_GPUS
def test_data_parallel_keeps_the_random_stream_of_every_replica_gpu():
    # Replicas on GPUs other than the first draw dropout from their own GPU's generator; a
    # mid-epoch resume must bring those streams back too.
    from training.checkpoint.train_state import capture_random_streams, restore_random_streams
    torch.manual_seed(0)
    saved = capture_random_streams(torch.device("cuda", 0), other_gpus=[1])
    expected = torch.rand(4, device="cuda:1")
    torch.rand(4, device="cuda:1")  # move the stream on
    restore_random_streams(saved, torch.device("cuda", 0))
    assert torch.equal(torch.rand(4, device="cuda:1"), expected)


# ---------------------------------------------------------------------------
# Compiled and CUDA-graph training, long fp16 runs, the default model's features
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def eager_fp32_epoch(tmp_path_factory):
    """One eager fp32 epoch at batch 32: what compiled and graph-replayed training must reproduce."""
    save_dir = tmp_path_factory.mktemp("eager")
    with full_fp32():
        code, _, err = run_in_process("main.py", [*EQUIVALENT, *CUDA, "--no-amp", "--epochs", "1",
                                                  "--no-cuda-graphs", "--save-dir", save_dir])
    assert code == 0, err
    return load_checkpoint(save_dir / "last.pt")


@pytest.mark.parametrize("flags", [
    ["--compile"],
    ["--compile-mode", "reduce-overhead"],  # CUDA graphs recorded once, replayed every step
    ["--compile", "--batch-size", "16", "--grad-accum-steps", "2"],  # 2 x 16 per step is the same 32
], ids=["compile", "cuda-graphs", "compile-accumulating"])
def test_compiled_and_graph_replayed_training_give_the_eager_weights(tmp_path, eager_fp32_epoch, flags):
    with full_fp32():
        code, _, err = run_in_process("main.py", [*EQUIVALENT, *CUDA, "--no-amp", "--epochs", "1", *flags,
                                                  "--save-dir", tmp_path])
    assert code == 0, err
    checkpoint = load_checkpoint(tmp_path / "last.pt")
    assert checkpoint["step"] == eager_fp32_epoch["step"] == STEPS_PER_EPOCH
    assert max_abs_difference(checkpoint["model"], eager_fp32_epoch["model"]) < CUDA_WEIGHT_TOLERANCE


# Every part a recorded step holds: augmentations, dropout, BatchNorm, clipping, AdamW, the weight
# average. Batch 24 leaves each epoch a last batch of 16 (23 steps), which runs eagerly on the same optimizer.
GRAPH_RUN = [*TINY_DATA, *CUDA, "--no-amp", "--augment", "rotate,scale,jitter,shift", "--ema-decay", "0.9",
             "--dropout", "0.1", "--batch-size", "24", "--lr-scaling", "none", "--epochs", "2"]
GRAPH_STEPS = 2 * 23


@pytest.mark.parametrize("model", ["cnn1d", "minirocket"])  # minirocket: the default's head on its feature pool
def test_whole_step_graphs_give_the_eager_weights_averages_and_moments(tmp_path, model):
    """A replay draws the augmentations' and dropout's numbers from the same generator offsets as the eager
    step, and the warm-up before recording leaves no trace in weights, moments or random streams. Both
    sides use the same kernels (--deterministic): cuDNN's autotuning may pick other convolution algorithms
    per process, and AdamW turns their last-bit differences in near-zero gradients into differences of
    the LR's size (7e-4 after 46 steps in one such pair of runs on an H200)."""
    runs = {}
    # The tiny split's head would be solved by ridge (--head-fit auto), in no steps to record.
    head = ["--head-fit", "adamw"] if model == "minirocket" else []
    for name, flag in {"eager": "--no-cuda-graphs", "graphs": "--cuda-graphs"}.items():
        done = run_subprocess([sys.executable, "main.py", *GRAPH_RUN, "--model", model, *head, "--no-resume",
                               "--deterministic", flag, "--save-dir", tmp_path / name], env=FP32_ENV)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "runs eagerly" not in done.stderr and "recording the step failed" not in done.stderr
        runs[name] = load_checkpoint(tmp_path / name / "last.pt")
    assert runs["graphs"]["step"] == runs["eager"]["step"] == GRAPH_STEPS
    assert largest_difference(runs["eager"], runs["graphs"]) < CUDA_WEIGHT_TOLERANCE
    assert [record["lr"] for record in read_metrics(tmp_path / "graphs")] == pytest.approx(
        [record["lr"] for record in read_metrics(tmp_path / "eager")], rel=1e-6)  # the graph's LR is a float32 scalar


def test_a_graph_replayed_run_killed_mid_epoch_resumes_bit_for_bit(tmp_path):
    run = [sys.executable, "main.py", *GRAPH_RUN, "--save-every-steps", "5", "--cuda-graphs", "--deterministic"]
    whole = run_subprocess([*run, "--save-dir", tmp_path / "whole"], env=FP32_ENV)
    assert whole.returncode == 0, whole.stderr[-3000:]
    killed = run_subprocess([*run, "--save-dir", tmp_path / "killed"], env={**FP32_ENV, "HAR_FAULT": "kill@12"})
    assert killed.returncode == -signal.SIGKILL
    assert load_checkpoint(tmp_path / "killed" / "last.pt")["step"] == 10
    resume(tmp_path / "killed", run=run)
    assert_same_state(load_checkpoint(tmp_path / "whole" / "last.pt"), load_checkpoint(tmp_path / "killed" / "last.pt"))


def test_cuda_graphs_under_fp16_fall_back_to_the_eager_step_with_a_warning(tmp_path):
    code, _, err = run_in_process("main.py", [*TINY_DATA, *CUDA, "--amp", "--amp-dtype", "fp16", "--cuda-graphs",
                                              "--epochs", "1", "--save-dir", tmp_path])
    assert code == 0, err
    assert "--cuda-graphs: the step runs eagerly under fp16" in err


def test_fp16_keeps_a_batchnorm_model_finite_over_many_steps(tmp_path):
    epochs = 8
    code, _, err = run_in_process("main.py", [*TINY_DATA, *CUDA, "--amp", "--amp-dtype", "fp16",
                                              "--epochs", str(epochs), "--save-dir", tmp_path])
    assert code == 0, err
    checkpoint = load_checkpoint(tmp_path / "last.pt")
    assert checkpoint["step"] == epochs * STEPS_PER_EPOCH
    assert_finite(checkpoint["model"])  # the BatchNorm running statistics are in it
    assert_finite(checkpoint["ema"]["weights"])
    variances = [tensor for name, tensor in checkpoint["model"].items() if name.endswith("running_var")]
    assert variances and all((tensor > 0).all() for tensor in variances)
    assert checkpoint["scaler"]["scale"] >= 1.0  # a scale that kept halving would mean every step overflowed
    losses = [record["train_loss"] for record in read_metrics(tmp_path)]
    assert all(math.isfinite(loss) for loss in losses) and losses[-1] < losses[0]


def test_minirocket_features_on_cuda_equal_the_cpus_under_every_precision():
    from models import build_model
    torch.manual_seed(0)
    windows = torch.randn(1024, 9, 128).cumsum(dim=2) * 0.1
    model = build_model("minirocket", 9, 6).eval()
    model.fit(windows)
    expected = model.features(windows)
    fitted_on_gpu = build_model("minirocket", 9, 6).eval().cuda()
    fitted_on_gpu.fit(windows.cuda())
    assert torch.allclose(fitted_on_gpu.biases.cpu(), model.biases, rtol=1e-5, atol=1e-5)
    model.cuda()
    for dtype in (None, torch.bfloat16, torch.float16):
        with torch.autocast("cuda", dtype=dtype or torch.float16, enabled=dtype is not None):
            features = model.features(windows.cuda())
        assert features.dtype == torch.float32
        # Sums taken in another order may flip the rare comparison that sits on its bias; TF32 or
        # half-precision inputs flip several percent of the features.
        flipped = ((features.cpu() - expected).abs() > 1e-4).float().mean().item()
        assert flipped < 1e-3, (dtype, flipped)
