"""One recording format from the store's converter to predict.py: the same labelled CSV, with `label` and
`subject` columns and no time_s where the rate is given, converts into a store and is classified and
scored by predict.py."""
import csv
import json

import numpy as np

from conftest import REPO  # noqa: F401 (the project importable)
from data.build_store import main as build_store
from data.uci_har import CLASS_NAMES
from inference_fixtures import synthetic_stream
from predict import main as predict
from test_trust_inputs import run_command


def write_labelled(path, labels, subject=7, seed=0, with_time=False):
    """A recording as the converter takes it: acc and gyro at 50 Hz, a label column and a subject column."""
    time_s, acc, gyro = synthetic_stream(len(labels) / 50.0, seed=seed)
    columns = {"acc_x": acc[:, 0], "acc_y": acc[:, 1], "acc_z": acc[:, 2], "gyro_x": gyro[:, 0],
               "gyro_y": gyro[:, 1], "gyro_z": gyro[:, 2], "label": labels, "subject": np.full(len(labels), subject)}
    if with_time:
        columns = {"time_s": time_s, **columns}
    np.savetxt(path, np.stack(list(columns.values()), axis=1), delimiter=",", header=",".join(columns),
               comments="", fmt="%.9g")
    return path


def per_sample_labels(timeline, samples):
    """1..6 for each sample, as the timeline (written by predict.py) says."""
    labels = np.zeros(samples, dtype=int)
    with open(timeline) as handle:
        for row in csv.DictReader(handle):
            first, stop = round(float(row["start_s"]) * 50), round(float(row["end_s"]) * 50)
            labels[first:stop] = CLASS_NAMES.index(row["activity"]) + 1
    return labels


def test_predict_reads_the_converters_labelled_recording_and_scores_it(minirocket, tmp_path):
    samples = 30 * 50
    unlabelled = write_labelled(tmp_path / "plain.csv", np.zeros(samples))
    code, out, err = run_command(predict, "--checkpoint", minirocket, "--recording", unlabelled, "--sample-rate",
                                 "50", "--out", tmp_path / "first")
    assert code == 0, err  # a label and a subject column: read, not refused as unknown columns
    assert "labels: no sample of the recording carries a class's label value" in out
    truth = per_sample_labels(tmp_path / "first" / "timeline.csv", samples)
    labelled = write_labelled(tmp_path / "labelled.csv", truth)
    code, out, err = run_command(predict, "--checkpoint", minirocket, "--recording", labelled, "--sample-rate", "50",
                                 "--out", tmp_path / "scored")
    assert code == 0, err
    score = json.loads((tmp_path / "scored" / "scores.json").read_text())
    assert score["accuracy"] == 1.0 and score["subject"] == 7 and score["samples_scored"] == samples
    shifted = write_labelled(tmp_path / "shifted.csv", np.where(truth == 1, 2, 1))  # wrong where it matters
    code, out, err = run_command(predict, "--checkpoint", minirocket, "--recording", shifted, "--sample-rate", "50",
                                 "--out", tmp_path / "scored", "--overwrite")
    assert code == 0, err
    assert json.loads((tmp_path / "scored" / "scores.json").read_text())["accuracy"] < 0.5
    assert "labels: per-sample accuracy" in out


def test_the_converter_takes_a_recording_without_time_stamps_at_the_rate_it_is_given(tmp_path):
    folder = tmp_path / "recordings"
    folder.mkdir()
    for subject in (1, 2, 3):
        write_labelled(folder / f"s{subject}.csv", 1 + (np.arange(1500) // 300) % 6, subject=subject, seed=subject)
    code, out, err = run_command(build_store, folder, "--out", tmp_path / "store", "--workers", "1",
                                 "--sample-rate", "50")
    assert code == 0, err
    assert "wrote" in out and (tmp_path / "store" / "manifest.json").is_file()
