"""What predict.py and export.py trust: every dataset main.py trains on can be evaluated (the synthetic
data as the run generated it), checkpoints and ensembles are checked before a model is built from
them, inputs are finite as float32, an export is kept only if it computes what the checkpoint does,
--out is checked before any work, and a timeline with thousands of segments plots in a few artists."""
import json
import os
import re
import shlex
import stat

import numpy as np
import pytest
import torch

from conftest import TINY_DATA, load_checkpoint, run_in_process
from data import synthetic
from data.uci_har import CLASS_NAMES, SIGNAL_NAMES
from inference_fixtures import make_checkpoint, synthetic_stream, write_csv
from test_bad_input import assert_refused, snapshot
from test_predict import predict, run_script

SYNTHETIC_RUN = [*TINY_DATA, "--synthetic-windows-per-subject", "8", "--synthetic-seed", "3", "--epochs", "1"]


@pytest.fixture(scope="module")
def synthetic_run(tmp_path_factory):
    """A main.py run on the synthetic data, at a seed and size other than the defaults."""
    save_dir = tmp_path_factory.mktemp("synthetic-run")
    code, _, err = run_in_process("main.py", [*SYNTHETIC_RUN, "--save-dir", save_dir])
    assert code == 0, err
    return save_dir


def evaluate(checkpoint, out, *flags):
    return run_script("predict", ["--checkpoint", checkpoint, "--out", out, *flags])


# --- A: every dataset main.py trains on ------------------------------------------------------------

def test_evaluating_a_synthetic_run_reproduces_its_test_report(synthetic_run, tmp_path):
    code, out, err = evaluate(synthetic_run / "best.pt", tmp_path / "eval", "--dataset", "synthetic")
    assert code == 0, err
    ours = json.loads((tmp_path / "eval" / "test_report.json").read_text())
    theirs = json.loads((synthetic_run / "test_report.json").read_text())
    assert ours["num_samples"] == theirs["num_samples"] == 8 * len(synthetic.TEST_SUBJECTS)
    assert ours["confusion_matrix"] == theirs["confusion_matrix"]
    assert ours["accuracy"] == theirs["accuracy"] and ours["per_subject"] == theirs["per_subject"]
    # The loss follows every value of every window: the same data, not data of the same size.
    assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-5)
    assert "synthetic (generated, seed 3)" in out


def test_evaluating_the_validation_split_writes_its_own_report(synthetic_run, tmp_path):
    # Named as training names it, so that evaluating the val split never reads as a test figure.
    code, _, err = evaluate(synthetic_run / "best.pt", tmp_path / "eval", "--dataset", "synthetic", "--split", "val")
    assert code == 0, err
    assert not (tmp_path / "eval" / "test_report.json").exists()
    ours = json.loads((tmp_path / "eval" / "val_report.json").read_text())
    theirs = json.loads((synthetic_run / "val_report.json").read_text())
    assert ours["split"] == "val" and ours["confusion_matrix"] == theirs["confusion_matrix"]
    assert ours["per_subject"] == theirs["per_subject"]


def test_advice_on_a_folder_without_data_is_a_command_that_works(synthetic_run, tmp_path):
    empty = tmp_path / "data"
    empty.mkdir()
    line = assert_refused(evaluate(synthetic_run / "best.pt", tmp_path / "eval", "--data-dir", empty),
                          "holds no data of a kind", "UCI HAR Dataset", "--dataset synthetic")
    command = shlex.split(re.search(r"python predict\.py (.*)$", line).group(1))
    code, _, err = run_script("predict", command)
    assert code == 0, err
    assert (tmp_path / "eval" / "test_report.json").is_file()


@pytest.mark.parametrize("flags, names", [
    ([], ["--recording", "--data-dir", "--dataset synthetic"]),
    (["--dataset", "synthetic", "--data-dir", "somewhere"], ["--data-dir is not read with --dataset synthetic"]),
    (["--dataset", "synthetic", "--recording", "walk.csv"], ["--dataset synthetic", "drop it"]),
])
def test_what_to_evaluate_on_is_asked_for_in_one_line(flags, names, tmp_path):
    checkpoint = make_checkpoint(tmp_path / "best.pt")
    assert_refused(evaluate(checkpoint, tmp_path / "eval", *flags), *names)
    assert not (tmp_path / "eval").exists()


def windows_npz(path, windows_per_subject=4):
    """The synthetic data as an .npz of windows with its own train/test split."""
    raw = synthetic.generate(0, windows_per_subject)
    np.savez(path, signals=np.concatenate([raw["train"][0], raw["test"][0]]),
             labels=np.concatenate([raw["train"][1], raw["test"][1]]),
             subjects=np.concatenate([raw["train"][2], raw["test"][2]]),
             split=np.array(["train"] * len(raw["train"][1]) + ["test"] * len(raw["test"][1])),
             channel_names=np.array(SIGNAL_NAMES), class_names=np.array(CLASS_NAMES), sample_rate_hz=50.0)
    return path


def test_a_window_store_evaluates_like_the_windows_it_was_built_from(tmp_path):
    from test_store import build_here
    source = windows_npz(tmp_path / "windows.npz")
    build_here(source, tmp_path / "store")
    checkpoint = make_checkpoint(tmp_path / "best.pt")
    code, _, err = evaluate(checkpoint, tmp_path / "from-npz", "--data-dir", source)
    assert code == 0, err
    code, _, err = evaluate(checkpoint, tmp_path / "from-store", "--dataset", "store", "--data-dir", tmp_path / "store")
    assert code == 0, err
    npz, store = (json.loads((tmp_path / name / "test_report.json").read_text()) for name in ("from-npz", "from-store"))
    assert store["num_samples"] == npz["num_samples"] == 4 * len(synthetic.TEST_SUBJECTS)
    assert store["confusion_matrix"] == npz["confusion_matrix"] and store["per_subject"] == npz["per_subject"]
    assert store["loss"] == pytest.approx(npz["loss"], rel=1e-6)


def test_a_checkpoint_of_uci_har_channels_is_not_sent_to_windows_it_cannot_read(tmp_path):
    checkpoint = make_checkpoint(tmp_path / "first.pt", mode="first", config={
        "model": "cnn1d", "mode": "first", "norm": "batch", "dropout": 0.0, "synthetic_windows_per_subject": 4})
    source = windows_npz(tmp_path / "windows.npz")
    line = assert_refused(evaluate(checkpoint, tmp_path / "eval", "--data-dir", source), "--mode first",
                          "--dataset synthetic")
    assert "(--mode flatten)" not in line  # training's advice: predict.py has no --mode
    code, _, err = evaluate(checkpoint, tmp_path / "eval", "--dataset", "synthetic")
    assert code == 0, err


# --- B: checkpoints and ensembles checked before a model is built ----------------------------------

def rewritten(source, path, change):
    state = load_checkpoint(source)
    change(state)
    torch.save(state, path)
    return path


@pytest.fixture
def ensemble(tmp_path):
    from inference.ensemble import write_ensemble
    members = [make_checkpoint(tmp_path / f"member-{seed}.pt", seed=seed) for seed in (0, 1)]
    return write_ensemble(members, tmp_path / "ensemble.pt", config=load_checkpoint(members[0])["config"])


def poison(tensor):
    tensor.view(-1)[3] = float("nan")


def another_model(state, folder):
    lstm = load_checkpoint(make_checkpoint(folder / "lstm.pt", model="cnn_lstm"))
    state["members"][1].update(model=lstm["model"], config=lstm["config"])


ENSEMBLE_DAMAGE = {
    "no-members-list": (lambda state, _: state.update(members={"a": 1}), ["members must be a non-empty list"]),
    "empty": (lambda state, _: state.update(members=[]), ["members must be a non-empty list"]),
    "member-without-normalization": (lambda state, _: state["members"][1].pop("normalization"),
                                     ["member 2 lacks normalization"]),
    "member-of-other-channels": (lambda state, _: state["members"][0].update(in_channels=3),
                                 ["member 1 has in_channels 3", "ensemble 9"]),
    "member-of-another-model": (another_model, ["member 2 is a cnn_lstm model", "member 1 a cnn1d"]),
    "member-with-nan": (lambda state, _: poison(state["members"][1]["model"]["head.2.weight"]),
                        ["member 2's weight 'head.2.weight' holds NaN or infinity"]),
    "member-with-inf-std": (lambda state, _: state["members"][0]["normalization"]["std"].fill_(float("inf")),
                            ["member 1's normalization std holds NaN or infinity"]),
    "member-weights-of-other-shape": (lambda state, _: state["members"][1]["model"].update(
        {"head.2.weight": torch.zeros(6, 7)}), ["member 2", "weights do not fit"]),
}


@pytest.mark.parametrize("damage", ENSEMBLE_DAMAGE)
def test_a_malformed_ensemble_is_refused_in_one_line(damage, ensemble, tmp_path):
    change, names = ENSEMBLE_DAMAGE[damage]
    path = rewritten(ensemble, tmp_path / "bad.pt", lambda state: change(state, tmp_path))
    recording = write_csv(tmp_path / "r.csv", *synthetic_stream(10.0))
    assert_refused(predict(path, recording, tmp_path / "out"), "bad.pt", *names)
    assert not (tmp_path / "out").exists()
    assert_refused(run_script("export", ["--checkpoint", path, "--format", "torchscript", "--out", tmp_path / "m.pt"]),
                   "bad.pt", *names)
    assert not (tmp_path / "m.pt").exists()


MALFORMED = {
    "ema-not-a-mapping": (lambda state: state.update(ema=[1, 2]), ["weights are not a state dict"]),
    "ema-without-weights": (lambda state: state.update(ema={"decay": 0.9}), ["weights are not a state dict"]),
    "rate-none": (lambda state: state.update(sample_rate_hz=None), ["sample_rate_hz", "None"]),
    "rate-word": (lambda state: state.update(sample_rate_hz="fast"), ["sample_rate_hz", "'fast'"]),
    "complex-weight": (lambda state: state["model"].update({"head.2.weight": state["model"]["head.2.weight"] * 1j}),
                       ["'head.2.weight' is not a tensor of real numbers"]),
    "complex-mean": (lambda state: state["normalization"].update(mean=state["normalization"]["mean"] * 1j),
                     ["normalization must hold tensors mean and std of real numbers"]),
    "model-name-a-list": (lambda state: state["config"].update(model=["cnn1d"]), ["model ['cnn1d'] is not one of"]),
    "norm-unknown": (lambda state: state["config"].update(norm="weird"),
                     ["its settings do not build a cnn1d model", "weird"]),
    "width-a-word": (lambda state: state["config"].update(width="abc"), ["its settings do not build a cnn1d model"]),
    "dropout-a-word": (lambda state: state["config"].update(dropout="x"), ["its settings do not build a cnn1d model"]),
}


@pytest.mark.parametrize("damage", MALFORMED)
def test_a_malformed_checkpoint_is_refused_in_one_line(damage, tmp_path, recwarn):
    change, names = MALFORMED[damage]
    path = rewritten(make_checkpoint(tmp_path / "source.pt"), tmp_path / "bad.pt", change)
    recording = write_csv(tmp_path / "r.csv", *synthetic_stream(10.0))
    assert_refused(predict(path, recording, tmp_path / "out"), "bad.pt", *names)
    assert_refused(run_script("export", ["--checkpoint", path, "--format", "torchscript", "--out", tmp_path / "m.pt"]),
                   "bad.pt", *names)
    assert_refused(run_script("inference.ensemble", [tmp_path / "source.pt", path, "--out", tmp_path / "e.pt"]),
                   "bad.pt", *names)  # refused as a member too: predict and export would refuse the ensemble
    assert not (tmp_path / "out").exists() and not (tmp_path / "m.pt").exists() and not (tmp_path / "e.pt").exists()
    assert not [warning for warning in recwarn if "complex" in str(warning.message).lower()]


@pytest.mark.parametrize("protocol", [2, 4])
def test_a_plain_pickle_is_refused_in_one_line_and_never_run(protocol, tmp_path, recwarn):
    import pickle

    from test_bad_input import CreatesFile
    marker, path = tmp_path / "code-ran", tmp_path / "plain.pt"
    path.write_bytes(pickle.dumps({"config": CreatesFile(marker)}, protocol=protocol))
    recording = write_csv(tmp_path / "r.csv", *synthetic_stream(10.0))
    code, out, err = predict(path, recording, tmp_path / "out")
    assert_refused((code, out, err), "plain.pt", "only load checkpoints this trainer wrote")
    assert err.count("\n") == 1, err
    assert not [warning for warning in recwarn if "pickle protocol" in str(warning.message)]  # torch's, silenced
    assert not marker.exists()


def test_an_exported_model_given_as_a_checkpoint_is_named_so_without_unsafe_advice(tmp_path):
    checkpoint = make_checkpoint(tmp_path / "best.pt")
    code, _, err = run_script("export", ["--checkpoint", checkpoint, "--format", "torchscript", "--out",
                                         tmp_path / "m.pt"])
    assert code == 0, err
    recording = write_csv(tmp_path / "r.csv", *synthetic_stream(10.0))
    err = assert_refused(predict(tmp_path / "m.pt", recording, tmp_path / "out"), "m.pt is a TorchScript model "
                         "(export.py's), not a checkpoint; give the best.pt or last.pt that training wrote")
    assert "weights_only" not in err


@pytest.mark.parametrize("where", ["model", "ema", "normalization", "batchnorm-statistics"])
def test_a_checkpoint_with_nan_or_inf_weights_is_refused_naming_the_file(where, tmp_path):
    from models import build_model
    average = build_model("cnn1d", 9, len(CLASS_NAMES), dropout=0.0).state_dict()
    source = make_checkpoint(tmp_path / "source.pt", ema={"weights": average, "updates": 3})

    def change(state):
        weights = state["ema"]["weights"]
        if where == "model":  # no weight average: the trained weights are the ones predicted with
            state.pop("ema")
            state["model"]["features.0.0.weight"].view(-1)[0] = float("inf")
        elif where == "ema":
            poison(weights["head.2.weight"])
        elif where == "normalization":
            state["normalization"]["mean"][4] = float("nan")
        else:
            weights["features.0.1.running_var"][0] = float("inf")
    path = rewritten(source, tmp_path / "diverged.pt", change)
    recording = write_csv(tmp_path / "r.csv", *synthetic_stream(10.0))
    assert_refused(predict(path, recording, tmp_path / "out"), "diverged.pt", "NaN or infinity")
    assert_refused(run_script("export", ["--checkpoint", path, "--format", "torchscript", "--out", tmp_path / "m.pt"]),
                   "diverged.pt", "NaN or infinity")
    assert not (tmp_path / "out").exists() and not (tmp_path / "m.pt").exists()


# --- C: finite as float32, the type the models see -------------------------------------------------

def test_a_recording_value_beyond_float32_is_refused_where_it_lies(tmp_path):
    checkpoint = make_checkpoint(tmp_path / "best.pt")
    time_s, acc, gyro = synthetic_stream(10.0)
    acc = acc.copy()
    acc[200, 1] = 1e39  # finite as float64, infinity as float32
    assert_refused(predict(checkpoint, write_csv(tmp_path / "big.csv", time_s, acc, gyro), tmp_path / "out"),
                   "big.csv", "acc_y", "sample 201", "line 202", "float32")
    np.savez(tmp_path / "big.npz", acc=acc, gyro=gyro, time_s=time_s)
    assert_refused(predict(checkpoint, tmp_path / "big.npz", tmp_path / "out"), "big.npz", "acc_y", "sample 201",
                   "array acc row 200")
    assert not (tmp_path / "out").exists()


def test_values_that_the_filters_carry_beyond_float32_are_refused_in_the_windows(tmp_path):
    # 3.3e38 g is finite as float32, but the low-pass filter's overshoot at the step takes it past 3.4e38.
    checkpoint = make_checkpoint(tmp_path / "best.pt")
    time_s, acc, gyro = synthetic_stream(10.0)
    acc = acc.copy()
    acc[250:, 0] = 3.3e38
    assert_refused(predict(checkpoint, write_csv(tmp_path / "loud.csv", time_s, acc, gyro), tmp_path / "out"),
                   "loud.csv", "window", "channel", "float32")


def test_npz_windows_beyond_float32_are_refused_where_they_lie(tmp_path):
    checkpoint = make_checkpoint(tmp_path / "best.pt")
    source = windows_npz(tmp_path / "windows.npz")
    arrays = dict(np.load(source))
    arrays["signals"] = arrays["signals"].astype(np.float64)
    arrays["signals"][7, 2, 5] = -1e39
    np.savez(tmp_path / "big.npz", **arrays)
    assert_refused(evaluate(checkpoint, tmp_path / "eval", "--data-dir", tmp_path / "big.npz"), "big.npz",
                   "window 7, channel 2, step 5", "float32")


# --- D: an export is kept only when it computes what the checkpoint does ----------------------------

def test_an_export_whose_logits_are_nan_is_refused_and_not_written(tmp_path):
    # Finite weights so large that the logits overflow float32: the parity check's difference is NaN.
    path = rewritten(make_checkpoint(tmp_path / "source.pt"), tmp_path / "huge.pt",
                     lambda state: state["model"]["head.2.weight"].fill_(3e38))
    out = tmp_path / "model.pt"
    out.write_bytes(b"an earlier export")
    line = assert_refused(run_script("export", ["--checkpoint", path, "--format", "torchscript", "--out", out,
                                                "--overwrite"]), "not written", "nan")
    assert "model.pt" in line and out.read_bytes() == b"an earlier export"
    assert sorted(file.name for file in tmp_path.iterdir()) == ["huge.pt", "model.pt", "source.pt"]  # no temporary


def test_outputs_that_are_not_finite_are_refused_not_written(synthetic_run, tmp_path):
    # Finite weights so large that the logits overflow: NaN probabilities would read as the first class.
    time_s, acc, gyro = synthetic_stream(30.0)
    recording = write_csv(tmp_path / "walk.csv", time_s, acc, gyro)
    huge = rewritten(make_checkpoint(tmp_path / "source.pt"), tmp_path / "huge.pt",
                     lambda state: state["model"]["head.2.weight"].fill_(3e38))
    assert_refused(predict(huge, recording, tmp_path / "timeline"), "NaN or infinite", "window 0")
    assert not (tmp_path / "timeline").exists()
    def huge_weights(state):
        for weights in (state["model"], (state.get("ema") or {}).get("weights", {})):
            for weight in weights.values():
                if weight.is_floating_point() and weight.dim() >= 2:
                    weight.mul_(1e15)

    run_huge = rewritten(synthetic_run / "best.pt", tmp_path / "run_huge.pt", huge_weights)
    assert_refused(evaluate(run_huge, tmp_path / "eval", "--dataset", "synthetic"), "NaN or infinite")
    assert not (tmp_path / "eval").exists()


def test_an_output_name_held_by_other_than_a_file_is_refused_before_any_work(tmp_path, recording):
    source = make_checkpoint(tmp_path / "source.pt")
    pipe = tmp_path / "model.pt"
    os.mkfifo(pipe)  # as /dev/null is a device: a rename over it would replace it with a file
    assert_refused(run_script("export", ["--checkpoint", source, "--format", "torchscript", "--out", pipe,
                                         "--overwrite"]), "not a regular file")
    assert stat.S_ISFIFO(os.stat(pipe).st_mode)
    out = tmp_path / "timeline"
    (out / "timeline.png").mkdir(parents=True)
    (out / "windows.csv").write_text("an earlier run's windows")
    assert_refused(predict(source, recording, out, "--overwrite"), "timeline.png is a folder")
    assert (out / "windows.csv").read_text() == "an earlier run's windows"
    assert_refused(predict(source, recording, ""), "--out is empty")


def test_a_pipe_given_to_read_is_named_as_such(tmp_path, recording):
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    assert_refused(predict(pipe, recording, tmp_path / "out"), "is not a regular file")
    assert_refused(predict(make_checkpoint(tmp_path / "source.pt"), pipe, tmp_path / "out"), "is not a regular file")


def test_an_evaluation_lists_what_it_wrote_and_leaves_no_earlier_temperature_beside_it(synthetic_run, tmp_path):
    out, checkpoint = tmp_path / "eval", synthetic_run / "best.pt"
    code, printed, err = evaluate(checkpoint, out, "--dataset", "synthetic")
    assert code == 0 and "calibration.json" in printed.splitlines()[-1], err
    code, printed, err = evaluate(checkpoint, out, "--dataset", "synthetic", "--temperature", "2.5", "--overwrite")
    assert code == 0, err
    assert "removed the earlier calibration.json" in printed.splitlines()[-1]
    assert not (out / "calibration.json").exists()
    assert json.loads((out / "test_report.json").read_text())["temperature"]["value"] == 2.5


class TracedForTwo(torch.nn.Module):
    """A model whose traced graph keeps the branch of the batch it was traced with: its export differs."""

    def forward(self, signals):
        logits = signals.mean(dim=2)[:, :6]
        if signals.shape[0] == 2:
            return logits
        return logits + 1.0


def test_an_export_that_differs_from_the_model_is_refused_and_not_written(tmp_path):
    from inference.bundle import ModelBundle
    from inference.export import export
    from training.errors import UsageError
    bundle = ModelBundle(TracedForTwo(), np.zeros(9, np.float32), np.ones(9, np.float32), CLASS_NAMES, SIGNAL_NAMES,
                         50.0, 128, "uci-har", {"model": "traced-for-two"}, "traced.pt")
    with pytest.raises(UsageError, match=r"differ from the PyTorch model's by 1\.00e\+00, above the tolerance"):
        export(bundle, "torchscript", tmp_path / "model.pt")
    assert list(tmp_path.iterdir()) == []


# --- E: --out before any work; long timelines ------------------------------------------------------

def test_predict_checks_out_before_reading_anything(tmp_path):
    blocker = tmp_path / "results.txt"
    blocker.write_text("a file\n")
    checkpoint = make_checkpoint(tmp_path / "best.pt")
    short = write_csv(tmp_path / "short.csv", *(part[:50] for part in synthetic_stream(10.0)))
    # The recording is too short and the data folder missing: --out is what is refused first.
    assert_refused(predict(checkpoint, short, blocker / "out"), "--out", "results.txt is a file")
    assert_refused(evaluate(checkpoint, blocker, "--data-dir", tmp_path / "nowhere"), "--out", "is a file")
    assert_refused(run_script("export", ["--checkpoint", tmp_path / "missing.pt", "--format", "torchscript",
                                         "--out", tmp_path / "no-folder" / "m.pt"]), "--out", "does not exist")
    assert blocker.read_text() == "a file\n"


def test_existing_outputs_are_refused_before_any_work(tmp_path):
    checkpoint = make_checkpoint(tmp_path / "best.pt")
    out = tmp_path / "out"
    out.mkdir()
    (out / "timeline.png").write_bytes(b"keep")
    before = snapshot(out)
    short = write_csv(tmp_path / "short.csv", *(part[:50] for part in synthetic_stream(10.0)))
    assert_refused(predict(checkpoint, short, out), "already holds timeline.png", "--overwrite")
    assert snapshot(out) == before


def test_a_timeline_of_thousands_of_segments_is_a_few_artists(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    from inference.classify import WindowPredictions
    from inference.timeline import CURVE_COLUMNS, merge_segments, plot_timeline
    count, rate_hz = 3000, 50.0
    start_s = np.arange(count) * 1.28
    end_s = start_s + 2.56
    probs = np.random.default_rng(0).dirichlet(np.ones(6), size=count)
    segments = merge_segments(np.arange(count) % 6, probs, start_s, end_s, CLASS_NAMES)  # every window a segment
    magnitude = np.random.default_rng(1).normal(1.0, 0.2, int(end_s[-1] * rate_hz))
    magnitude[12345] = 9.0  # one spike: the drawn range must keep it
    predictions = WindowPredictions(start_s, end_s, probs, CLASS_NAMES, magnitude, rate_hz, 0.0, rate_hz)
    drawn = {}
    original = Figure.savefig

    def inspect(figure, *args, **kwargs):
        activity, confidence, signal = figure.axes
        drawn["bars"] = activity.collections
        drawn["points"] = [sum(len(path.vertices) for artist in ax.collections for path in artist.get_paths())
                           + sum(len(line.get_xdata()) for line in ax.lines) for ax in (confidence, signal)]
        drawn["signal_top"] = max([path.vertices[:, 1].max() for artist in signal.collections
                                   for path in artist.get_paths()] + [line.get_ydata().max() for line in signal.lines])
        return original(figure, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", inspect)
    plot_timeline(predictions, segments, tmp_path / "timeline.png", "long")
    assert len(segments) == count and len(drawn["bars"]) <= len(CLASS_NAMES)
    spans = sorted((round(float(path.vertices[:, 0].min()), 6), round(float(path.vertices[:, 0].max()), 6))
                   for bars in drawn["bars"] for path in bars.get_paths())
    assert spans == sorted((round(s.start_s, 6), round(s.end_s, 6)) for s in segments)  # every segment, once
    assert all(points <= 6 * CURVE_COLUMNS for points in drawn["points"])  # not one point per sample
    assert drawn["signal_top"] == pytest.approx(9.0)
    assert (tmp_path / "timeline.png").read_bytes()[:4] == b"\x89PNG"


def test_an_output_folder_may_be_named_with_a_trailing_slash_and_an_output_file_may_not(tmp_path):
    from outputs.safety import OutputRefused, check_out_dir, check_out_file
    assert check_out_dir(f"{tmp_path / 'out'}/", ["a.csv"]) == tmp_path / "out"
    with pytest.raises(OutputRefused, match="names a folder; give the name of a file inside it"):
        check_out_file(f"{tmp_path / 'out'}/", overwrite=False)
