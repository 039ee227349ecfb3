"""The signal chain predict.py applies to a recording: UCI HAR windows, resampling, windowing."""
import numpy as np
import pytest
from scipy.signal import butter, filtfilt, medfilt

from data import uci_har
from data.preprocess import cut_windows, uci_har_channels, window_starts
from data.recordings import Recording
from data.resample import on_model_clock, resample, to_uniform
from inference.bundle import load_bundle
from inference.classify import recording_windows
from inference_fixtures import RATE_HZ, make_checkpoint, synthetic_stream

WINDOW = uci_har.WINDOW_STEPS


def reference_uci_windows(acc, gyro, labels):
    """UCI HAR windows written independently of data/preprocess.py, the way the HAPT recordings
    were cut into the UCI layout: median(3), 20 Hz and 0.3 Hz Butterworth, 128 steps every 64,
    wholly inside one labelled stretch."""
    b20, a20 = butter(3, 20 / 25.0)
    b03, a03 = butter(3, 0.3 / 25.0)
    total = np.stack([filtfilt(b20, a20, medfilt(acc[:, i], 3)) for i in range(3)])
    body_gyro = np.stack([filtfilt(b20, a20, medfilt(gyro[:, i], 3)) for i in range(3)])
    body = total - np.stack([filtfilt(b03, a03, total[i]) for i in range(3)])
    stream = np.concatenate([body, body_gyro, total])
    edges = np.flatnonzero(np.diff(labels)) + 1
    windows, starts, ys = [], [], []
    for first, stop in zip(np.r_[0, edges], np.r_[edges, len(labels)], strict=True):
        for start in range(first, stop - WINDOW + 1, WINDOW // 2):
            windows.append(stream[:, start:start + WINDOW])
            starts.append(start)
            ys.append(labels[first])
    return np.stack(windows), np.array(starts), np.array(ys)


def write_uci_split(root, split, windows, labels, subject):
    inertial = root / split / "Inertial Signals"
    inertial.mkdir(parents=True)
    for channel, name in enumerate(uci_har.SIGNAL_NAMES):
        np.savetxt(inertial / f"{name}_{split}.txt", windows[:, channel], fmt="%15.7e", delimiter="")
    np.savetxt(root / split / f"y_{split}.txt", labels, fmt="%d")
    np.savetxt(root / split / f"subject_{split}.txt", np.full(len(labels), subject), fmt="%d")


def test_recording_windows_match_the_uci_loader_for_the_same_stream(tmp_path):
    _, acc, gyro = synthetic_stream(60.0)
    # Stretches start on multiples of 64 samples, so predict's stride-64 grid meets the dataset's cut.
    labels = np.repeat([1, 4, 2, 6], [1024, 640, 896, len(acc) - 2560])
    windows, starts, ys = reference_uci_windows(acc, gyro, labels)
    root = tmp_path / "UCI HAR Dataset"
    write_uci_split(root, "train", windows, ys, subject=1)
    write_uci_split(root, "test", windows[:4], ys[:4], subject=2)
    loaded, loaded_labels, _ = uci_har.load_split(root, "train")
    assert np.array_equal(loaded_labels, ys - 1)

    bundle = load_bundle(make_checkpoint(tmp_path / "model.pt"))
    cut = recording_windows(bundle, Recording(acc, gyro, None, "stream"), stride_steps=64, sample_rate_hz=RATE_HZ)
    position = {int(start): index for index, start in enumerate(cut.start_steps)}
    assert set(starts) <= set(position)
    ours = cut.windows[[position[int(start)] for start in starts]]
    assert ours.shape == loaded.shape == (len(starts), 9, WINDOW)
    # The text files keep 8 significant digits.
    np.testing.assert_allclose(ours, loaded, rtol=1e-6, atol=1e-6)


def test_gravity_split_of_a_still_tilted_device():
    acc = np.tile([0.6, 0.8, 0.0], (2000, 1))
    channels = uci_har_channels(acc, np.zeros((2000, 3)), RATE_HZ)
    np.testing.assert_allclose(channels["total_acc_x"], 0.6, atol=1e-6)
    np.testing.assert_allclose(channels["total_acc_y"], 0.8, atol=1e-6)
    assert np.max(np.abs(channels["body_acc_y"])) < 1e-6
    assert np.max(np.abs(channels["body_gyro_z"])) == 0


def test_window_starts_cover_the_tail():
    assert window_starts(127, 128, 64).tolist() == []
    assert window_starts(128, 128, 64).tolist() == [0]
    assert window_starts(300, 128, 64).tolist() == [0, 64, 128, 172]
    assert window_starts(320, 128, 64).tolist() == [0, 64, 128, 192]
    stream = np.arange(2 * 300, dtype=np.float32).reshape(2, 300)
    windows = cut_windows(stream, window_starts(300, 128, 64), 128)
    assert windows.shape == (4, 2, 128)
    assert windows[3, 1, -1] == stream[1, -1] and windows[1, 0, 0] == stream[0, 64]


def sines(time_s):
    """[n, 3] of slow tones well under every Nyquist frequency here."""
    return np.stack([np.sin(2 * np.pi * 1.3 * time_s), 1 + 0.5 * np.cos(2 * np.pi * 0.7 * time_s),
                     0.2 * np.sin(2 * np.pi * 3.1 * time_s + 1)], axis=1)


@pytest.mark.parametrize("source_hz", [100.0, 200.0, 30.0, 47.3])
def test_resampling_to_the_model_rate_keeps_the_signal(source_hz):
    time_s = np.arange(int(40 * source_hz)) / source_hz
    resampled = resample(sines(time_s), source_hz, RATE_HZ)
    expected = sines(np.arange(len(resampled)) / RATE_HZ)
    assert abs(len(resampled) - 40 * RATE_HZ) <= 1
    middle = slice(100, len(resampled) - 100)  # away from the filter's edges
    np.testing.assert_allclose(resampled[middle], expected[middle], atol=2e-3)


def test_jittered_time_stamps_are_put_on_a_uniform_grid():
    rng = np.random.default_rng(0)
    time_s = 5.0 + np.cumsum(rng.uniform(0.008, 0.012, 4000))  # ~100 Hz with 20% jitter
    uniform = to_uniform(sines(time_s), time_s, 100.0)
    grid = time_s[0] + np.arange(len(uniform)) / 100.0
    assert grid[-1] <= time_s[-1]
    np.testing.assert_allclose(uniform, sines(grid), atol=5e-3)


def test_recording_on_the_model_clock_from_time_stamps():
    time_s = 12.0 + np.arange(6000) / 100.0
    values = sines(time_s)
    recording = Recording(values, values[:, ::-1].copy(), time_s, "r")
    acc, gyro, start_s, source_hz = on_model_clock(recording, RATE_HZ)
    assert start_s == 12.0 and source_hz == pytest.approx(100.0)
    assert acc.shape == gyro.shape == (3000, 3)
    expected = sines(12.0 + np.arange(3000) / RATE_HZ)
    np.testing.assert_allclose(acc[100:-100], expected[100:-100], atol=2e-3)
    np.testing.assert_allclose(gyro[100:-100], expected[100:-100, ::-1], atol=2e-3)


@pytest.mark.parametrize("source_hz", [100.0, 30.0])
def test_resampling_keeps_gravity_up_to_the_ends(source_hz):
    # Zero padding would pull a steady 1 g towards 0 at both ends and fake motion there.
    steady = np.tile([1.0, 0.0, -0.2], (int(20 * source_hz), 1))
    np.testing.assert_allclose(resample(steady, source_hz, RATE_HZ), steady[:1].repeat(1000, axis=0), atol=1e-3)
