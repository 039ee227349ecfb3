"""No silent wrong answer on a user's own data, and one line where a traceback or a second message
would have been: units that cannot apply or look wrong, --adapt on a recording it cannot stand on,
and the recording study over folders and recordings it cannot use."""
import json
import shutil
import warnings

import numpy as np
import pytest
import torch

from inference.bundle import load_bundle
from inference_fixtures import make_checkpoint, synthetic_stream, write_csv
from studies import recording_accuracy
from test_bad_input import assert_refused, snapshot
from test_predict_new_people import mixed_minirocket, predict  # noqa: F401 (a fixture)
from test_trust_inputs import run_command, walk_then_sit
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


# ---------------------------------------------------------------------------
# The recording study: outer folds by their own names, recordings too short to standardise on
# ---------------------------------------------------------------------------

def finished_outer_fold(folder, checkpoint, subjects):
    folder.mkdir(parents=True)
    shutil.copy(checkpoint, folder / "best.pt")
    (folder / "nested_identity.json").write_text(json.dumps({"inputs": {"subjects": subjects}}))


def test_the_recording_study_skips_folders_not_named_as_outer_folds(minirocket, tmp_path):
    nested = tmp_path / "nested"
    for name in ("outer-0", "outer-0.bak", "outer-2-old", "outer-x"):  # copies kept beside the real one
        finished_outer_fold(nested / name, minirocket, [1])
    code, out, err = run_command(recording_accuracy.main, "--nested", nested, "--recordings", tmp_path / "none.npz")
    assert_refused((code, out, err), "--recordings")  # the study's next check: folding went through
    assert len(warning_lines(err)) == 1 and "skipping outer-0.bak, outer-2-old, outer-x" in err, err
    assert recording_accuracy.folds_of(nested) == [(nested / "outer-0" / "best.pt", [1])]


def short_then_long_recordings(path, short_samples):
    """Person 1's recording of `short_samples` at 50 Hz, person 2's long enough to learn transitions on."""
    quiet = np.zeros((1280, 3), np.float32)
    np.savez(path, u01_s0_label=np.full(short_samples, 1, np.int8), u01_s0_acc=np.zeros((short_samples, 3)),
             u01_s0_gyro=np.zeros((short_samples, 3)), u02_s0_label=walk_then_sit(), u02_s0_acc=quiet,
             u02_s0_gyro=quiet)
    return path


@pytest.mark.parametrize("samples, windows", [(128, 1), (400, 6)])
def test_the_recording_study_refuses_a_recording_too_short_to_standardise_on(minirocket, tmp_path, samples,
                                                                              windows):
    archive = short_then_long_recordings(tmp_path / "recordings.npz", samples)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's std() of one window warned, and gave NaN
        result = run_command(recording_accuracy.main, "--checkpoint", minirocket, "--recordings", archive,
                             "--subjects", "1", "--device", "cpu")
    assert_refused(result, f"recording u01_s0 of --recordings gives {windows} window(s), too few to standardise",
                   "leave it out")


def test_the_study_s_statistics_refuse_a_group_of_one_window_without_a_warning(minirocket):
    scorer = recording_accuracy.Scorer(load_bundle(minirocket), torch.device("cpu"))
    windows = np.random.default_rng(0).standard_normal((13, 9, 128)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UsageError, match="group 2 has 1 window"):
            scorer.per_mode(windows, groups=[1] * 12 + [2])
