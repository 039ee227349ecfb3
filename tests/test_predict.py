"""predict.py end to end: recordings in, windows.csv / timeline.csv / timeline.png out; evaluation
without training; every bad input refused in one line with nothing in --out touched."""
import contextlib
import csv
import importlib
import io
import json

import numpy as np
import pytest
import torch

from conftest import TINY_DATA, run_in_process
from data.uci_har import CLASS_NAMES
from inference_fixtures import RATE_HZ, make_checkpoint, synthetic_stream, write_csv
from test_bad_input import assert_refused, hostile_checkpoint, snapshot, write_fake_uci
from training.entry_point import run_entry_point

OUTPUTS = ("windows.csv", "timeline.csv", "timeline.png")


def run_script(module_name, argv):
    """(exit code, stdout, stderr) of an entry point's main (predict, export, inference.ensemble),
    through the CLI wrapper."""
    module = importlib.import_module(module_name)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = run_entry_point(module.main, [str(arg) for arg in argv])
        except SystemExit as exc:  # argparse
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def read_rows(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("ckpt") / "best.pt")


@pytest.fixture(scope="module")
def stream():
    return synthetic_stream(30.0)


@pytest.fixture(scope="module")
def recording(tmp_path_factory, stream):
    return write_csv(tmp_path_factory.mktemp("rec") / "walk.csv", *stream)


def predict(checkpoint, recording, out, *flags):
    return run_script("predict", ["--checkpoint", checkpoint, "--recording", recording, "--out", out, *flags])


def test_recording_outputs(checkpoint, recording, tmp_path):
    code, out, err = predict(checkpoint, recording, tmp_path / "out")
    assert code == 0, err
    windows = read_rows(tmp_path / "out" / "windows.csv")
    assert list(windows[0]) == ["start_s", "end_s", "predicted", "confidence", *CLASS_NAMES]
    # 1500 samples at 50 Hz: windows every 64 from 0 to 1344, then one ending at the last sample.
    starts = [float(row["start_s"]) for row in windows]
    np.testing.assert_allclose(starts, [*(np.arange(0, 1345, 64) / RATE_HZ), (1500 - 128) / RATE_HZ], atol=1e-3)
    for row in windows:
        assert float(row["end_s"]) == pytest.approx(float(row["start_s"]) + 2.56, abs=1e-3)
        probs = np.array([float(row[name]) for name in CLASS_NAMES])
        assert probs.sum() == pytest.approx(1.0, abs=1e-3)
        assert row["predicted"] == CLASS_NAMES[int(np.argmax(probs))]
        assert float(row["confidence"]) == pytest.approx(probs.max(), abs=1e-4)
    timeline = read_rows(tmp_path / "out" / "timeline.csv")
    assert list(timeline[0]) == ["start_s", "end_s", "activity", "confidence"]
    assert float(timeline[0]["start_s"]) == 0.0 and float(timeline[-1]["end_s"]) == pytest.approx(30.0, abs=1e-3)
    for before, after in zip(timeline, timeline[1:], strict=False):
        assert before["end_s"] == after["start_s"] and before["activity"] != after["activity"]
    assert (tmp_path / "out" / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "windows" in out and all(name in out for name in CLASS_NAMES)


def test_recording_matches_the_model_on_the_same_windows(checkpoint, stream, tmp_path):
    # The probabilities in windows.csv are the checkpoint's model applied to its normalised windows.
    from data.recordings import Recording
    from inference.bundle import load_bundle
    from inference.classify import recording_windows
    time_s, acc, gyro = stream
    code, _, err = predict(checkpoint, write_csv(tmp_path / "r.csv", time_s, acc, gyro), tmp_path / "out")
    assert code == 0, err
    bundle = load_bundle(checkpoint)
    windows = recording_windows(bundle, Recording(acc, gyro, time_s, "r")).windows
    state = torch.load(checkpoint, weights_only=True)
    mean, std = state["normalization"]["mean"][None, :, None], state["normalization"]["std"][None, :, None]
    with torch.no_grad():  # the bare network, normalised here
        expected = torch.softmax(bundle.model.model((torch.from_numpy(windows) - mean) / std), dim=1).numpy()
    rows = read_rows(tmp_path / "out" / "windows.csv")
    written = np.array([[float(row[name]) for name in CLASS_NAMES] for row in rows])
    np.testing.assert_allclose(written, expected, atol=1e-3)


def test_npz_csv_units_and_rates_agree(checkpoint, stream, tmp_path):
    time_s, acc, gyro = stream
    code, _, err = predict(checkpoint, write_csv(tmp_path / "g.csv", time_s, acc, gyro), tmp_path / "a")
    assert code == 0, err
    reference = read_rows(tmp_path / "a" / "windows.csv")
    np.savez(tmp_path / "r.npz", acc=acc, gyro=gyro)
    converted = write_csv(tmp_path / "si.csv", None, acc * 9.80665, np.degrees(gyro))
    for name, recording, flags in (("b", tmp_path / "r.npz", ["--sample-rate", "50"]),
                                   ("c", converted, ["--sample-rate", "50", "--acc-unit", "m/s2",
                                                     "--gyro-unit", "deg/s"])):
        code, _, err = predict(checkpoint, recording, tmp_path / name, *flags)
        assert code == 0, err
        rows = read_rows(tmp_path / name / "windows.csv")
        assert [row["start_s"] for row in rows] == [row["start_s"] for row in reference]
        for row, expected in zip(rows, reference, strict=True):
            assert abs(float(row["confidence"]) - float(expected["confidence"])) < 2e-3


def test_a_100_hz_recording_is_resampled(checkpoint, tmp_path):
    time_s, acc, gyro = synthetic_stream(30.0, rate_hz=100.0)
    code, out, err = predict(checkpoint, write_csv(tmp_path / "fast.csv", time_s, acc, gyro), tmp_path / "out")
    assert code == 0, err
    assert "100 Hz" in out
    windows = read_rows(tmp_path / "out" / "windows.csv")
    assert len(windows) == 23  # as many as the same 30 s at 50 Hz
    assert float(windows[-1]["end_s"]) == pytest.approx(30.0, abs=0.02)


@pytest.mark.parametrize("smooth", [[], ["--smooth", "median"], ["--smooth", "hmm"], ["--smooth"]])
def test_smoothing_gives_fewer_or_as_many_segments(checkpoint, recording, tmp_path, smooth):
    code, out, _ = predict(checkpoint, recording, tmp_path / "raw", "--smooth", "none")
    assert code == 0 and " smoothing)" not in out
    code, out, err = predict(checkpoint, recording, tmp_path / "smooth", *smooth)
    assert code == 0, err
    assert ("hmm smoothing" if smooth[-1:] in (["hmm"], ["--smooth"]) else "median smoothing") in out  # median: default
    assert len(read_rows(tmp_path / "smooth" / "timeline.csv")) <= len(read_rows(tmp_path / "raw" / "timeline.csv"))


def test_acc_only_recording_with_a_body_acc_checkpoint(tmp_path):
    time_s, acc, _ = synthetic_stream(10.0)
    checkpoint = make_checkpoint(tmp_path / "first.pt", mode="first")
    code, _, err = predict(checkpoint, write_csv(tmp_path / "acc.csv", time_s, acc, None), tmp_path / "out")
    assert code == 0, err


def test_checkpoint_from_training_predicts(tmp_path, recording):
    # The metadata predict.py reads is what the trainer writes.
    code, _, err = run_in_process("main.py", [*TINY_DATA, "--synthetic-windows-per-subject", "8", "--epochs", "1",
                                              "--save-dir", tmp_path / "run"])
    assert code == 0, err
    state = torch.load(tmp_path / "run" / "best.pt", weights_only=True)
    assert (state["sample_rate_hz"], state["window_steps"], state["preprocessing"]) == (50.0, 128, "uci-har")
    code, _, err = predict(tmp_path / "run" / "best.pt", recording, tmp_path / "out", "--smooth")
    assert code == 0, err


def test_evaluation_without_training(checkpoint, tmp_path):
    root = write_fake_uci(tmp_path / "UCI HAR Dataset")
    code, out, err = run_script("predict", ["--checkpoint", checkpoint, "--data-dir", root, "--out", tmp_path / "eval"])
    assert code == 0, err
    report = json.loads((tmp_path / "eval" / "test_report.json").read_text())
    assert report["num_samples"] == 6 and report["split"] == "test"
    matrix = np.array(report["confusion_matrix"])
    assert matrix.sum() == 6 and report["accuracy"] == pytest.approx(np.trace(matrix) / 6)
    # The report agrees with the model run by hand on the normalised test windows.
    from data.uci_har import load_split
    from inference.bundle import load_bundle
    signals, labels, _ = load_split(root, "test")
    state = torch.load(checkpoint, weights_only=True)
    normalised = (torch.from_numpy(signals) - state["normalization"]["mean"][None, :, None]) / \
        state["normalization"]["std"][None, :, None]
    with torch.no_grad():
        predicted = load_bundle(checkpoint).model.model(normalised).argmax(dim=1).numpy()
    assert report["accuracy"] == pytest.approx(float(np.mean(predicted == labels)))
    assert (tmp_path / "eval" / "confusion_matrix.png").read_bytes()[:4] == b"\x89PNG"
    subjects = load_split(root, "test")[2]
    for subject, row in report["per_subject"].items():
        mine = subjects == int(subject)
        assert row == {"accuracy": pytest.approx(float(np.mean(predicted[mine] == labels[mine]))),
                       "windows": int(mine.sum())}
    assert report["per_subject"][report["worst_subject"]]["accuracy"] == \
        min(row["accuracy"] for row in report["per_subject"].values())
    assert f"worst: subject {report['worst_subject']}" in out


# ---------------------------------------------------------------------------
# Bad input: one line, exit 2, and --out as it was
# ---------------------------------------------------------------------------

@pytest.fixture
def out_dir(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "keep.txt").write_text("results worth keeping\n")
    return folder


def refuse(argv, out_dir, *names):
    before = snapshot(out_dir)
    line = assert_refused(run_script("predict", argv), *names)
    assert snapshot(out_dir) == before
    return line


def bad_recording(tmp_path, case):
    time_s, acc, gyro = synthetic_stream(10.0)
    path = tmp_path / f"{case}.csv"
    if case == "short":
        return write_csv(path, time_s[:100], acc[:100], gyro[:100])
    if case == "repeated-column":
        return write_csv(path, time_s, acc, gyro, header=["time_s", "acc_x", "acc_y", "gyro_z", "gyro_x", "gyro_y",
                                                          "gyro_z"])
    if case == "misspelt-column":
        return write_csv(path, time_s, acc, gyro, header=["time_s", "acc_x", "acc_y", "acc_Z", "gyro_x", "gyro_y",
                                                          "gyro_z"])
    if case in ("nan", "inf"):
        acc = acc.copy()
        acc[200, 1] = np.nan if case == "nan" else np.inf
        return write_csv(path, time_s, acc, gyro)
    if case == "time-backwards":
        time_s = time_s.copy()
        time_s[300] = time_s[298]
        return write_csv(path, time_s, acc, gyro)
    if case == "time-in-ms":
        return write_csv(path, time_s * 1000, acc, gyro)
    if case == "gap":  # the phone stopped for an hour after sample 250
        return write_csv(path, np.where(np.arange(len(time_s)) >= 250, time_s + 3600.0, time_s), acc, gyro)
    raise ValueError(case)


@pytest.mark.parametrize("case, names", [
    ("short", ["shorter than one window"]),
    ("repeated-column", ["repeated column"]),
    ("misspelt-column", ["unknown column 'acc_Z'", "acc_z"]),
    ("nan", ["NaN or infinity", "sample 201"]),
    ("inf", ["NaN or infinity", "sample 201"]),
    ("time-backwards", ["time_s does not increase", "sample 301"]),
    ("time-in-ms", ["0.05 Hz", "time"]),
    ("gap", ["no samples for 3.6e+03 s", "sample 250", "split the recording"]),
])
def test_bad_recording(case, names, checkpoint, out_dir, tmp_path):
    recording = bad_recording(tmp_path, case)
    refuse(["--checkpoint", checkpoint, "--recording", recording, "--out", out_dir], out_dir, *names)


@pytest.mark.parametrize("content, names", [
    (b"", ["is empty"]),
    # numpy's own message counts rows after the header (from 0 here): the line is the file's.
    (b"time_s,acc_x,acc_y,acc_z\n0,1,0,0\n\n# a comment\n0.02,1,0,abc\n",
     ["not a table of numbers", "line 5, column acc_z: 'abc' is not a number"]),
    (b"time_s,acc_x,acc_y,acc_z\n0,1,0,0\n0.02,1,0\n", ["line 3 has 3 values where the header names 4 columns"]),
    # Read as numpy reads: no quoting, ASCII digits only, no field limit, any bytes in a comment.
    (b'time_s,acc_x,acc_y,acc_z\n0,1_0,0,0\n"0",1,0,0\n' + b'0,1,0,' + b"a" * 200_000 + b"\n",
     ["line 2, column acc_x: '1_0' is not a number"]),
    (b'time_s,acc_x,acc_y,acc_z\n' + b'0,0,0,0\n' * 2000 + b'"0",1,0,0\n' + b'1,0,0,0 # mesur\xe9\n',
     ["line 2002, column time_s: '\"0\"' is not a number"]),
    (b"time_s,acc_x,acc_y,acc_z\n0,1,0\n", ["rows have 3 values", "4 columns"]),
    (b"time_s,acc_x,acc_y,acc_z\n\xff\xfe\x00\x81\n", ["cannot be read"]),
    (b"\ntime_s,acc_x,acc_y,acc_z\n0,1,0,0\n", ["starts with a blank line"]),
    # A quote left open runs the first "line" on through the file: cut short in the message, or past the
    # csv module's field limit (128 KiB), refused as such.
    (b'"time_s,acc_x,acc_y,acc_z\n' + b"0,1,0,0\n" * 100,
     ["unknown column 'time_s,acc_x,acc_y,acc_z\\n0,1,0,0\\n0,1,0,0...'"]),
    (b'"time_s,acc_x,acc_y,acc_z\n' + b"0,1,0,0\n" * 20_000, ["not a row of column names", "field limit"]),
], ids=["empty", "text", "one-short-row", "numpy-grammar", "latin-1-comment", "short-row", "binary",
        "blank-first-line", "open-quote", "open-quote-long"])
def test_recording_that_is_not_a_table(content, names, checkpoint, out_dir, tmp_path):
    path = tmp_path / "odd.csv"
    path.write_bytes(content)
    refuse(["--checkpoint", checkpoint, "--recording", path, "--out", out_dir, "--sample-rate", "50"], out_dir,
           "odd.csv", *names)


def test_a_header_without_rows_is_one_line(checkpoint, out_dir, tmp_path, recwarn):
    path = tmp_path / "header.csv"
    path.write_text("time_s,acc_x,acc_y,acc_z,gyro_x,gyro_y,gyro_z\n")
    code, _, err = run_script("predict", ["--checkpoint", checkpoint, "--recording", path, "--out", out_dir])
    assert code == 2 and err.count("\n") == 1 and "header.csv" in err, err
    assert not [str(warning.message) for warning in recwarn if "loadtxt" in str(warning.message)]


def test_missing_accelerometer_axis(checkpoint, out_dir, tmp_path):
    time_s, acc, gyro = synthetic_stream(10.0)
    path = tmp_path / "two-axes.csv"
    np.savetxt(path, np.c_[time_s, acc[:, :2], gyro], delimiter=",", comments="",
               header="time_s,acc_x,acc_y,gyro_x,gyro_y,gyro_z")
    refuse(["--checkpoint", checkpoint, "--recording", path, "--out", out_dir], out_dir, "missing", "acc_z")


@pytest.mark.parametrize("flags, names", [
    ([], ["no time_s column", "--sample-rate"]),
    (["--sample-rate", "5000"], ["5000 Hz", "--sample-rate", "far from the model's 50 Hz"]),
    (["--sample-rate", "3"], ["3 Hz", "--sample-rate"]),
    (["--sample-rate", "-50"], ["--sample-rate must be a positive"]),
])
def test_sample_rate_without_time_column(flags, names, checkpoint, out_dir, tmp_path):
    _, acc, gyro = synthetic_stream(10.0)
    path = write_csv(tmp_path / "untimed.csv", None, acc, gyro)
    refuse(["--checkpoint", checkpoint, "--recording", path, "--out", out_dir, *flags], out_dir, *names)


@pytest.mark.parametrize("mode", ["flatten", "average"])
def test_checkpoint_needs_channels_the_recording_lacks(mode, out_dir, tmp_path):
    time_s, acc, _ = synthetic_stream(10.0)
    checkpoint = make_checkpoint(tmp_path / f"{mode}.pt", mode=mode)
    refuse(["--checkpoint", checkpoint, "--recording", write_csv(tmp_path / "acc.csv", time_s, acc, None),
            "--out", out_dir], out_dir, f"--mode {mode}", "no gyroscope")


def test_out_that_is_a_file(checkpoint, recording, tmp_path):
    path = tmp_path / "results.txt"
    path.write_text("not a folder\n")
    assert_refused(predict(checkpoint, recording, path), "--out", "is a file")
    assert path.read_text() == "not a folder\n"


def test_existing_outputs_are_not_overwritten(checkpoint, recording, tmp_path):
    assert predict(checkpoint, recording, tmp_path / "out")[0] == 0
    before = snapshot(tmp_path / "out")
    assert_refused(predict(checkpoint, recording, tmp_path / "out"), "already holds", "--overwrite")
    assert snapshot(tmp_path / "out") == before
    assert predict(checkpoint, recording, tmp_path / "out", "--overwrite")[0] == 0


def test_hostile_checkpoint_is_not_unpickled(checkpoint, recording, out_dir, tmp_path):
    marker = tmp_path / "code-ran"
    path = hostile_checkpoint(tmp_path / "hostile.pt", marker, checkpoint)
    refuse(["--checkpoint", path, "--recording", recording, "--out", out_dir], out_dir, "hostile.pt",
           "holds objects other than tensors")
    assert not marker.exists()


@pytest.mark.parametrize("key", ["sample_rate_hz", "window_steps", "preprocessing", "normalization"])
def test_checkpoint_lacking_what_predict_needs(key, recording, out_dir, tmp_path):
    checkpoint = make_checkpoint(tmp_path / "old.pt", **{key: None})
    refuse(["--checkpoint", checkpoint, "--recording", recording, "--out", out_dir], out_dir, "old.pt", key)


@pytest.mark.parametrize("flags, names", [
    (["--stride", "0"], ["--stride"]),
    (["--stride", "129"], ["--stride"]),
    (["--smooth", "mean"], ["--smooth"]),
])
def test_bad_flags(flags, names, checkpoint, recording, out_dir):
    refuse(["--checkpoint", checkpoint, "--recording", recording, "--out", out_dir, *flags], out_dir, *names)


@pytest.mark.parametrize("flags, names", [
    (["--stride", "32"], ["--stride only applies to classifying a recording"]),
    (["--smooth", "none", "--acc-unit", "g"], ["--acc-unit and --smooth only apply to classifying a recording"]),
    (["--sample-rate", "50"], ["--sample-rate"]),
])
def test_a_recordings_options_are_refused_in_an_evaluation(flags, names, checkpoint, out_dir):
    refuse(["--checkpoint", checkpoint, "--dataset", "synthetic", "--out", out_dir, *flags], out_dir, *names)


def test_an_evaluations_split_is_refused_with_a_recording(checkpoint, recording, out_dir):
    refuse(["--checkpoint", checkpoint, "--recording", recording, "--out", out_dir, "--split", "test"], out_dir,
           "--split only applies to an evaluation")


def test_missing_checkpoint(recording, out_dir, tmp_path):
    refuse(["--checkpoint", tmp_path / "nope.pt", "--recording", recording, "--out", out_dir], out_dir,
           "nope.pt", "does not exist")


def test_a_recording_at_the_highest_rate_accepted_goes_through(checkpoint, tmp_path):
    # 20 x the model's 50 Hz: stamps of exactly 1,000 Hz, written to the microsecond, compute a hair above.
    time_s, acc, gyro = synthetic_stream(10.0, rate_hz=1000.0)
    path = tmp_path / "fast.csv"  # stamps from 100 s on: (n - 1) / span computes as 1000.0000000000005
    np.savetxt(path, np.column_stack([time_s + 100.0, acc, gyro]), delimiter=",", comments="", fmt="%.6f",
               header="time_s,acc_x,acc_y,acc_z,gyro_x,gyro_y,gyro_z")
    code, _, err = predict(checkpoint, path, tmp_path / "out")
    assert code == 0, err


@pytest.mark.parametrize("case, names", [("npy", ["a single array (.npy)", "numpy.savez"]),
                                         ("scalar", ["acc holds a single number"])])
def test_npz_recording_that_holds_no_samples_of_arrays(case, names, checkpoint, out_dir, tmp_path):
    time_s, acc, gyro = synthetic_stream(10.0)
    path = tmp_path / "odd.npz"
    with open(path, "wb") as handle:  # np.save would add .npy to the name
        if case == "npy":
            np.save(handle, acc)
        else:
            np.savez(handle, acc=np.float64(1.0), gyro=gyro, time_s=time_s)
    refuse(["--checkpoint", checkpoint, "--recording", path, "--out", out_dir], out_dir, "odd.npz", *names)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")
def test_cuda_without_a_gpu(checkpoint, recording, out_dir):
    refuse(["--checkpoint", checkpoint, "--recording", recording, "--out", out_dir, "--device", "cuda"], out_dir,
           "--device cuda")


def test_evaluation_on_data_the_checkpoint_does_not_fit(checkpoint, out_dir, tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "four.npz"
    np.savez(path, signals=rng.normal(size=(30, 4, 128)).astype(np.float32), labels=np.arange(30) % 6,
             subjects=np.arange(30) % 5 + 1)
    refuse(["--checkpoint", checkpoint, "--data-dir", path, "--out", out_dir], out_dir, "channel_0", "body_acc_x")
    refuse(["--checkpoint", checkpoint, "--data-dir", tmp_path / "nowhere", "--out", out_dir], out_dir, "nowhere")


def test_a_checkpoint_with_a_weight_average_predicts_with_the_average(tmp_path):
    from inference.bundle import load_bundle
    from models import build_model
    torch.manual_seed(7)
    average = build_model("cnn1d", 9, len(CLASS_NAMES), dropout=0.0).state_dict()
    checkpoint = make_checkpoint(tmp_path / "ema.pt", ema={"weights": average, "updates": 12})
    loaded = load_bundle(checkpoint).model.model.state_dict()  # the network inside the normalisation
    assert all(torch.equal(loaded[name], average[name]) for name in average)
    trained = torch.load(checkpoint, weights_only=True)["model"]
    assert not torch.equal(loaded["head.2.weight"], trained["head.2.weight"])  # not the trained weights
