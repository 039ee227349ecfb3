"""No silent wrong answer on a user's own data, and one line where a traceback or a second message
would have been: units that cannot apply or look wrong, --adapt on a recording or group it cannot stand on."""
import warnings

import numpy as np
import pytest
import torch

from inference.adaptation import adaptable_members, member_probabilities, raw_features
from inference.bundle import load_bundle
from inference_fixtures import make_checkpoint, synthetic_stream, write_csv
from test_bad_input import assert_refused, snapshot
from test_predict_new_people import mixed_minirocket, predict  # noqa: F401 (a fixture)
from training.errors import UsageError

OWN_CHANNELS = tuple(f"{place}_{axis}" for place in ("ankle", "hip", "wrist") for axis in "xyz")


def warning_lines(err):
    return [line for line in err.splitlines() if "warning:" in line]


# ---------------------------------------------------------------------------
# Units: refused where they cannot apply, said where the numbers contradict them
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def own_channels_run(tmp_path_factory):
    """A checkpoint of another device's nine channels, read as recorded, and a recording of them."""
    folder = tmp_path_factory.mktemp("own")
    checkpoint = make_checkpoint(folder / "own.pt", channel_names=list(OWN_CHANNELS), preprocessing="raw")
    time_s, acc, gyro = synthetic_stream(30.0)
    columns = np.column_stack([time_s, acc, acc * 0.5, gyro])
    np.savetxt(folder / "device.csv", columns, delimiter=",", header=",".join(("time_s", *OWN_CHANNELS)), comments="")
    return checkpoint, folder / "device.csv"


@pytest.mark.parametrize("flags", [["--acc-unit", "m/s2"], ["--gyro-unit", "deg/s"],
                                   ["--acc-unit", "g", "--gyro-unit", "rad/s"]])
def test_a_unit_for_a_model_of_its_own_channels_is_refused(own_channels_run, tmp_path, flags):
    checkpoint, recording = own_channels_run
    code, _, err = predict(checkpoint, recording, tmp_path / "plain")
    assert code == 0, err  # the model reads the recording; only the unit is in question
    line = assert_refused(predict(checkpoint, recording, tmp_path / "out", *flags), "model's own channels",
                          "acc_x..acc_z", "ankle_x")
    assert all(flag in line for flag in flags if flag.startswith("--"))
    assert not (tmp_path / "out").exists()


def test_acceleration_in_m_s2_read_as_g_is_said_in_one_warning(tmp_path):
    checkpoint = make_checkpoint(tmp_path / "best.pt")
    time_s, acc, gyro = synthetic_stream(30.0)
    in_g = write_csv(tmp_path / "g.csv", time_s, acc, gyro)
    in_m_s2 = write_csv(tmp_path / "m_s2.csv", time_s, acc * 9.81, gyro)
    code, _, err = predict(checkpoint, in_m_s2, tmp_path / "unsaid")
    assert code == 0, err
    assert len(warning_lines(err)) == 1, err
    assert "looks like m/s2" in warning_lines(err)[0] and "pass --acc-unit m/s2" in warning_lines(err)[0]
    for recording, flags, out in ((in_m_s2, ["--acc-unit", "m/s2"], "said"), (in_g, [], "g")):
        code, _, err = predict(checkpoint, recording, tmp_path / out, *flags)
        assert code == 0 and warning_lines(err) == [], err


# ---------------------------------------------------------------------------
# --adapt: a recording too short, or of one activity, has nothing to be standardised on
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("seconds, windows", [(2.56, 1), (6.0, 4), (12.0, 9)])
def test_adapting_a_recording_of_too_few_windows_is_refused(minirocket, tmp_path, seconds, windows):
    short = write_csv(tmp_path / "short.csv", *synthetic_stream(seconds))
    before = snapshot(tmp_path)
    assert_refused(predict(minirocket, short, tmp_path / "out", "--adapt", "recording"),
                   f"gives {windows} window(s), too few to standardise", "at least 10", "drop --adapt",
                   "14.1 s or more")
    assert snapshot(tmp_path) == before


def test_adapting_a_recording_the_model_sees_one_activity_in_is_refused(minirocket, mixed_minirocket, recording,  # noqa: F811
                                                                        tmp_path):
    # The small random MiniRocket calls 22 of the recording's 23 windows one activity.
    line = assert_refused(predict(minirocket, recording, tmp_path / "one", "--adapt", "recording"),
                          "sees one activity", "of 23 windows", "several activities")
    assert "--adapt" in line and not (tmp_path / "one").exists()
    code, out, err = predict(mixed_minirocket, recording, tmp_path / "mixed", "--adapt", "recording")
    assert code == 0 and "features standardised on this recording" in out, err


@pytest.mark.parametrize("adapt", [True])
def test_statistics_of_a_group_of_one_window_are_refused_before_std_could_warn(minirocket, adapt):
    members = adaptable_members(load_bundle(minirocket))
    window = np.random.default_rng(0).standard_normal((1, 9, 128)).astype(np.float32)
    features = [raw_features(member, window, torch.device("cpu")) for member in members]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's std() of one window warns, and gives NaN
        with pytest.raises(UsageError, match="group 2 has 1 window"):
            member_probabilities(members, features, adapt=adapt, group="group 2")
