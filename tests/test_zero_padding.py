"""Windows of unequal lengths padded at their end with zeros, not NaN: the .npz loader reads zeros as
signal, so it warns in one line; NaN padding, a channel at rest and a fixed quiet tail do not warn."""
import numpy as np

from data.npz_windows import load_npz_windows
from data.sources import load_har_data
from test_npz_dataset import windows, write_npz
from test_unequal_lengths import padded_arrays


def warnings_of(path):
    said = []
    load_npz_windows(path, warn=said.append)
    return said


def zero_padded(tmp_path):
    """padded_arrays()'s windows with zeros where they hold NaN, and each window's zero run at its end."""
    arrays, lengths = padded_arrays()
    arrays["signals"] = np.nan_to_num(arrays["signals"], nan=0.0)
    return write_npz(tmp_path / "zeros.npz", **arrays), 40 - lengths


def test_windows_padded_with_zeros_of_unequal_lengths_are_warned_of_once(tmp_path):
    path, runs = zero_padded(tmp_path)
    said = warnings_of(path)
    assert len(said) == 1 and "\n" not in said[0], said
    counted = runs[runs >= 2]
    assert f"{len(counted)} of {len(runs)} windows end in a run of exact zeros on every channel" in said[0]
    assert f"of {counted.min()} to {counted.max()} steps" in said[0]
    assert "which the models read as signal" in said[0] and "constant_values=np.nan" in said[0]


def test_the_warning_reaches_a_run_that_loads_the_file(tmp_path, capsys):
    path, _ = zero_padded(tmp_path)
    data = load_har_data("npz", path)  # a run says data.warnings once its log exists (training/run_inputs.py)
    assert len(data.warnings) == 1 and "padded with zeros" in data.warnings[0]
    assert capsys.readouterr().err == ""  # said by the run's log, not twice
    assert not data.padded  # warned only: the zeros are loaded as they are
    loaded = np.concatenate([data.train.signals, data.val.signals, data.test.signals])
    assert np.count_nonzero(loaded == 0) == np.count_nonzero(np.load(path)["signals"] == 0) > 0


def test_a_command_without_a_run_log_says_it_on_stderr(tmp_path, capsys):
    path, _ = zero_padded(tmp_path)
    load_npz_windows(path)
    err = capsys.readouterr().err
    assert err.startswith("warning: ") and "padded with zeros" in err and err.count("\n") == 1


def test_the_same_windows_padded_with_nan_are_not_warned_of(tmp_path):
    arrays, _ = padded_arrays()
    assert warnings_of(write_npz(tmp_path / "nan.npz", **arrays)) == []


def test_a_run_of_zeros_on_one_channel_only_is_signal(tmp_path):
    arrays = windows()
    for index, window in enumerate(arrays["signals"]):
        window[1, 40 - 2 - index % 10:] = 0.0  # runs of 2 to 11 steps, on one channel of four
    assert warnings_of(write_npz(tmp_path / "one.npz", **arrays)) == []


def test_one_quiet_tail_on_every_window_is_not_padding_of_unequal_lengths(tmp_path):
    arrays = windows()
    arrays["signals"][:, :, -5:] = 0.0  # a sensor that stops 5 steps before every window's end
    assert warnings_of(write_npz(tmp_path / "tail.npz", **arrays)) == []


def test_a_few_windows_ending_in_zeros_are_below_the_share_that_warns(tmp_path):
    arrays = windows()  # 48 windows: the share that warns is 5
    for window, run in zip(arrays["signals"][:4], (2, 3, 4, 5), strict=True):
        window[:, -run:] = 0.0
    assert warnings_of(write_npz(tmp_path / "few.npz", **arrays)) == []
    arrays["signals"][4, :, -6:] = 0.0
    assert len(warnings_of(write_npz(tmp_path / "fifth.npz", **arrays))) == 1


def test_scoring_such_windows_says_it_on_stderr(tmp_path, capsys):
    """predict.py and evaluate read the windows again, without a run's log: they say it themselves."""
    from inference.evaluate import splits_as_trained
    from training.config.settings import RunConfig
    path, _ = zero_padded(tmp_path)
    splits_as_trained(RunConfig(), "npz", path)
    err = capsys.readouterr().err
    assert err.count("warning: ") == 1 and "padded with zeros" in err
