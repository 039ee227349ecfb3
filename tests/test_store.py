"""The window store: built from windows and from raw recordings as predict.py cuts them, trained from
without holding it in memory, resumed exactly, split over ranks without overlap, and refused in one
line when it is damaged."""
import errno
import json
import math
import re
import signal
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from conftest import ONE_THREAD, load_checkpoint, run_in_process, run_subprocess
from data import synthetic
from data.loaders import (
    STREAM_BLOCK,
    BlockShuffledSampler,
    LoaderRequest,
    StoreStreamLoader,
    read_batch,
    split_loaders,
    window_shape,
)
from data.store import StoreSplit, WindowStore
from data.uci_har import CLASS_NAMES, SIGNAL_NAMES
from inference_fixtures import synthetic_stream
from outputs.safety import OutputRefused
from test_bad_input import assert_refused
from training.config.settings import RunConfig

WINDOWS_PER_SUBJECT = 32
STREAM_RUN = [sys.executable, "main.py", "--dataset", "store", "--model", "cnn1d", "--batch-size", "16",
              "--epochs", "1", "--save-every-steps", "1"]  # 34 steps: the kill at 20 falls mid-epoch


def synthetic_npz(path):
    """The synthetic data as an .npz of windows with its train/test split: what a store is built from."""
    raw = synthetic.generate(0, WINDOWS_PER_SUBJECT)
    signals = np.concatenate([raw["train"][0], raw["test"][0]])
    split = np.array(["train"] * len(raw["train"][1]) + ["test"] * len(raw["test"][1]))
    np.savez(path, signals=signals, labels=np.concatenate([raw["train"][1], raw["test"][1]]),
             subjects=np.concatenate([raw["train"][2], raw["test"][2]]), split=split,
             channel_names=np.array(SIGNAL_NAMES), class_names=np.array(CLASS_NAMES), sample_rate_hz=50.0)
    return path


def build(source, out, *flags):
    result = run_subprocess([sys.executable, "-m", "data.build_store", source, "--out", out, *flags], timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    folder = tmp_path_factory.mktemp("store")
    build(synthetic_npz(folder / "windows.npz"), folder / "store", "--dtype", "float32", "--workers", "2")
    return folder / "store"


def test_a_store_holds_the_windows_it_was_built_from(store):
    opened, arrays = WindowStore(store), np.load(store.parent / "windows.npz")
    manifest = opened.manifest
    assert len(opened) == len(arrays["labels"]) and opened.channels == tuple(SIGNAL_NAMES)
    assert manifest["test_subjects"] == sorted(synthetic.TEST_SUBJECTS)
    for subject in (1, 2, 30):  # shards are per subject, in subject order
        ours = np.flatnonzero(opened.subjects == subject)
        theirs = np.flatnonzero(arrays["subjects"] == subject)
        np.testing.assert_array_equal(opened.read(ours[::-1]), arrays["signals"][theirs[::-1]])
        np.testing.assert_array_equal(opened.labels[ours], arrays["labels"][theirs])
    train = arrays["signals"][arrays["split"] == "train"].astype(np.float64)
    np.testing.assert_allclose(manifest["normalization"]["mean"], train.mean(axis=(0, 2)), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(manifest["normalization"]["std"], train.std(axis=(0, 2)), rtol=1e-5)


def test_a_recording_becomes_the_windows_predict_py_would_cut(tmp_path):
    from data.recordings import read_recording
    from inference.classify import recording_windows
    folder = tmp_path / "recordings"
    folder.mkdir()
    time_s, acc, gyro = synthetic_stream(90.0, rate_hz=100.0, seed=3)  # at twice the model's rate
    labels = np.where(time_s % 30 < 25, 1 + (time_s // 30).astype(int) % 6, 8)  # activities, then a transition
    columns = {"time_s": time_s, "acc_x": acc[:, 0], "acc_y": acc[:, 1], "acc_z": acc[:, 2], "gyro_x": gyro[:, 0],
               "gyro_y": gyro[:, 1], "gyro_z": gyro[:, 2], "label": labels, "subject": np.full(len(time_s), 7)}
    np.savetxt(folder / "a.csv", np.stack(list(columns.values()), axis=1), delimiter=",",
               header=",".join(columns), comments="", fmt="%.9g")
    np.savez(folder / "b.npz", acc=acc, gyro=gyro, time_s=time_s, label=labels, subject=np.full(len(time_s), 8))
    build(folder, tmp_path / "store", "--dtype", "float32", "--workers", "1", "--test-subjects", "8",
          "--unlabelled", "8")
    opened = WindowStore(tmp_path / "store")
    bundle = SimpleNamespace(preprocessing="uci-har", channel_names=SIGNAL_NAMES, sample_rate_hz=50.0,
                             window_steps=128, config=RunConfig(), path="x")
    cut = recording_windows(bundle, read_recording(folder / "a.csv", extra=("label", "subject")))
    on_clock = np.rint(np.interp(cut.start_steps[:, None] / 50.0 + np.arange(128) / 50.0, time_s, labels))
    majority = np.array([np.bincount(row.astype(int)).argmax() for row in on_clock])
    keep = (majority >= 1) & (majority <= 6)
    assert 0 < keep.sum() < len(keep)  # transition windows were left out
    ours = np.flatnonzero(opened.subjects == 7)
    np.testing.assert_allclose(opened.read(ours), cut.windows[keep], atol=1e-6)
    np.testing.assert_array_equal(opened.labels[ours], majority[keep] - 1)
    assert opened.manifest["test_subjects"] == [8]


def test_an_interrupted_build_is_refused_then_continued(store, tmp_path):
    import shutil
    copy = tmp_path / "store"
    shutil.copytree(store, copy)
    (copy / "manifest.json").unlink()  # as a build killed before its end leaves it
    job_records = sorted((copy / "shards").glob("*.json"))
    job_records[0].unlink()
    assert_refused(run_in_process("main.py", ["--dataset", "store", "--data-dir", copy, "--save-dir", tmp_path / "r"]),
                   "did not finish", "build_store")
    result = build(store.parent / "windows.npz", copy, "--dtype", "float32", "--workers", "1")
    assert f"{len(job_records) - 1} already done" in result.stdout
    assert json.loads((copy / "manifest.json").read_text()) == json.loads((store / "manifest.json").read_text())


@pytest.mark.parametrize("damage, names", [
    ("missing", ["is missing"]), ("truncated", ["truncated"]), ("disagree", ["manifest", "disagree"])])
def test_a_damaged_store_is_refused_in_one_line(store, tmp_path, damage, names):
    import shutil
    copy = tmp_path / "store"
    shutil.copytree(store, copy)
    shard = sorted((copy / "shards").glob("*.signals.npy"))[3]
    if damage == "missing":
        shard.unlink()
    elif damage == "truncated":
        shard.write_bytes(shard.read_bytes()[:-1000])
    else:
        manifest = json.loads((copy / "manifest.json").read_text())
        manifest["shards"][3]["windows"] += 1
        (copy / "manifest.json").write_text(json.dumps(manifest))
    line = assert_refused(run_in_process("main.py", ["--dataset", "store", "--data-dir", copy, "--save-dir",
                                                     tmp_path / "run"]), *names)
    assert str(copy) in line
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_ranks_take_disjoint_shares_of_a_block_shuffled_epoch():
    size = 10 * STREAM_BLOCK + 37
    ranks = [BlockShuffledSampler(size, world_size=2, rank=rank, seed=5, pad=False) for rank in (0, 1)]
    shares = [set(sampler.indices().tolist()) for sampler in ranks]
    assert not shares[0] & shares[1] and shares[0] | shares[1] == set(range(size))
    order = ranks[0].order()
    assert torch.equal(order, BlockShuffledSampler(size, seed=5).order())  # (seed, epoch) fixes it
    ranks[0].set_epoch(1)
    assert not torch.equal(order, ranks[0].order())
    blocks = order // STREAM_BLOCK
    assert (blocks[1:] != blocks[:-1]).sum() == 10  # each block visited in one go: 11 blocks, 10 changes


def _squared_plus_one(signals):
    return signals * signals + 1.0


@pytest.mark.parametrize("batch_size", [32, 24, 300])  # a block's 256 windows make 8 batches, 10 and a half, a part
@pytest.mark.parametrize("convert", [None, _squared_plus_one])
def test_the_reader_thread_hands_out_the_batches_the_order_makes(store, batch_size, convert):
    opened = WindowStore(store)
    split = StoreSplit.of(opened, np.ones(len(opened), dtype=bool))
    sampler = BlockShuffledSampler(len(split), seed=3)
    sampler.set_epoch(1, start=7)  # a resumed epoch: the reads start inside a block
    order = sampler.indices().numpy()
    batches = list(StoreStreamLoader(split, batch_size, sampler, convert=convert))
    assert len(batches) == math.ceil(len(order) / batch_size)
    for number, (signals, labels) in enumerate(batches):
        expected = read_batch(split, order[number * batch_size:(number + 1) * batch_size])
        wanted = expected[0] if convert is None else convert(expected[0])
        assert torch.equal(signals, wanted) and torch.equal(labels, expected[1]), number


def test_the_reader_thread_turns_a_pools_counts_into_the_features_the_step_would(store, tmp_path):
    # The same run twice from one pool on disk: the reader thread converting the counts it reads, and
    # a DataLoader worker handing over the counts for the step to convert. The same weights, bit for bit.
    # The evaluation passes read converted batches too, the weight average's head applied to them.
    flags = ["--dataset", "store", "--data-dir", store, "--model", "minirocket", "--width", "840", "--epochs", "2",
             "--head-fit", "adamw", "--no-figures", "--no-resume", "--save-dir", tmp_path / "run"]
    trained, tested = {}, {}
    for name, more in {"thread": [], "worker": ["--num-workers", "1"]}.items():
        code, out, err = run_in_process("main.py", [*flags, *more])
        assert code == 0, err
        assert ("which turns the counts into features" in out) == (name == "thread"), out
        trained[name] = load_checkpoint(tmp_path / "run" / "last.pt")["model"]
        report = json.loads((tmp_path / "run" / "test_report.json").read_text())
        tested[name] = {key: report[key] for key in ("loss", "confusion_matrix", "per_subject")}
    assert all(torch.equal(tensor, trained["worker"][key]) for key, tensor in trained["thread"].items())
    assert not torch.equal(trained["thread"]["head.1.weight"], torch.zeros_like(trained["thread"]["head.1.weight"]))
    assert tested["thread"] == tested["worker"]


@pytest.mark.usefixtures("one_thread")
def test_training_from_a_store_reaches_the_accuracy_of_the_same_windows_in_memory(store, tmp_path):
    flags = ["--model", "cnn1d", "--epochs", "4", "--batch-size", "32", "--no-resume"]
    code, out, err = run_in_process("main.py", [*flags, "--dataset", "store", "--data-dir", store,
                                                "--save-dir", tmp_path / "streamed"])
    assert code == 0, err
    assert "data: store" in out and "streamed from the store by a reader thread" in out
    code, _, err = run_in_process("main.py", [*flags, "--dataset", "npz", "--data-dir", store.parent / "windows.npz",
                                              "--save-dir", tmp_path / "memory"])
    assert code == 0, err
    streamed, memory = (json.loads((tmp_path / name / "test_report.json").read_text())["accuracy"]
                        for name in ("streamed", "memory"))
    assert streamed > 0.5 and abs(streamed - memory) < 0.1, (streamed, memory)


def test_minirocket_fits_its_biases_from_windows_read_from_the_store(store, tmp_path):
    # The head trained by epochs on both paths (a split this small would otherwise be solved by ridge).
    flags = ["--model", "minirocket", "--width", "840", "--epochs", "2", "--no-resume", "--head-fit", "adamw"]
    streamed_run = [*flags, "--dataset", "store", "--data-dir", store, "--save-dir", tmp_path / "streamed"]
    code, out, err = run_in_process("main.py", streamed_run)
    assert code == 0, err
    # The store's features are built once, on disk in the run's folder, and read back from there.
    assert f"on disk in {tmp_path / 'streamed' / 'features'}" in out and "built: no earlier pool" in out
    assert "streamed from the store by a reader thread" in out
    first = load_checkpoint(tmp_path / "streamed" / "best.pt")
    code, out, err = run_in_process("main.py", streamed_run)  # --no-resume: a fresh training, the same pool
    assert code == 0, err
    assert "reused whole (the same identity)" in out
    again = load_checkpoint(tmp_path / "streamed" / "best.pt")
    assert all(torch.equal(tensor, again["model"][name]) for name, tensor in first["model"].items())
    code, _, err = run_in_process("main.py", [*flags, "--dataset", "npz", "--data-dir", store.parent / "windows.npz",
                                              "--save-dir", tmp_path / "memory"])
    assert code == 0, err
    streamed, memory = (load_checkpoint(tmp_path / name / "best.pt") for name in ("streamed", "memory"))
    assert streamed["model"]["biases"].abs().sum() > 0
    # The same kernels, biases from the same kind of windows: quantiles of similar outputs.
    assert torch.equal(streamed["model"]["weights"], memory["model"]["weights"])
    assert (streamed["model"]["biases"] - memory["model"]["biases"]).abs().median() < 0.5
    accuracy = [json.loads((tmp_path / name / "test_report.json").read_text())["accuracy"]
                for name in ("streamed", "memory")]
    assert accuracy[0] > 0.5 and abs(accuracy[0] - accuracy[1]) < 0.1, accuracy


def test_a_killed_store_run_resumes_bit_for_bit(store, tmp_path):
    # Each run on one thread (conftest.ONE_THREAD), so that the straight and the resumed runs agree on it.
    straight = run_subprocess([*STREAM_RUN, "--data-dir", store, "--save-dir", tmp_path / "straight"], env=ONE_THREAD)
    assert straight.returncode == 0, straight.stderr[-3000:]
    # The killed run reads through a DataLoader worker, the others through the reader thread: both
    # give the same batches.
    killed = run_subprocess([*STREAM_RUN, "--data-dir", store, "--save-dir", tmp_path / "killed", "--num-workers", "1"],
                            env={"HAR_FAULT": "kill@20", **ONE_THREAD})
    assert killed.returncode == -signal.SIGKILL
    resumed = run_subprocess([*STREAM_RUN, "--data-dir", store, "--save-dir", tmp_path / "killed"], env=ONE_THREAD)
    assert resumed.returncode == 0 and "RESUMING" in resumed.stdout, resumed.stderr[-3000:]
    expected = load_checkpoint(tmp_path / "straight" / "last.pt")
    actual = load_checkpoint(tmp_path / "killed" / "last.pt")
    assert expected["step"] == actual["step"]
    for name, tensor in expected["model"].items():
        assert torch.equal(tensor, actual["model"][name]), name


def test_resuming_on_a_store_with_other_channels_is_refused(store, tmp_path):
    arrays = dict(np.load(store.parent / "windows.npz"))
    arrays["channel_names"] = np.array([f"sensor_{i}" for i in range(9)])  # as many channels, other ones
    np.savez(tmp_path / "other.npz", **arrays)
    build(tmp_path / "other.npz", tmp_path / "other", "--workers", "1")
    code, _, err = run_in_process("main.py", ["--model", "cnn1d", "--epochs", "1", "--dataset", "store",
                                              "--data-dir", store, "--save-dir", tmp_path / "run"])
    assert code == 0, err
    # Named with --resume, so that the other --data-dir alone does not refuse it first.
    line = assert_refused(run_in_process("main.py", ["--model", "cnn1d", "--epochs", "2", "--dataset", "store",
                                                     "--data-dir", tmp_path / "other", "--save-dir", tmp_path / "run",
                                                     "--resume", tmp_path / "run" / "last.pt"]),
                          "channels", "sensor_0")
    assert str(tmp_path / "other") in line


@pytest.mark.usefixtures("one_thread")
def test_ddp_and_cross_validation_train_from_a_store(store, tmp_path):
    flags = ["--dataset", "store", "--data-dir", store, "--model", "cnn1d", "--epochs", "1", "--batch-size", "16"]
    ddp = run_subprocess([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                          "main_multi_gpu.py", "--multi-gpu", "ddp", *flags, "--save-dir", tmp_path / "ddp"])
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    assert "streamed from the store" in ddp.stdout
    train_windows = int(re.search(r"train ([\d,]+) windows", ddp.stdout).group(1).replace(",", ""))
    # Two ranks share each epoch: each takes half the windows, 16 a step.
    assert load_checkpoint(tmp_path / "ddp" / "last.pt")["step"] == -(-train_windows // 32)
    code, out, err = run_in_process("main.py", [*flags, "--cv-folds", "2", "--save-dir", tmp_path / "cv"])
    assert code == 0, err
    report = json.loads((tmp_path / "cv" / "cv_report.json").read_text())
    assert len(report["folds"]) == 2


@pytest.mark.parametrize("workers", [0, 1])
def test_every_loader_of_a_store_knows_its_window_shape(store, workers):
    # What an FSDP rank with fewer evaluation batches feeds the model to take part in the gathers.
    from data.sources import load_har_data
    data = load_har_data("store", store)
    loaders, _ = split_loaders({"train": data.train, "test": data.test},
                               LoaderRequest(16, 16, torch.device("cpu"), 1, 0, 0, num_workers=workers))
    assert {window_shape(loader) for loader in loaders.values()} == {(9, 128)}


# --- Reuse by identity, and contents checked at load ---------------------------------------------

def build_here(source, out, *flags):
    """data.build_store in this process (one worker): its output lines."""
    import contextlib
    import io

    from data import build_store
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(io.StringIO()):
        assert build_store.main([str(source), "--out", str(out), "--workers", "1", "--dtype", "float32", *flags]) == 0
    return printed.getvalue()


def store_bytes(folder):
    """Everything a store's reader sees, file by file: the manifest, labels.npy and every shard's .npy."""
    files = [folder / "manifest.json", folder / "labels.npy", *sorted((folder / "shards").glob("*.npy"))]
    return {str(path.relative_to(folder)): path.read_bytes() for path in files}


def write_recording(folder, name, subject, seed):
    time_s, acc, gyro = synthetic_stream(30.0, rate_hz=50.0, seed=seed)
    labels = 1 + (time_s // 6).astype(int) % 6
    np.savez(folder / name, acc=acc, gyro=gyro, time_s=time_s, label=labels, subject=np.full(len(time_s), subject))


def test_a_rebuild_converts_only_what_changed_and_equals_a_fresh_build(tmp_path):
    from data.errors import DataError
    source = tmp_path / "recordings"
    source.mkdir()
    for subject in (1, 2):
        write_recording(source, f"s{subject}.npz", subject, seed=subject)
    build_here(source, tmp_path / "store", "--test-subjects", "2")
    write_recording(source, "s3.npz", 3, seed=3)  # a subject added: the others' shards are kept
    printed = build_here(source, tmp_path / "store", "--test-subjects", "2")
    assert "3 job(s), 2 already done" in printed and "converting again" not in printed
    build_here(source, tmp_path / "fresh", "--test-subjects", "2")
    assert store_bytes(tmp_path / "store") == store_bytes(tmp_path / "fresh")
    # Another stride changes every job: over a finished store it is refused; with the manifest removed
    # (the way in place) each job is converted again, none reported done.
    with pytest.raises(DataError, match="stride_steps is 64"):
        build_here(source, tmp_path / "store", "--test-subjects", "2", "--stride", "32")
    (tmp_path / "store" / "manifest.json").unlink()
    printed = build_here(source, tmp_path / "store", "--test-subjects", "2", "--stride", "32")
    assert "0 already done" in printed and "converting again 3 job(s)" in printed and "stride" in printed
    build_here(source, tmp_path / "strided", "--test-subjects", "2", "--stride", "32")
    assert store_bytes(tmp_path / "store") == store_bytes(tmp_path / "strided")
    assert store_bytes(tmp_path / "store") != store_bytes(tmp_path / "fresh")
    (source / "s3.npz").unlink()  # a recording removed: its shards go with it
    printed = build_here(source, tmp_path / "store", "--test-subjects", "2", "--stride", "32")
    assert "2 already done" in printed and "removed 3 file(s)" in printed
    assert WindowStore(tmp_path / "store").manifest["subjects"].keys() == {"1", "2"}
    assert not list((tmp_path / "store" / "shards").glob("rec-s3*"))


@pytest.mark.parametrize("damage", ["truncated", "same size, other bytes"])
def test_a_damaged_shard_is_converted_again_alone(store, tmp_path, damage):
    import shutil
    copy = tmp_path / "store"
    shutil.copytree(store, copy)
    shard = sorted((copy / "shards").glob("*.signals.npy"))[3]
    data = bytearray(shard.read_bytes())
    if damage == "truncated":
        shard.write_bytes(data[:-1000])
    else:
        data[-4:] = bytes(4)
        shard.write_bytes(data)
    printed = build_here(store.parent / "windows.npz", copy)
    assert "already done" in printed and "converting again 1 job(s)" in printed
    assert shard.name.rsplit("-", 1)[0] in printed and "not what was written" in printed
    assert store_bytes(copy) == store_bytes(store)


def damaged_copy(store, folder, change):
    """A copy of the store with `change(copy)` applied."""
    import shutil
    copy = folder / "store"
    shutil.copytree(store, copy)
    change(copy)
    return copy


def edit_manifest(edit):
    def change(copy):
        manifest = json.loads((copy / "manifest.json").read_text())
        edit(manifest)
        (copy / "manifest.json").write_text(json.dumps(manifest))
    return change


def rewrite_shard(transform):
    def change(copy):
        shard = sorted((copy / "shards").glob("*.signals.npy"))[3]
        np.save(shard, transform(np.load(shard)))
    return change


def rewrite_labels(transform):
    def change(copy):
        np.save(copy / "labels.npy", transform(np.load(copy / "labels.npy")))
    return change


@pytest.mark.parametrize("change, names", [
    # The same byte count as the manifest's float32 [n, 9, 128], another meaning.
    (rewrite_shard(lambda a: a.view(np.float16)), ["float16 [32, 9, 256]", "disagree"]),
    (rewrite_shard(np.asfortranarray), ["Fortran order"]),
    (rewrite_shard(lambda a: a.reshape(len(a), 128, 9)), ["[32, 128, 9]", "disagree"]),
    (edit_manifest(lambda m: m["shards"][0].update(name="../../elsewhere")), ["shards", "inside shards/"]),
    (edit_manifest(lambda m: m["test_subjects"].append(99)), ["test subject(s) 99", "--test-subjects"]),
    (edit_manifest(lambda m: m["shards"][2].pop("windows")), ["shards", "window count"]),
    (edit_manifest(lambda m: m["layout"].update(channels="acc")), ["channels"]),
    (edit_manifest(lambda m: m["normalization"]["std"].pop()), ["normalization std", "9 finite numbers"]),
    (rewrite_labels(np.zeros_like), ["1 class(es) (WALKING)"]),
    (rewrite_labels(lambda a: np.where(np.arange(len(a)) == 40, 9, a).astype(np.int8)),
     ["outside 0..5", "window 8 of shard sub-000002-000"]),
    (rewrite_labels(lambda a: a.astype(np.float32)), ["float32"]),
])
def test_store_contents_are_checked_when_it_is_opened(store, tmp_path, change, names):
    from data.errors import DataError
    copy = damaged_copy(store, tmp_path, change)
    with pytest.raises(DataError) as refused:
        WindowStore(copy)
    message = str(refused.value)
    assert "\n" not in message and str(copy) in message and all(name in message for name in names), message


def test_an_unknown_test_subject_is_refused_before_training(store, tmp_path):
    copy = damaged_copy(store, tmp_path, edit_manifest(lambda m: m["test_subjects"].append(99)))
    assert_refused(run_in_process("main.py", ["--dataset", "store", "--data-dir", copy, "--model", "cnn1d",
                                              "--epochs", "1", "--save-dir", tmp_path / "run"]), "99")
    assert not (tmp_path / "run").exists()


def test_a_window_that_is_not_finite_is_refused_where_it_lies(store, tmp_path):
    from data.errors import DataError

    def poison(copy):
        shard = sorted((copy / "shards").glob("*.signals.npy"))[3]
        windows = np.load(shard)
        windows[5, 2, 7] = np.nan
        np.save(shard, windows)
    copy = damaged_copy(store, tmp_path, poison)
    opened = WindowStore(copy)
    name = opened.shards[3].name
    opened.read(np.arange(opened.shards[3].first))  # the windows before it read as before
    with pytest.raises(DataError, match=f"window 5 of shard {name} holds values that are not finite"):
        opened.read(np.arange(len(opened)))


def test_a_build_refuses_windows_that_are_not_finite_as_stored(tmp_path):
    from data import build_store
    from data.errors import DataError
    arrays = dict(np.load(synthetic_npz(tmp_path / "windows.npz")))
    arrays["signals"][np.flatnonzero(arrays["subjects"] == 2)[3], 4, 10] = 1e6  # finite, but not as float16
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(DataError) as refused:
        build_store.main([str(tmp_path / "bad.npz"), "--out", str(tmp_path / "store"), "--workers", "1",
                          "--dtype", "float16"])
    names = ["subject 2", "window 3 (channel 4, step 10)", "1e+06 is beyond float16's range", "--dtype float32"]
    assert all(name in str(refused.value) for name in names), refused.value
    assert not (tmp_path / "store" / "manifest.json").exists()


def test_a_build_out_that_is_a_file_or_another_folder_is_refused_and_left_alone(tmp_path):
    from data import build_store
    from data.errors import DataError
    source = synthetic_npz(tmp_path / "windows.npz")
    (tmp_path / "file").write_text("keep me")
    run = tmp_path / "run"
    run.mkdir()
    (run / "best.pt").write_bytes(b"a run's checkpoint")
    for out, says in ((tmp_path / "file", "is a file"), (tmp_path / "file" / "store", "cannot be created"),
                      (run, "holds other files and no store")):
        with pytest.raises((OutputRefused, DataError), match=says):
            build_store.main([str(source), "--out", str(out), "--workers", "1"])
    assert (tmp_path / "file").read_text() == "keep me" and sorted(p.name for p in run.iterdir()) == ["best.pt"]
    # A folder whose manifest.json or shards/ is not a store's: a web page's manifest, settings beside notes.
    site, notes = tmp_path / "site", tmp_path / "notes"
    (site).mkdir()
    (site / "manifest.json").write_text("CACHE MANIFEST\n")
    (site / "index.html").write_text("<p>keep</p>")
    (notes / "shards").mkdir(parents=True)
    (notes / "notes.txt").write_text("keep")
    (notes / "shards" / "settings.json").write_text('{"keep": true}')
    for out in (site, notes):
        with pytest.raises(DataError, match="holds other files and no store"):
            build_store.main([str(source), "--out", str(out), "--workers", "1"])
    assert (site / "manifest.json").read_text() == "CACHE MANIFEST\n" and (notes / "shards" / "settings.json").exists()


def test_a_finished_store_of_another_source_is_refused_and_left_alone(tmp_path):
    from data import build_store
    from data.errors import DataError
    first = synthetic_npz(tmp_path / "a.npz")
    other = tmp_path / "b.npz"
    other.write_bytes(first.read_bytes())
    out = tmp_path / "store"
    assert build_store.main([str(first), "--out", str(out), "--workers", "1"]) == 0
    manifest = (out / "manifest.json").read_text()
    with pytest.raises(DataError, match=f"holds a finished store built from {first.resolve()}, not {other.resolve()}"):
        build_store.main([str(other), "--out", str(out), "--workers", "1"])
    assert (out / "manifest.json").read_text() == manifest
    assert build_store.main([str(first), "--out", str(out), "--workers", "1"]) == 0  # its own source: reused


def test_a_store_run_solves_its_head_from_the_pool_on_disk_as_a_run_in_memory_does(store, tmp_path):
    runs = {"store": ["--dataset", "store", "--data-dir", store],
            "memory": ["--dataset", "npz", "--data-dir", store.parent / "windows.npz"]}
    said = {}
    for name, data in runs.items():
        code, said[name], err = run_in_process("main.py", [*data, "--model", "minirocket", "--width", "840",
                                                           "--head-fit", "ridge", "--no-figures", "--save-dir",
                                                           tmp_path / name])
        assert code == 0, err
        assert "head: ridge regression on " in said[name], name
    assert f"on disk in {tmp_path / 'store' / 'features'}" in said["store"]
    streamed, memory = (load_checkpoint(tmp_path / name / "best.pt") for name in runs)
    assert streamed["planned_epochs"] == memory["planned_epochs"] == 1
    accuracy = [json.loads((tmp_path / name / "test_report.json").read_text())["accuracy"] for name in runs]
    assert accuracy[0] > 0.5 and abs(accuracy[0] - accuracy[1]) < 0.1, accuracy


def _disk_full(arguments):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_odd_recordings_a_full_disk_and_test_subjects_of_an_npz(tmp_path, monkeypatch):
    from data import build_store
    from data.errors import DataError
    recordings = tmp_path / "recordings"
    recordings.mkdir()
    for subject in (1, 2, 3):
        write_recording(recordings, f"s{subject}.npz", subject, seed=subject)
    (recordings / "s4.csv").symlink_to(tmp_path / "nowhere.csv")
    with pytest.raises(DataError, match="s4.csv does not exist; a recordings folder holds .csv or .npz files"):
        build_store.main([str(recordings), "--out", str(tmp_path / "a"), "--workers", "1"])
    (recordings / "s4.csv").unlink()
    monkeypatch.setattr(build_store, "run_job", _disk_full)  # the workers are forked: they see it too
    with pytest.raises(DataError, match=r"could not write the store in .*\(No space left on device\); free space "
                                        "there and run the same command again"):
        build_store.main([str(recordings), "--out", str(tmp_path / "a"), "--workers", "1"])
    monkeypatch.undo()
    arrays = dict(np.load(synthetic_npz(tmp_path / "windows.npz")))
    with pytest.raises(DataError, match="marks its test windows .* and --test-subjects names others"):
        build_store.main([str(tmp_path / "windows.npz"), "--out", str(tmp_path / "b"), "--workers", "1",
                          "--test-subjects", "4"])
    arrays.pop("split")
    np.savez(tmp_path / "unsplit.npz", **arrays)
    assert build_store.main([str(tmp_path / "unsplit.npz"), "--out", str(tmp_path / "c"), "--workers", "1",
                             "--test-subjects", "4,7"]) == 0
    assert json.loads((tmp_path / "c" / "manifest.json").read_text())["test_subjects"] == [4, 7]
