"""Runs that meet trouble: stop signals, a dead or stuck rank, several torchrun agents, a NaN loss."""
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

from conftest import ONE_THREAD, REPO, TINY_DATA, load_checkpoint, requires_cuda, run_in_process, run_subprocess
from training.errors import EXIT_DIVERGED, EXIT_PREEMPTED, EXIT_RANK_LOST

SINGLE = [sys.executable, "main.py", *TINY_DATA, "--epochs", "4", "--batch-size", "16"]
# SINGLE runs on one thread (conftest.ONE_THREAD): the reference and the stopped and resumed run agree on it.
DDP_FLAGS = ["main_multi_gpu.py", "--multi-gpu", "ddp", "--device", "cpu", *TINY_DATA, "--epochs", "2",
             "--batch-size", "16", "--save-every-steps", "2"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def assert_same_weights(expected_dir, actual_dir):
    expected, actual = load_checkpoint(expected_dir / "last.pt"), load_checkpoint(actual_dir / "last.pt")
    assert actual["step"] == expected["step"]
    for name, tensor in expected["model"].items():
        assert torch.equal(tensor, actual["model"][name]), name


def start_and_signal(command, save_dir, signal_number, env=None):
    """Start `command` (with `env` added to this environment), send `signal_number` once its first epoch
    is logged; (exit code, stdout)."""
    process = subprocess.Popen([str(part) for part in command], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, env={**os.environ, **(env or {})})
    deadline = time.monotonic() + 120
    while not (save_dir / "metrics.jsonl").exists() and time.monotonic() < deadline:
        if process.poll() is not None:
            break
        time.sleep(0.02)
    process.send_signal(signal_number)
    out, _ = process.communicate(timeout=120)
    return process.returncode, out


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def single_reference(tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("single_reference")
    result = run_subprocess([*SINGLE, "--save-dir", save_dir], env=ONE_THREAD)
    assert result.returncode == 0, result.stderr
    return save_dir


@pytest.fixture(scope="module")
def ddp_reference(tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("ddp_reference")
    result = run_subprocess([*TORCHRUN, "--standalone", "--nproc-per-node=2", *DDP_FLAGS, "--save-dir", save_dir])
    assert result.returncode == 0, result.stderr
    return save_dir


def test_stop_signal_saves_after_the_step_and_resumes_exactly(single_reference, tmp_path):
    code, out = start_and_signal([*SINGLE, "--save-dir", tmp_path], tmp_path, signal.SIGUSR1, env=ONE_THREAD)
    assert code == EXIT_PREEMPTED, out
    assert "received SIGUSR1: stopped after step" in out and "Traceback" not in out
    stopped = load_checkpoint(tmp_path / "last.pt")
    assert 34 <= stopped["step"] < 4 * 34  # after the first epoch, before the end
    resumed = run_subprocess([*SINGLE, "--save-dir", tmp_path], env=ONE_THREAD)
    assert resumed.returncode == 0, resumed.stderr
    assert_same_weights(single_reference, tmp_path)


def test_sigterm_to_the_launcher_reaches_every_rank(tmp_path):
    """SIGTERM to main_multi_gpu.py's own torchrun: it passes the signal on, both ranks stop at
    the same step, rank 0 saves, and the launcher exits 75."""
    command = [sys.executable, *DDP_FLAGS, "--nproc-per-node", "2", "--epochs", "30", "--save-every-steps", "0",
               "--save-dir", tmp_path]
    code, out = start_and_signal(command, tmp_path, signal.SIGTERM)
    assert code == EXIT_PREEMPTED, out
    assert "received SIGTERM: stopped after step" in out
    assert "Traceback" not in out
    saved = load_checkpoint(tmp_path / "last.pt")
    assert saved["step"] >= 17
    # The launcher's own line says what is on disk, read from it.
    said = f"launcher received SIGTERM: the workers saved a checkpoint ({tmp_path / 'last.pt'}: step {saved['step']}, "
    assert said in out


def test_torchrun_restarts_a_dead_rank_and_the_run_ends_as_uninterrupted(ddp_reference, tmp_path):
    result = run_subprocess([*TORCHRUN, "--standalone", "--nproc-per-node=2", "--max-restarts=1", *DDP_FLAGS,
                             "--save-dir", tmp_path], env={"HAR_FAULT": "kill@11:rank=1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "RESUMING" in result.stdout  # the restarted group picked up the mid-epoch checkpoint
    assert_same_weights(ddp_reference, tmp_path)


def test_two_torchrun_agents_train_like_one_agent_with_two_processes(ddp_reference, tmp_path):
    port = free_port()
    agent = [*TORCHRUN, "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
             f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=har-two-agents", *DDP_FLAGS, "--save-dir", tmp_path]
    # torchrun sets one thread per process only when it starts several; match the reference.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    agents = [subprocess.Popen([str(part) for part in agent], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, env=env) for _ in range(2)]
    outputs = [process.communicate(timeout=300)[0] for process in agents]
    assert [process.returncode for process in agents] == [0, 0], outputs[0][-2000:] + outputs[1][-2000:]
    assert_same_weights(ddp_reference, tmp_path)


def test_a_stuck_rank_ends_in_a_timeout_message(tmp_path):
    started = time.monotonic()
    result = run_subprocess([sys.executable, *DDP_FLAGS, "--nproc-per-node", "2", "--dist-timeout", "5",
                             "--save-dir", tmp_path], env={"HAR_FAULT": "hang@5:rank=1"}, timeout=180)
    assert result.returncode == EXIT_RANK_LOST, result.stderr[-3000:]
    assert "waited more than --dist-timeout 5 s" in result.stderr
    assert time.monotonic() - started < 120


@pytest.mark.parametrize("save_every_steps, last_good_step", [(0, 17), (1, 20)])
def test_nonfinite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, save_every_steps, last_good_step):
    """Micro-batch 20 is NaN: step 21 (epoch 2) is the first bad one, and nothing from it is saved."""
    result = run_subprocess([sys.executable, "main.py", *TINY_DATA, "--epochs", "3", "--save-every-steps",
                             save_every_steps, "--save-dir", tmp_path], env={"HAR_FAULT": "nan@20", **ONE_THREAD})
    assert result.returncode == EXIT_DIVERGED, result.stderr[-3000:]
    assert "NaN/inf at step 21 (epoch 2)" in result.stderr and "Traceback" not in result.stderr
    last = load_checkpoint(tmp_path / "last.pt")
    assert last["step"] == last_good_step
    assert all(torch.isfinite(tensor).all() for tensor in last["model"].values() if tensor.is_floating_point())


def test_weights_that_overflow_under_a_finite_loss_are_never_saved(tmp_path):
    """At --lr 1e6 over 6 steps BatchNorm's running variance overflows while the loss stays finite: the
    save refuses the weights, and the earlier run's files in the folder (--no-resume) stay as they were."""
    flags = [*TINY_DATA, "--synthetic-windows-per-subject", "20", "--batch-size", "64", "--epochs", "1",
             "--save-dir", tmp_path]
    assert run_in_process("main.py", flags)[0] == 0
    before = {path.name: path.read_bytes() for path in tmp_path.iterdir() if path.suffix in (".pt", ".yaml")}
    code, _, err = run_in_process("main.py", [*flags, "--lr", "1e6", "--no-resume"])
    assert code == EXIT_DIVERGED and "Traceback" not in err, err
    assert "the weights became NaN/inf (model." in err and "is an earlier run's" in err
    assert {name: (tmp_path / name).read_bytes() for name in before} == before
    # Resumed from another folder: this folder holds nothing of it.
    code, _, err = run_in_process("main.py", [*flags[:-1], tmp_path / "elsewhere", "--resume", tmp_path / "last.pt",
                                              "--epochs", "3", "--lr", "1e6"])
    assert code == EXIT_DIVERGED and "nothing was saved" in err, err


def test_a_nonfinite_loss_on_one_rank_stops_every_rank_and_is_never_saved(tmp_path):
    """Rank 1's micro-batch 20 is NaN: step 21 (epoch 2) is named, though ranks learn of it a check-in later,
    and the saves every 2 steps in between check the losses themselves, so the last one is step 20's."""
    result = run_subprocess([sys.executable, *DDP_FLAGS, "--nproc-per-node", "2", "--epochs", "3", "--log-interval",
                             "3", "--save-dir", tmp_path], env={"HAR_FAULT": "nan@20:rank=1"})
    assert result.returncode == EXIT_DIVERGED, result.stderr[-3000:]
    assert result.stderr.count("NaN/inf at step 21 (epoch 2)") == 1  # said once, by local rank 0
    last = load_checkpoint(tmp_path / "last.pt")
    assert last["step"] == 20
    assert all(torch.isfinite(tensor).all() for tensor in last["model"].values() if tensor.is_floating_point())


@requires_cuda
def test_fp16_grad_scaler_skips_a_nonfinite_step_and_goes_on(tmp_path):
    result = run_subprocess([sys.executable, "main.py", *TINY_DATA, "--epochs", "2", "--device", "cuda", "--amp",
                             "--amp-dtype", "fp16", "--save-dir", tmp_path], env={"HAR_FAULT": "nan@20"})
    assert result.returncode == 0, result.stderr[-3000:]
    last = load_checkpoint(tmp_path / "last.pt")
    assert all(torch.isfinite(tensor).all() for tensor in last["model"].values() if tensor.is_floating_point())


def test_a_window_with_a_nonfinite_loss_leaves_batchnorm_statistics_as_they_were():
    # Under fp16 the GradScaler skips such a step; the watch reads the skip from the scaler and undoes
    # what the forward passes did to the running statistics. A CPU GradScaler decides the same way.
    from models import build_model
    from training.loop.step import SkippedSteps
    torch.manual_seed(0)
    model = build_model("cnn1d", 9, 6).train()
    optimizer = torch.optim.AdamW(model.parameters())
    scaler = torch.amp.GradScaler("cpu")
    guard = SkippedSteps(model, scaler)
    batch = torch.randn(8, 9, 128)
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}

    one_window(model, optimizer, scaler, guard, batch, batch * float("nan"))
    after = model.state_dict()
    assert all(torch.equal(before[name], after[name]) for name, tensor in after.items() if tensor.is_floating_point())

    one_window(model, optimizer, scaler, guard, batch)
    moved = model.state_dict()
    assert any(not torch.equal(before[name], moved[name]) for name in guard_buffer_names(model))
    assert all(torch.isfinite(moved[name]).all() for name in guard_buffer_names(model))


def one_window(model, optimizer, scaler, watch, *batches):
    """One accumulation window as TrainStep takes it under a GradScaler."""
    watch.open_window()
    for signals in batches:
        loss = torch.nn.functional.cross_entropy(model(signals), torch.zeros(len(signals), dtype=torch.long))
        scaler.scale(loss / len(batches)).backward()
    watch.before_step()
    scaler.step(optimizer)
    scaler.update()
    watch.after_step()
    optimizer.zero_grad(set_to_none=True)


def test_the_watch_counts_the_steps_the_scaler_skips_in_a_row():
    from models import build_model
    from training.loop.step import SkippedSteps
    torch.manual_seed(0)
    model = build_model("cnn1d", 9, 6).train()
    optimizer = torch.optim.AdamW(model.parameters())
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
    watch = SkippedSteps(model, scaler)
    good, bad = torch.randn(8, 9, 128), torch.full((8, 9, 128), float("nan"))
    for batch in (bad, bad, bad, good, bad, bad):
        one_window(model, optimizer, scaler, watch, batch)
    assert watch.longest_run() == 3 and int(watch.run) == 2
    assert scaler.get_scale() == 2.0 ** 16 / 2 ** 5  # the scaler's own record: five skips


def test_a_run_whose_every_step_the_grad_scaler_skips_stops_as_diverged(tmp_path, monkeypatch):
    """From micro-batch 20 on every batch is NaN: under a GradScaler every step from 21 is skipped, and
    the run stops at the first check-in after 20 skips in a row (exit 3 through the entry point).
    CPU runs refuse --amp-dtype fp16, so the step gets a CPU GradScaler, which decides as fp16's does."""
    import dataclasses

    from training.config.cli import parse_config
    from training.distributed.strategy import make_strategy
    from training.errors import TrainingDiverged
    from training.loop.epochs import fit
    from training.loop.step import MAX_SKIPPED_STEPS, SkippedSteps
    from training.trainer import Trainer
    config = parse_config([*TINY_DATA, "--epochs", "3", "--save-dir", str(tmp_path), "--no-resume"])
    trainer = Trainer.build(config, make_strategy(config), quiet=True)
    scaler = torch.amp.GradScaler("cpu")
    trainer.step = dataclasses.replace(trainer.step, grad_scaler=scaler, skips=SkippedSteps(trainer.model, scaler))
    monkeypatch.setenv("HAR_FAULT", "nanfrom@20")
    with pytest.raises(TrainingDiverged, match=f"skipped {MAX_SKIPPED_STEPS} optimizer steps in a row"):
        fit(trainer)
    last = load_checkpoint(tmp_path / "last.pt")
    assert last["step"] == 34  # epoch 2's end: 14 skips in a row, not yet 20; the check-in at step 40 stops
    assert all(torch.isfinite(tensor).all() for tensor in last["model"].values() if tensor.is_floating_point())


@requires_cuda
def test_fp16_run_whose_every_step_overflows_exits_3(tmp_path):
    result = run_subprocess([sys.executable, "main.py", *TINY_DATA, "--epochs", "3", "--device", "cuda", "--amp",
                             "--amp-dtype", "fp16", "--save-dir", tmp_path], env={"HAR_FAULT": "nanfrom@20"})
    assert result.returncode == EXIT_DIVERGED, result.stderr[-3000:]
    assert "optimizer steps in a row" in result.stderr and "Traceback" not in result.stderr
    last = load_checkpoint(tmp_path / "last.pt")
    assert all(torch.isfinite(tensor).all() for tensor in last["model"].values() if tensor.is_floating_point())


def guard_buffer_names(model):
    return [name for name, buffer in model.named_buffers() if buffer.is_floating_point()]


@pytest.mark.parametrize("error, says", [
    (torch.distributed.DistStoreError("Socket Timeout"), "waited more than --dist-timeout 5 s"),
    (torch.distributed.DistNetworkError("failed to recv, got 0 bytes"), "lost its connection"),
    (torch.distributed.DistBackendError("NCCL error in: ProcessGroupNCCL.cpp, remote process exited"),
     "lost its connection"),
    (torch.distributed.DistBackendError("Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7)"),
     "waited more than --dist-timeout 5 s"),
    # gloo raises plain RuntimeErrors (torch 2.13): its wording, as the stuck- and dead-rank runs above show
    (RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 5000ms for recv operation"),
     "waited more than --dist-timeout 5 s"),
    (RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:3308: Connection reset by peer"),
     "lost its connection"),
], ids=["store-timeout", "network", "nccl-error", "nccl-watchdog", "gloo-timeout", "gloo-reset"])
def test_a_lost_rank_is_told_in_one_line(error, says):
    from training.distributed.lost_rank import explain_lost_rank
    from training.errors import RankLost
    with pytest.raises(RankLost, match=says):
        explain_lost_rank(error, rank=1, timeout_s=5)


def test_other_runtime_errors_are_not_taken_for_a_lost_rank():
    from training.distributed.lost_rank import explain_lost_rank
    assert explain_lost_rank(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), 1, 5) is None
