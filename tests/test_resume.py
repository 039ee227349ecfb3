"""Exact resume: runs killed at chosen points and resumed end bit-for-bit where uninterrupted runs end."""
import json
import signal
import sys

import pytest
import torch

from conftest import ONE_THREAD, TINY_DATA, load_checkpoint, read_metrics, run_in_process, run_subprocess
from data.loaders import ShardedSampler, epoch_order

# 544 windows at 16 per micro-batch and 2 micro-batches per step: 34 micro-batches and 17
# optimizer steps per epoch, with a checkpoint after every step.
# Augmentation and the weight average are on: their random draws and state must come back too.
RUN = [sys.executable, "main.py", *TINY_DATA, "--epochs", "2", "--batch-size", "16", "--grad-accum-steps", "2",
       "--save-every-steps", "1", "--keep-last", "2", "--augment", "rotate,scale,jitter,shift", "--ema-decay", "0.9"]
BATCHES_PER_EPOCH = 34
# Every run computes on one thread (conftest.ONE_THREAD), in a child or in this process: the runs compared
# bit for bit agree on it.
pytestmark = pytest.mark.usefixtures("one_thread")


def assert_same_state(expected, actual):
    """Every weight, buffer and optimizer tensor equal bit for bit, and the same step count."""
    assert actual["step"] == expected["step"] and actual["epoch"] == expected["epoch"]
    for name, tensor in expected["model"].items():
        assert torch.equal(tensor, actual["model"][name]), name
    assert expected["ema"]["updates"] == actual["ema"]["updates"]
    for name, tensor in expected["ema"]["weights"].items():
        assert torch.equal(tensor, actual["ema"]["weights"][name]), ("ema", name)
    for index, moments in expected["optimizer"]["state"].items():
        for key, tensor in moments.items():
            assert torch.equal(tensor, actual["optimizer"]["state"][index][key]), (index, key)


def report_of(save_dir):
    report = json.loads((save_dir / "test_report.json").read_text())
    report.pop("checkpoint")  # the path differs
    return report


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("uninterrupted")
    result = run_subprocess([*RUN, "--save-dir", save_dir], env=ONE_THREAD)
    assert result.returncode == 0, result.stderr
    return save_dir


@pytest.mark.parametrize("fault", [
    "kill@7",  # inside an accumulation window: micro-batch 6 was trained, its step not taken
    f"kill@{BATCHES_PER_EPOCH}",  # right after the epoch boundary (validated and saved)
    f"kill@{BATCHES_PER_EPOCH + 1}",  # inside the first window of the second epoch
    "kill@save:5",  # halfway through writing a checkpoint: the temporary file is left behind
])
def test_killed_run_resumes_bit_for_bit(uninterrupted, tmp_path, fault):
    killed = run_subprocess([*RUN, "--save-dir", tmp_path], env={"HAR_FAULT": fault, **ONE_THREAD})
    assert killed.returncode == -signal.SIGKILL
    assert load_checkpoint(tmp_path / "last.pt")["step"] < 34  # it really stopped early
    resumed = run_subprocess([*RUN, "--save-dir", tmp_path], env=ONE_THREAD)
    assert resumed.returncode == 0, resumed.stderr
    assert "RESUMING" in resumed.stdout
    assert_same_state(load_checkpoint(uninterrupted / "last.pt"), load_checkpoint(tmp_path / "last.pt"))
    assert report_of(tmp_path) == report_of(uninterrupted)
    assert not list(tmp_path.glob(".*.tmp*")), "a temporary checkpoint file was left behind"


def test_resume_without_saved_random_state_would_differ(uninterrupted, tmp_path):
    """The control: mid-epoch resume that reseeds instead of restoring RNG gives other weights,
    so the bit-for-bit test above can fail."""
    killed = run_subprocess([*RUN, "--save-dir", tmp_path], env={"HAR_FAULT": "kill@12", **ONE_THREAD})
    assert killed.returncode == -signal.SIGKILL
    checkpoint = load_checkpoint(tmp_path / "last.pt")
    checkpoint["rng"] = []  # no per-rank states: the resume cannot be exact and says so
    torch.save(checkpoint, tmp_path / "last.pt")
    resumed = run_subprocess([*RUN, "--save-dir", tmp_path], env=ONE_THREAD)
    assert resumed.returncode == 0, resumed.stderr
    assert "weights will differ" in resumed.stderr
    final, reference = load_checkpoint(tmp_path / "last.pt"), load_checkpoint(uninterrupted / "last.pt")
    assert any(not torch.equal(final["model"][k], reference["model"][k]) for k in reference["model"])


def test_keep_last_prunes_numbered_checkpoints(uninterrupted):
    numbered = sorted(path.name for path in uninterrupted.glob("step-*.pt"))
    assert numbered == ["step-00000033.pt", "step-00000034.pt"]
    assert load_checkpoint(uninterrupted / "step-00000033.pt")["step"] == 33
    assert (uninterrupted / "best.pt").is_file()


def test_corrupt_last_checkpoint_falls_back_to_newest_valid(tmp_path):
    first = run_subprocess([*RUN, "--save-dir", tmp_path], env={"HAR_FAULT": "kill@20", **ONE_THREAD})
    assert first.returncode == -signal.SIGKILL
    newest_numbered = load_checkpoint(tmp_path / "step-00000010.pt")
    # New files, as a partial copy would leave.
    truncated = (tmp_path / "last.pt").read_bytes()[:1000]
    for name, content in (("last.pt", truncated), ("step-00000010.pt", b"not a checkpoint")):
        (tmp_path / name).unlink()
        (tmp_path / name).write_bytes(content)
    resumed = run_subprocess([*RUN, "--save-dir", tmp_path, "--stop-after-epochs", "1"], env=ONE_THREAD)
    assert resumed.returncode == 0, resumed.stderr
    assert "last.pt is unreadable or truncated" in resumed.stderr
    assert "step-00000010.pt is unreadable or truncated" in resumed.stderr
    assert "RESUMING from" in resumed.stdout and "step-00000009.pt" in resumed.stdout
    assert "Traceback" not in resumed.stderr
    assert newest_numbered["step"] == 10


def test_all_checkpoints_unreadable_is_one_line_error(tmp_path):
    (tmp_path / "last.pt").write_bytes(b"\x00" * 64)
    (tmp_path / "best.pt").write_bytes(b"")
    result = run_subprocess([*RUN, "--save-dir", tmp_path])
    assert result.returncode == 2
    assert "no readable checkpoint" in result.stderr and "--no-resume" in result.stderr
    assert "Traceback" not in result.stderr
    assert (tmp_path / "last.pt").read_bytes() == b"\x00" * 64  # left for the user to inspect


@pytest.mark.parametrize("old_world, new_world", [(2, 1), (2, 3), (1, 2), (4, 3), (3, 2)])
@pytest.mark.parametrize("stopped_after_batches", [1, 5, 8])
def test_position_resume_with_another_world_size_sees_each_sample_once(old_world, new_world,
                                                                        stopped_after_batches):
    num_samples, batch, epoch, seed = 160, 4, 3, 7
    before = [ShardedSampler(num_samples, old_world, rank, seed=seed) for rank in range(old_world)]
    seen = []
    for sampler in before:
        sampler.set_epoch(epoch)
        seen.append(sampler.indices()[:stopped_after_batches * batch])
    position = stopped_after_batches * batch * old_world  # what a mid-epoch checkpoint records
    after = [ShardedSampler(num_samples, new_world, rank, seed=seed) for rank in range(new_world)]
    for sampler in after:
        sampler.set_epoch(epoch, start=position)
        seen.append(sampler.indices())
    counts = torch.bincount(torch.cat(seen), minlength=num_samples)
    padding = len(after[0]) * new_world - (num_samples - position)
    assert counts.sum() == num_samples + padding
    assert (counts >= 1).all() and (counts > 1).sum() <= padding  # only the end-of-epoch padding repeats
    assert torch.equal(torch.cat(seen[:old_world]).sort().values,
                       epoch_order(num_samples, seed, epoch)[:position].sort().values)


def test_same_world_position_resume_matches_uninterrupted_shards():
    for world in (1, 2, 3):
        for rank in range(world):
            whole = ShardedSampler(50, world, rank, seed=1)
            whole.set_epoch(2)
            resumed = ShardedSampler(50, world, rank, seed=1)
            resumed.set_epoch(2, start=4 * world)
            assert torch.equal(whole.indices()[4:], resumed.indices())


def test_ddp_run_resumed_on_one_process_continues_at_the_same_sample(tmp_path):
    """Two ranks killed mid-epoch, resumed by one process: the epoch still trains on every
    training sample exactly once (544 windows, no padding with 2 ranks)."""
    ddp = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "main_multi_gpu.py", "--multi-gpu", "ddp", "--device", "cpu", *TINY_DATA, "--epochs", "1",
           "--batch-size", "16", "--save-every-steps", "1", "--save-dir", tmp_path]
    killed = run_subprocess(ddp, env={"HAR_FAULT": "kill@5:rank=1"})
    # The planted kill, not another failure (one run under a loaded machine left no checkpoint and
    # said nothing of why).
    assert killed.returncode != 0 and "Signal 9 (SIGKILL)" in killed.stderr, killed.stderr[-3000:]
    checkpoint = load_checkpoint(tmp_path / "last.pt")
    assert checkpoint["epoch"] == 0 and checkpoint["epoch_position"] == 5 * 16 * 2
    single = run_subprocess([sys.executable, "main.py", *TINY_DATA, "--epochs", "1", "--batch-size", "16",
                             "--save-dir", tmp_path], env=ONE_THREAD)
    assert single.returncode == 0, single.stderr
    assert "continues at sample 160" in single.stderr
    assert read_metrics(tmp_path)[-1]["train_samples"] == 544


def test_a_size_flag_given_at_its_default_resumes_a_run_that_did_not_give_it(tmp_path):
    flags = ["--dataset", "synthetic", "--synthetic-windows-per-subject", "8", "--model", "transformer",
             "--save-dir", tmp_path]
    code, _, err = run_in_process("main.py", [*flags, "--epochs", "2", "--stop-after-epochs", "1"])
    assert code == 0, err
    code, out, err = run_in_process("main.py", [*flags, "--epochs", "2", "--width", "64", "--ffn", "128"])
    assert code == 0, err
    assert "RESUMING" in out
    code, _, err = run_in_process("main.py", [*flags, "--epochs", "2", "--width", "32"])
    assert code == 2 and "width 64 (this run: 32)" in err


def test_a_resumed_run_reads_its_data_and_checkpoint_once(tmp_path, monkeypatch):
    """One build path: run_inputs.py reads the data and the checkpoint to resume, and the build uses
    what it read instead of reading them again."""
    from data import synthetic
    from training.checkpoint import files
    flags = [*TINY_DATA, "--epochs", "2", "--stop-after-epochs", "1", "--save-dir", tmp_path]
    assert run_in_process("main.py", flags)[0] == 0
    reads = {"data": 0, "checkpoint": 0}

    def counted(kind, read):
        def wrapper(*args, **kwargs):
            reads[kind] += 1
            return read(*args, **kwargs)
        return wrapper
    monkeypatch.setattr(synthetic, "generate", counted("data", synthetic.generate))  # TINY_DATA's windows
    monkeypatch.setattr(files, "load_resumable", counted("checkpoint", files.load_resumable))
    code, out, err = run_in_process("main.py", flags)
    assert code == 0, err
    assert "RESUMING from" in out
    assert reads == {"data": 1, "checkpoint": 1}


def test_a_run_rewound_to_an_earlier_checkpoint_keeps_one_metrics_line_an_epoch(tmp_path):
    flags = [*TINY_DATA, "--synthetic-windows-per-subject", "8", "--epochs", "3", "--save-dir", tmp_path]
    code, _, err = run_in_process("main.py", flags)
    assert code == 0, err
    earlier = min(tmp_path.glob("step-*.pt"))  # the oldest kept: the end of an epoch before the last
    epoch = load_checkpoint(earlier)["epoch"]
    assert epoch < 3
    finished = read_metrics(tmp_path)
    code, out, err = run_in_process("main.py", [*flags, "--resume", earlier])
    assert code == 0, err
    assert "RESUMING" in out
    again = read_metrics(tmp_path)
    assert [record["epoch"] for record in again] == [1, 2, 3]  # the later epochs trained again, logged once
    assert again[:epoch] == finished[:epoch]
