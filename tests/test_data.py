"""Unit tests for the data package: UCI HAR loader, synthetic generator, splits and loaders."""
import os

import numpy as np
import pytest
import torch

from data import loaders, sources, splits, synthetic, uci_har
from data.errors import DataError

# ---------------------------------------------------------------------------
# Helpers: a tiny fake UCI HAR Dataset in the real on-disk layout.
# ---------------------------------------------------------------------------

N_CLASSES = len(uci_har.CLASS_NAMES)
STEPS = uci_har.WINDOW_STEPS


def _write_rows(path, rows):
    """One line per row; values like the real files (leading spaces, exponent notation).

    %.9e keeps ten significant digits, enough for float32 values to round-trip exactly.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["  " + "  ".join(f"{float(v):.9e}" for v in row) for row in rows]
    path.write_text("\n".join(lines) + "\n")


def write_uci_split(root, split, signals, labels_1based, subjects):
    """Write one split ([N, 9, 128] signals, labels 1..6, subjects) under `root` in UCI layout."""
    inertial = root / split / "Inertial Signals"
    inertial.mkdir(parents=True, exist_ok=True)
    for channel, name in enumerate(uci_har.SIGNAL_NAMES):
        _write_rows(inertial / f"{name}_{split}.txt", signals[:, channel, :])
    (root / split / f"y_{split}.txt").write_text("".join(f"{int(v)}\n" for v in labels_1based))
    (root / split / f"subject_{split}.txt").write_text("".join(f"{int(v)}\n" for v in subjects))


def make_split_arrays(rng, n, subjects_pool):
    """Random signals with a distinct offset per channel, labels covering 1..6, a few subjects."""
    signals = rng.standard_normal((n, 9, STEPS)).astype(np.float32)
    signals += np.arange(9, dtype=np.float32)[None, :, None] * 10  # channel c lives near 10*c
    labels = (np.arange(n) % N_CLASSES) + 1
    rng.shuffle(labels)
    subjects = np.resize(np.asarray(subjects_pool), n)
    return signals, labels.astype(np.int64), subjects.astype(np.int64)


def make_fake_uci(root, seed=0, n_train=12, n_test=6):
    """Build a full fake dataset (train + test) under `root`; return the arrays written."""
    rng = np.random.default_rng(seed)
    arrays = {
        "train": make_split_arrays(rng, n_train, [1, 3, 5]),
        "test": make_split_arrays(rng, n_test, [2, 4]),
    }
    for split, (signals, labels, subjects) in arrays.items():
        write_uci_split(root, split, signals, labels, subjects)
    return arrays


def signal_path(root, split, name):
    return root / split / "Inertial Signals" / f"{name}_{split}.txt"


@pytest.fixture
def fake_uci(tmp_path):
    root = tmp_path / "UCI HAR Dataset"
    arrays = make_fake_uci(root)
    return root, arrays


# ---------------------------------------------------------------------------
# 1. UCI HAR loader
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("split", ["train", "test"])
def test_load_split_round_trips_values_in_signal_name_order(fake_uci, split):
    root, arrays = fake_uci
    signals, labels, subjects = uci_har.load_split(root, split)
    want_signals, want_labels, want_subjects = arrays[split]
    assert signals.shape == (len(want_labels), 9, STEPS)
    assert signals.dtype == np.float32
    assert np.array_equal(signals, want_signals)
    # Channel c came from the file named SIGNAL_NAMES[c].
    for channel, name in enumerate(uci_har.SIGNAL_NAMES):
        first_row = np.array(signal_path(root, split, name).read_text().splitlines()[0].split(),
                             dtype=np.float32)
        assert np.array_equal(signals[0, channel], first_row)
    assert labels.dtype == np.int64 and subjects.dtype == np.int64
    assert np.array_equal(labels, want_labels - 1)
    assert labels.min() == 0 and labels.max() == N_CLASSES - 1
    assert np.array_equal(subjects, want_subjects)


def test_find_root_accepts_dataset_folder_and_its_parent(fake_uci, tmp_path):
    root, _ = fake_uci
    assert uci_har.find_root(root) == root
    assert uci_har.find_root(str(root)) == root
    assert uci_har.find_root(tmp_path) == root  # parent holding "UCI HAR Dataset"
    assert uci_har.find_root(str(tmp_path)) == root


def test_find_root_rejects_folders_without_the_dataset(tmp_path):
    assert uci_har.find_root(None) is None
    assert uci_har.find_root(tmp_path) is None
    assert uci_har.find_root(tmp_path / "does-not-exist") is None
    # train/Inertial Signals without test/ is not a dataset either.
    (tmp_path / "partial" / "train" / "Inertial Signals").mkdir(parents=True)
    assert uci_har.find_root(tmp_path / "partial") is None


def test_cache_written_under_root_and_used_on_second_load(fake_uci, monkeypatch):
    root, _ = fake_uci
    first = uci_har.load_split(root, "train")
    cache = root / ".cache" / "train.npz"
    assert cache.is_file()
    assert not (root / ".cache" / "test.npz").exists()  # only the split that was loaded

    # The second load must not parse the text files at all.
    def no_parse(*args, **kwargs):
        raise AssertionError("text files parsed although a valid cache exists")

    monkeypatch.setattr(uci_har, "_parse_split", no_parse)
    second = uci_har.load_split(root, "train")
    for a, b in zip(first, second, strict=True):
        assert a.dtype == b.dtype
        assert np.array_equal(a, b)


def test_cache_holds_the_parsed_arrays(fake_uci):
    root, arrays = fake_uci
    uci_har.load_split(root, "test")
    with np.load(root / ".cache" / "test.npz", allow_pickle=False) as cache:
        assert np.array_equal(cache["signals"], arrays["test"][0])
        assert np.array_equal(cache["labels"], arrays["test"][1] - 1)
        assert np.array_equal(cache["subjects"], arrays["test"][2])


def test_editing_a_source_file_invalidates_the_cache(fake_uci):
    root, arrays = fake_uci
    before, _, _ = uci_har.load_split(root, "train")
    path = signal_path(root, "train", "body_gyro_y")
    old_mtime = path.stat().st_mtime_ns
    new_rows = arrays["train"][0][:, 4, :] + 1000.0  # body_gyro_y is channel 4
    _write_rows(path, new_rows)
    os.utime(path, ns=(old_mtime + 5_000_000_000, old_mtime + 5_000_000_000))

    after, labels, _ = uci_har.load_split(root, "train")
    assert np.array_equal(after[:, 4], new_rows.astype(np.float32))
    assert not np.array_equal(after, before)
    assert np.array_equal(np.delete(after, 4, axis=1), np.delete(before, 4, axis=1))
    # The rebuilt cache now holds the new values too.
    with np.load(root / ".cache" / "train.npz", allow_pickle=False) as cache:
        assert np.array_equal(cache["signals"], after)


def test_editing_labels_invalidates_the_cache(fake_uci):
    root, arrays = fake_uci
    uci_har.load_split(root, "train")
    label_path = root / "train" / "y_train.txt"
    new_labels = np.full(len(arrays["train"][1]), 6)
    old_mtime = label_path.stat().st_mtime_ns
    label_path.write_text("".join(f"{v}\n" for v in new_labels))
    os.utime(label_path, ns=(old_mtime + 5_000_000_000, old_mtime + 5_000_000_000))
    _, labels, _ = uci_har.load_split(root, "train")
    assert np.array_equal(labels, new_labels - 1)


def test_garbage_cache_is_rebuilt(fake_uci):
    root, arrays = fake_uci
    uci_har.load_split(root, "train")
    (root / ".cache" / "train.npz").write_bytes(b"this is not an npz file" * 10)
    signals, labels, _ = uci_har.load_split(root, "train")
    assert np.array_equal(signals, arrays["train"][0])
    assert np.array_equal(labels, arrays["train"][1] - 1)


def test_truncated_cache_is_rebuilt(fake_uci):
    root, arrays = fake_uci
    uci_har.load_split(root, "train")
    cache = root / ".cache" / "train.npz"
    data = cache.read_bytes()
    cache.write_bytes(data[: len(data) // 2])
    signals, _, _ = uci_har.load_split(root, "train")
    assert np.array_equal(signals, arrays["train"][0])


def _expect_data_error(root, split, *fragments):
    with pytest.raises(DataError) as info:
        uci_har.load_split(root, split)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert "\n" not in message
    return message


def test_signal_row_with_wrong_number_of_values(fake_uci):
    root, _ = fake_uci
    path = signal_path(root, "train", "total_acc_z")
    lines = path.read_text().splitlines()
    lines[2] = " ".join(lines[2].split()[:-1])  # line 3 now has 127 values
    path.write_text("\n".join(lines) + "\n")
    _expect_data_error(root, "train", "total_acc_z_train.txt", "line 3", "127", str(STEPS))


def test_signal_row_with_too_many_values(fake_uci):
    root, _ = fake_uci
    path = signal_path(root, "test", "body_acc_x")
    lines = path.read_text().splitlines()
    lines[-1] = lines[-1] + " 1.0"
    path.write_text("\n".join(lines) + "\n")
    n_lines = len(lines)
    _expect_data_error(root, "test", "body_acc_x_test.txt", f"line {n_lines}", str(STEPS + 1))


def test_compensating_row_lengths_are_rejected(fake_uci):
    root, _ = fake_uci
    path = signal_path(root, "train", "body_acc_y")
    lines = path.read_text().splitlines()
    values = lines[0].split()
    lines[0] = " ".join(values + ["0.0"])  # 129 values
    lines[1] = " ".join(lines[1].split()[:-1])  # 127 values
    path.write_text("\n".join(lines) + "\n")
    _expect_data_error(root, "train", "body_acc_y_train.txt", "line 1")


def test_label_count_mismatch(fake_uci):
    root, arrays = fake_uci
    labels = arrays["train"][1][:-1]  # one label short
    (root / "train" / "y_train.txt").write_text("".join(f"{v}\n" for v in labels))
    message = _expect_data_error(root, "train", "y_train.txt", "disagree")
    assert str(len(labels)) in message and str(len(arrays["train"][1])) in message


def test_subject_count_mismatch(fake_uci):
    root, arrays = fake_uci
    subjects = list(arrays["test"][2]) + [7]
    (root / "test" / "subject_test.txt").write_text("".join(f"{v}\n" for v in subjects))
    _expect_data_error(root, "test", "subject_test.txt", "disagree")


def test_signal_files_with_different_row_counts(fake_uci):
    root, arrays = fake_uci
    path = signal_path(root, "train", "body_gyro_z")
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:-1]) + "\n")
    _expect_data_error(root, "train", "body_gyro_z_train.txt")


@pytest.mark.parametrize("bad_label", [7, 0])
def test_label_outside_range(fake_uci, bad_label):
    root, arrays = fake_uci
    labels = arrays["train"][1].copy()
    labels[4] = bad_label
    (root / "train" / "y_train.txt").write_text("".join(f"{v}\n" for v in labels))
    _expect_data_error(root, "train", "y_train.txt", f"label {bad_label}", "1..6")


def test_non_integer_label(fake_uci):
    root, arrays = fake_uci
    lines = [str(v) for v in arrays["train"][1]]
    lines[0] = "2.5"
    (root / "train" / "y_train.txt").write_text("\n".join(lines) + "\n")
    _expect_data_error(root, "train", "y_train.txt", "2.5")


@pytest.mark.parametrize("token", ["NaN", "nan", "inf"])
def test_nan_or_infinity_in_signal_file(fake_uci, token):
    root, _ = fake_uci
    path = signal_path(root, "train", "body_gyro_x")
    lines = path.read_text().splitlines()
    values = lines[5].split()
    values[17] = token
    lines[5] = " ".join(values)
    path.write_text("\n".join(lines) + "\n")
    _expect_data_error(root, "train", "NaN", "body_gyro_x_train.txt", "row 6, value 18")


def test_non_numeric_value_in_signal_file(fake_uci):
    root, _ = fake_uci
    path = signal_path(root, "train", "body_acc_z")
    text = path.read_text()
    path.write_text(text.replace(text.split()[3], "oops", 1))
    _expect_data_error(root, "train", "body_acc_z_train.txt", "not a number")


@pytest.mark.parametrize("relative, damage, message", [
    ("train/Inertial Signals/total_acc_y_train.txt", "delete", "missing"),
    ("train/y_train.txt", "delete", "missing"),
    ("train/subject_train.txt", "delete", "missing"),
    ("test/Inertial Signals/body_acc_x_test.txt", "empty", "empty"),
    ("test/y_test.txt", "empty", "empty"),
    ("test/subject_test.txt", "empty", "empty"),
])
def test_missing_or_empty_file(fake_uci, relative, damage, message):
    root, _ = fake_uci
    if damage == "delete":
        (root / relative).unlink()
    else:
        (root / relative).write_text("")
    _expect_data_error(root, relative.split("/")[0], message, os.path.basename(relative))


def test_whitespace_only_file_counts_as_empty(fake_uci):
    root, _ = fake_uci
    (root / "test" / "y_test.txt").write_text("\n   \n\n")
    _expect_data_error(root, "test", "empty", "y_test.txt")


def test_failed_load_writes_no_cache(fake_uci):
    root, _ = fake_uci
    (root / "train" / "y_train.txt").write_text("")
    with pytest.raises(DataError):
        uci_har.load_split(root, "train")
    assert not (root / ".cache" / "train.npz").exists()


# ---------------------------------------------------------------------------
# 2. Synthetic generator
# ---------------------------------------------------------------------------

WPS = 8  # windows per subject: small and fast


@pytest.fixture(scope="module")
def synth():
    return synthetic.generate(seed=3, windows_per_subject=WPS)


def test_synthetic_same_seed_same_arrays(synth):
    again = synthetic.generate(seed=3, windows_per_subject=WPS)
    for split in ("train", "test"):
        for a, b in zip(synth[split], again[split], strict=True):
            assert np.array_equal(a, b)


def test_synthetic_different_seed_different_arrays(synth):
    other = synthetic.generate(seed=4, windows_per_subject=WPS)
    for split in ("train", "test"):
        assert not np.array_equal(synth[split][0], other[split][0])
    assert not np.array_equal(synth["train"][1], other["train"][1])


def test_synthetic_shapes_and_dtypes(synth):
    for split in ("train", "test"):
        signals, labels, subjects = synth[split]
        assert signals.ndim == 3 and signals.shape[1:] == (9, STEPS)
        assert signals.dtype == np.float32
        assert labels.dtype == np.int64 and subjects.dtype == np.int64
        assert len(signals) == len(labels) == len(subjects)
        assert np.all(np.isfinite(signals))


def test_synthetic_labels_cover_all_classes(synth):
    for split in ("train", "test"):
        labels = synth[split][1]
        assert labels.min() >= 0 and labels.max() <= N_CLASSES - 1
        assert set(np.unique(labels).tolist()) == set(range(N_CLASSES))


def test_synthetic_split_by_subject(synth):
    train_subjects = set(np.unique(synth["train"][2]).tolist())
    test_subjects = set(np.unique(synth["test"][2]).tolist())
    assert test_subjects == set(synthetic.TEST_SUBJECTS)
    assert train_subjects == set(range(1, synthetic.NUM_SUBJECTS + 1)) - set(synthetic.TEST_SUBJECTS)
    assert not train_subjects & test_subjects
    for split in ("train", "test"):
        _, counts = np.unique(synth[split][2], return_counts=True)
        assert np.all(counts == WPS)
    assert len(synth["train"][1]) + len(synth["test"][1]) == synthetic.NUM_SUBJECTS * WPS


def test_synthetic_default_size():
    data = synthetic.generate(seed=0)
    total = len(data["train"][1]) + len(data["test"][1])
    assert total == 30 * synthetic.DEFAULT_WINDOWS_PER_SUBJECT
    assert len(data["test"][1]) == len(synthetic.TEST_SUBJECTS) * synthetic.DEFAULT_WINDOWS_PER_SUBJECT


def test_synthetic_total_acc_carries_gravity(synth):
    signals = np.concatenate([synth["train"][0], synth["test"][0]])
    names = uci_har.SIGNAL_NAMES
    total = signals[:, [names.index(f"total_acc_{a}") for a in "xyz"]]
    body = signals[:, [names.index(f"body_acc_{a}") for a in "xyz"]]
    total_mag = np.linalg.norm(total, axis=1).mean()
    body_mag = np.linalg.norm(body, axis=1).mean()
    assert 0.9 < total_mag < 1.15, total_mag
    assert body_mag < 0.3 * total_mag, (body_mag, total_mag)
    # The window-mean of total_acc (gravity) has magnitude ~1 g in every window.
    gravity = np.linalg.norm(total.mean(axis=2), axis=1)
    assert np.all((gravity > 0.8) & (gravity < 1.2))


# ---------------------------------------------------------------------------
# 3. splits.py
# ---------------------------------------------------------------------------

def test_select_channels_flatten_average_first():
    rng = np.random.default_rng(0)
    signals = rng.standard_normal((5, 9, STEPS)).astype(np.float32)

    flat = splits.select_channels(signals, "flatten")
    assert np.array_equal(flat, signals)

    average = splits.select_channels(signals, "average")
    assert average.shape == (5, 3, STEPS)
    names = uci_har.SIGNAL_NAMES
    for axis_index, axis in enumerate("xyz"):
        idx = [names.index(f"{sensor}_{axis}") for sensor in ("body_acc", "body_gyro", "total_acc")]
        expected = (signals[:, idx[0]] + signals[:, idx[1]] + signals[:, idx[2]]) / 3
        np.testing.assert_allclose(average[:, axis_index], expected, rtol=1e-5, atol=1e-6)

    first = splits.select_channels(signals, "first")
    assert first.shape == (5, 3, STEPS)
    assert np.array_equal(first, signals[:, [names.index(f"body_acc_{a}") for a in "xyz"]])

    assert len(splits.channel_names("flatten")) == 9
    assert len(splits.channel_names("average")) == 3
    assert splits.channel_names("first") == ("body_acc_x", "body_acc_y", "body_acc_z")


def test_select_channels_rejects_unknown_mode():
    with pytest.raises(DataError, match="mode"):
        splits.select_channels(np.zeros((1, 9, STEPS), np.float32), "median")


def test_hold_out_subjects_returns_whole_subjects():
    subjects = np.repeat(np.array([1, 3, 5, 6, 7, 8, 11, 14, 15, 16]), 4)
    held = splits.hold_out_subjects(subjects, 0.3, seed=0)
    assert len(held) == 3
    assert len(set(held.tolist())) == len(held)
    assert set(held.tolist()) <= set(subjects.tolist())
    assert np.all(np.diff(held) > 0)  # sorted
    # Whole subjects: every window of a held-out subject is selected by isin, none of the others.
    is_val = np.isin(subjects, held)
    for s in np.unique(subjects):
        assert is_val[subjects == s].all() or not is_val[subjects == s].any()


@pytest.mark.parametrize("n_subjects", [2, 3, 5])
@pytest.mark.parametrize("fraction", [0.01, 0.5, 0.99])
def test_hold_out_subjects_at_least_one_never_all(n_subjects, fraction):
    subjects = np.repeat(np.arange(1, n_subjects + 1), 3)
    held = splits.hold_out_subjects(subjects, fraction, seed=1)
    assert 1 <= len(held) <= n_subjects - 1


def test_hold_out_subjects_deterministic_per_seed():
    subjects = np.repeat(np.arange(1, 31), 2)
    a = splits.hold_out_subjects(subjects, 0.2, seed=7)
    b = splits.hold_out_subjects(subjects, 0.2, seed=7)
    assert np.array_equal(a, b)
    others = [splits.hold_out_subjects(subjects, 0.2, seed=s) for s in range(8, 13)]
    assert any(not np.array_equal(a, o) for o in others)


@pytest.mark.parametrize("fraction", [1, 1.0, -0.1, 1.5, float("nan")])
def test_hold_out_subjects_rejects_bad_fraction(fraction):
    with pytest.raises(DataError, match="val-fraction"):
        splits.hold_out_subjects(np.arange(10), fraction, seed=0)


@pytest.mark.parametrize("num_samples, world_size", [(10, 1), (10, 3), (7, 2), (2, 4)])
def test_gathered_order_follows_the_ranks_evaluation_shares(num_samples, world_size):
    from data.loaders import ShardedSampler, gathered_order
    shares = [ShardedSampler(num_samples, world_size, rank, shuffle=False, pad=False).indices().numpy()
              for rank in range(world_size)]
    np.testing.assert_array_equal(gathered_order(num_samples, world_size), np.concatenate(shares))


def test_a_fraction_of_zero_holds_no_subject_out():
    assert len(splits.hold_out_subjects(np.arange(10), 0, seed=0)) == 0
    data = sources.load_har_data("synthetic", val_fraction=0, synthetic_windows_per_subject=2)
    assert len(data.val) == 0 and len(np.unique(data.train.subjects)) == 21


def test_hold_out_subjects_needs_two_subjects():
    with pytest.raises(DataError):
        splits.hold_out_subjects(np.array([4, 4, 4]), 0.5, seed=0)


def test_fit_normalization_uses_only_given_array():
    rng = np.random.default_rng(0)
    train = (rng.standard_normal((20, 4, STEPS)) * [[[1.0], [2.0], [0.5], [3.0]]]
             + [[[5.0], [-2.0], [0.0], [10.0]]]).astype(np.float32)
    test = (rng.standard_normal((10, 4, STEPS)) * 7 + 100).astype(np.float32)
    mean, std = splits.fit_normalization(train)
    assert mean.shape == (4,) and std.shape == (4,)
    assert mean.dtype == np.float32 and std.dtype == np.float32
    np.testing.assert_allclose(mean, train.astype(np.float64).mean(axis=(0, 2)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(std, train.astype(np.float64).std(axis=(0, 2)), rtol=1e-5)
    # Nothing from the other array leaks in.
    assert np.all(np.abs(mean - 100) > 50)

    normed = splits.normalize(splits.Split(train, np.zeros(20, np.int64), np.ones(20, np.int64)),
                              mean, std)
    assert normed.signals.dtype == np.float32
    np.testing.assert_allclose(normed.signals.mean(axis=(0, 2)), 0, atol=1e-4)
    np.testing.assert_allclose(normed.signals.std(axis=(0, 2)), 1, atol=1e-4)
    # The test split, normalised with train statistics, is clearly not standardised.
    normed_test = splits.normalize(splits.Split(test, np.zeros(10, np.int64), np.ones(10, np.int64)),
                                   mean, std)
    assert np.all(np.abs(normed_test.signals.mean(axis=(0, 2))) > 1)


def test_fit_normalization_constant_channel_is_safe():
    signals = np.ones((3, 2, STEPS), np.float32)
    mean, std = splits.fit_normalization(signals)
    assert np.all(std > 0)
    normed = splits.normalize(splits.Split(signals, np.zeros(3, np.int64), np.zeros(3, np.int64)),
                              mean, std)
    assert np.all(np.isfinite(normed.signals))


@pytest.mark.parametrize("mode,channels", [("flatten", 9), ("average", 3), ("first", 3)])
def test_load_har_data_synthetic(mode, channels):
    data = sources.load_har_data(dataset="synthetic", mode=mode, synthetic_windows_per_subject=10)
    assert data.source == "synthetic"
    train_s = set(np.unique(data.train.subjects).tolist())
    val_s = set(np.unique(data.val.subjects).tolist())
    test_s = set(np.unique(data.test.subjects).tolist())
    assert val_s and train_s
    assert not train_s & val_s
    assert test_s == set(synthetic.TEST_SUBJECTS)
    assert not test_s & (train_s | val_s)
    assert train_s | val_s == set(range(1, 31)) - set(synthetic.TEST_SUBJECTS)
    n_train_subjects = 30 - len(synthetic.TEST_SUBJECTS)
    assert len(val_s) == round(0.2 * n_train_subjects)
    for split in (data.train, data.val, data.test):
        assert split.signals.shape[1:] == (channels, STEPS)
        assert len(split.signals) == len(split.labels) == len(split.subjects)
    assert len(data.channel_names) == channels
    assert data.class_names == uci_har.CLASS_NAMES
    assert len(data.train) + len(data.val) + len(data.test) == 30 * 10


def test_load_har_data_uci_without_dataset_raises(tmp_path):
    with pytest.raises(DataError, match="UCI HAR"):
        sources.load_har_data(dataset="uci-har", data_dir=tmp_path)
    with pytest.raises(DataError):
        sources.load_har_data(dataset="uci-har", data_dir=None)


def test_load_har_data_unknown_dataset_raises():
    with pytest.raises(DataError, match="dataset"):
        sources.load_har_data(dataset="mnist", synthetic_windows_per_subject=5)


def test_load_har_data_auto_picks_uci_when_present(fake_uci, tmp_path):
    root, arrays = fake_uci
    for data_dir in (tmp_path, root):
        data = sources.load_har_data(dataset="auto", data_dir=data_dir, val_fraction=0.3)
        assert data.source == "uci-har"
        assert len(data.train) + len(data.val) == len(arrays["train"][1])
        assert np.array_equal(np.sort(data.test.subjects), np.sort(arrays["test"][2]))
        # Three training subjects, fewer than MIN_VALIDATION_SUBJECTS: the end of each one's windows validates.
        assert set(data.train.subjects.tolist()) == set(data.val.subjects.tolist()) == set(arrays["train"][2].tolist())
        assert data.train.signals.shape[1:] == (9, STEPS)


def test_load_har_data_uci_explicit(fake_uci):
    root, arrays = fake_uci
    data = sources.load_har_data(dataset="uci-har", data_dir=root, mode="first")
    assert data.source == "uci-har"
    assert np.array_equal(data.test.signals, arrays["test"][0][:, :3])
    assert np.array_equal(data.test.labels, arrays["test"][1] - 1)


def test_load_har_data_auto_uses_synthetic_only_without_data_dir(tmp_path):
    data = sources.load_har_data(dataset="auto", data_dir=None, synthetic_windows_per_subject=5)
    assert data.source == "synthetic"
    # A --data-dir that holds no data of any kind is refused, naming what each kind reads, never replaced by
    # the synthetic data.
    with pytest.raises(DataError, match="holds no data of a kind this trainer reads.*UCI HAR Dataset"):
        sources.load_har_data(dataset="auto", data_dir=tmp_path, synthetic_windows_per_subject=5)


def test_load_har_data_rejects_zero_synthetic_windows():
    with pytest.raises(DataError):
        sources.load_har_data(dataset="synthetic", synthetic_windows_per_subject=0)


# ---------------------------------------------------------------------------
# 4. loaders.py
# ---------------------------------------------------------------------------

def _rank_indices(n, world, pad, shuffle=True, seed=0, epoch=0):
    out = []
    for rank in range(world):
        sampler = loaders.ShardedSampler(n, world_size=world, rank=rank, shuffle=shuffle,
                                         seed=seed, pad=pad)
        sampler.set_epoch(epoch)
        indices = list(sampler)
        assert len(indices) == len(sampler)
        out.append(indices)
    return out


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("n", [1, 2, 10, 11, 12])
def test_sharded_sampler_no_pad_is_exact_partition(world, n):
    per_rank = _rank_indices(n, world, pad=False)
    union = [i for indices in per_rank for i in indices]
    assert sorted(union) == list(range(n))  # every index once, no duplicates


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("n", [1, 2, 10, 11, 12])
def test_sharded_sampler_pad_gives_equal_lengths(world, n):
    per_rank = _rank_indices(n, world, pad=True)
    lengths = {len(indices) for indices in per_rank}
    assert lengths == {-(-n // world)}
    union = [i for indices in per_rank for i in indices]
    assert set(union) == set(range(n))
    assert len(union) - n < world  # at most world - 1 repeats


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("pad", [False, True])
def test_sharded_sampler_rank_strides_epoch_order(world, pad):
    n = 12  # divisible by 1, 2, 3: padding adds nothing
    per_rank = _rank_indices(n, world, pad=pad, seed=5, epoch=2)
    order = loaders.epoch_order(n, 5, 2)
    for rank, indices in enumerate(per_rank):
        assert indices == order[rank::world].tolist()


@pytest.mark.parametrize("world", [2, 3])
def test_sharded_sampler_no_pad_rank_strides_epoch_order_uneven(world):
    n = 11
    per_rank = _rank_indices(n, world, pad=False, seed=1, epoch=3)
    order = loaders.epoch_order(n, 1, 3)
    for rank, indices in enumerate(per_rank):
        assert indices == order[rank::world].tolist()


def test_sharded_sampler_set_epoch_changes_order():
    sampler = loaders.ShardedSampler(50, world_size=1, rank=0, seed=0, pad=False)
    sampler.set_epoch(0)
    epoch0 = list(sampler)
    assert list(sampler) == epoch0  # iterating again, same epoch, same order
    sampler.set_epoch(1)
    epoch1 = list(sampler)
    assert epoch1 != epoch0
    assert sorted(epoch1) == sorted(epoch0)
    sampler.set_epoch(0)
    assert list(sampler) == epoch0
    fresh = loaders.ShardedSampler(50, world_size=1, rank=0, seed=0, pad=False)
    fresh.set_epoch(1)
    assert list(fresh) == epoch1


def test_sharded_sampler_seed_changes_order():
    a = list(loaders.ShardedSampler(50, seed=0, pad=False))
    b = list(loaders.ShardedSampler(50, seed=1, pad=False))
    assert a != b and sorted(a) == sorted(b)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_sharded_sampler_without_shuffle(world):
    n = 10
    per_rank = _rank_indices(n, world, pad=False, shuffle=False, epoch=4)
    for rank, indices in enumerate(per_rank):
        assert indices == list(range(rank, n, world))
    assert _rank_indices(n, 1, pad=False, shuffle=False)[0] == list(range(n))


def _small_split(n=10, channels=9):
    rng = np.random.default_rng(0)
    return splits.Split(rng.standard_normal((n, channels, STEPS)).astype(np.float32),
                        rng.integers(0, N_CLASSES, n).astype(np.int64),
                        rng.integers(1, 4, n).astype(np.int64))


def test_window_dataset_getitems_matches_indexing():
    split = _small_split()
    dataset = loaders.WindowDataset(split)
    assert len(dataset) == len(split)
    indices = [7, 2, 2, 9, 0]
    signals, labels = dataset.__getitems__(indices)
    assert isinstance(signals, torch.Tensor) and isinstance(labels, torch.Tensor)
    assert signals.shape == (5, 9, STEPS) and labels.shape == (5,)
    assert signals.dtype == torch.float32 and labels.dtype == torch.int64
    assert np.array_equal(signals.numpy(), split.signals[indices])
    assert np.array_equal(labels.numpy(), split.labels[indices])
    one_signal, one_label = dataset[3]
    assert np.array_equal(one_signal.numpy(), split.signals[3])
    assert int(one_label) == split.labels[3]


def test_make_loader_batches():
    split = _small_split(n=10, channels=3)
    sampler = loaders.ShardedSampler(len(split), world_size=1, rank=0, seed=0, pad=False)
    loader = loaders.make_loader(split, batch_size=4, sampler=sampler)
    batches = list(loader)
    assert [b[0].shape for b in batches] == [(4, 3, STEPS), (4, 3, STEPS), (2, 3, STEPS)]
    assert [b[1].shape for b in batches] == [(4,), (4,), (2,)]
    order = list(sampler)
    got_signals = torch.cat([b[0] for b in batches]).numpy()
    got_labels = torch.cat([b[1] for b in batches]).numpy()
    assert np.array_equal(got_signals, split.signals[order])
    assert np.array_equal(got_labels, split.labels[order])


def test_make_loader_sharded_ranks_cover_split_once():
    split = _small_split(n=11)
    seen = []
    for rank in range(3):
        sampler = loaders.ShardedSampler(len(split), world_size=3, rank=rank, seed=2, pad=False)
        for signals, labels in loaders.make_loader(split, batch_size=2, sampler=sampler):
            assert signals.shape[1:] == (9, STEPS) and signals.shape[0] <= 2
            seen.extend(labels.tolist())
    assert sorted(seen) == sorted(split.labels.tolist())
