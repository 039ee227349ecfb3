"""The device-resident data path yields exactly the DataLoader path's batches, in the same order."""
import numpy as np
import pytest
import torch

from conftest import TINY_DATA, load_checkpoint, run_in_process
from data.loaders import DeviceResidentLoader, ShardedSampler, keep_on_device, make_loader, split_bytes
from data.splits import Split


def make_split(num_samples, seed=0):
    generator = np.random.default_rng(seed)
    return Split(generator.standard_normal((num_samples, 9, 128)).astype(np.float32),
                 generator.integers(0, 6, num_samples).astype(np.int64),
                 generator.integers(1, 31, num_samples).astype(np.int64))


def batches(loader):
    return [(signals.clone(), labels.clone()) for signals, labels in loader]


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("shuffle, pad", [(True, True), (False, False)])
@pytest.mark.parametrize("start", [0, 30])
def test_same_batches_as_the_dataloader_for_every_rank(world_size, shuffle, pad, start):
    split = make_split(101)
    for rank in range(world_size):
        for epoch in (0, 3):
            samplers = [ShardedSampler(len(split), world_size, rank, shuffle=shuffle, seed=5, pad=pad)
                        for _ in range(2)]
            for sampler in samplers:
                sampler.set_epoch(epoch, start=start)
            resident = DeviceResidentLoader(split, 8, samplers[0], torch.device("cpu"))
            regular = make_loader(split, 8, samplers[1])
            assert len(resident) == len(regular)
            got, expected = batches(resident), batches(regular)
            assert len(got) == len(expected) > 0
            for (signals, labels), (want_signals, want_labels) in zip(got, expected, strict=True):
                assert torch.equal(signals, want_signals) and torch.equal(labels, want_labels)


def test_epochs_differ_so_the_comparison_can_fail():
    split = make_split(64)
    sampler = ShardedSampler(len(split), seed=5)
    loader = DeviceResidentLoader(split, 8, sampler, torch.device("cpu"))
    sampler.set_epoch(0)
    first = batches(loader)
    sampler.set_epoch(1)
    second = batches(loader)
    assert not torch.equal(first[0][1], second[0][1]) or not torch.equal(first[0][0], second[0][0])


def test_auto_choice():
    cpu = torch.device("cpu")
    assert keep_on_device("auto", 0, cpu, split_bytes(make_split(10)))
    assert not keep_on_device("auto", 2, cpu, 0)
    assert not keep_on_device("dataloader", 0, cpu, 0)
    assert keep_on_device("device", 2, cpu, 0)


def test_training_on_either_path_gives_identical_weights(tmp_path):
    weights = {}
    for path in ("device", "dataloader"):
        code, out, err = run_in_process("main.py", [*TINY_DATA, "--epochs", "2", "--data-path", path,
                                                    "--save-dir", tmp_path / path])
        assert code == 0, err
        assert ("kept on the device" in out) == (path == "device")
        weights[path] = load_checkpoint(tmp_path / path / "last.pt")["model"]
    for name, tensor in weights["device"].items():
        assert torch.equal(tensor, weights["dataloader"][name]), name
