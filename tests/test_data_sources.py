"""The kinds of data as one registry (data/sources/): a new kind is one module that registers itself, and
training, predict.py and --dataset auto then read it as they read the built-in ones; auto names the kind
a --data-dir holds, a store by its manifest; a folder of labelled recordings trains as the converter cuts it."""
import json
from pathlib import Path

import numpy as np
import pytest

from conftest import TINY_DATA, run_in_process
from data import sources
from data.errors import DataError
from data.layout import Layout
from data.sources import DataOptions, Source, load_har_data, register_source, source_for
from data.splits import HarData, Split, held_out_for_test, hold_out, take, validation_words
from test_bad_input import assert_refused
from test_store import write_recording
from test_trust_inputs import run_command


class TinyJson(Source):
    """Windows written as JSON: a kind of data the project does not know, in a dozen lines."""
    name = "tiny-json"
    about = "a .tiny.json file of windows"

    def claims(self, path):
        return path is not None and path.name.endswith(".tiny.json")

    def identity_files(self, path):
        return [path]

    def load(self, options):
        text = Path(options.data_dir).read_text()
        content = json.loads(text)
        whole = Split(np.asarray(content["signals"], np.float32), np.asarray(content["labels"], np.int64),
                      np.asarray(content["subjects"], np.int64))
        is_test, how = held_out_for_test(whole.subjects)
        train_all, test = take(whole, ~is_test), take(whole, is_test)
        train, val, held = hold_out(train_all, options)
        description = f"data: tiny-json ({how}), val {validation_words(train_all, held, options.val_split)}"
        layout = Layout.named(("x", "y"), ("rest", "move"), sample_rate_hz=25.0, window_steps=32, preprocessing="raw")
        return HarData(train, val, test, layout, self.name, description, identity=str(hash(text)))


@pytest.fixture
def tiny_json(tmp_path):
    """The kind registered for one test, and a file of it: 6 people x 16 windows of 2 channels x 32 steps."""
    register_source(TinyJson())
    rng = np.random.default_rng(0)
    labels = np.arange(96) % 2
    signals = rng.normal(0, 1, (96, 2, 32)) + 2.0 * labels[:, None, None]
    path = tmp_path / "walks.tiny.json"
    path.write_text(json.dumps({"signals": signals.tolist(), "labels": labels.tolist(),
                                "subjects": np.repeat(np.arange(1, 7), 16).tolist()}))
    yield path
    del sources.SOURCES[TinyJson.name]


def test_a_kind_registered_in_one_place_trains_and_its_checkpoint_predicts(tiny_json, tmp_path):
    flags = ["--model", "cnn1d", "--epochs", "2", "--batch-size", "8", "--no-figures"]
    code, out, err = run_in_process("main.py", ["--dataset", "tiny-json", "--data-dir", tiny_json, *flags,
                                                "--save-dir", tmp_path / "run"])
    assert code == 0, err
    assert "data: tiny-json" in out
    from predict import main as predict
    code, out, err = run_command(predict, "--checkpoint", tmp_path / "run" / "best.pt", "--dataset", "tiny-json",
                                 "--data-dir", tiny_json, "--out", tmp_path / "eval")
    assert code == 0, err
    report = json.loads((tmp_path / "eval" / "test_report.json").read_text())
    assert report["accuracy"] > 0.9  # the classes are two points apart
    assert source_for("auto", tiny_json).name == "tiny-json"  # auto asks it too


def test_auto_names_the_kind_a_data_dir_holds_a_store_by_its_manifest(tmp_path):
    folder = tmp_path / "recordings"
    folder.mkdir()
    for subject in (1, 2, 3, 4, 5):
        write_recording(folder, f"s{subject}.csv", subject, seed=subject)
    assert source_for("auto", folder).name == "recordings"
    assert source_for("auto", None).name == "synthetic"
    from data.build_store import main as build_store
    assert run_command(build_store, folder, "--out", tmp_path / "store", "--workers", "1")[0] == 0
    assert source_for("auto", tmp_path / "store").name == "store"
    code, out, err = run_in_process("main.py", ["--data-dir", tmp_path / "store", *TINY_DATA[2:], "--epochs", "1",
                                                "--save-dir", tmp_path / "run"])
    assert code == 0, err
    assert out.startswith("data: store (")  # where it said the folder did not hold the UCI HAR Dataset
    empty = tmp_path / "nothing"
    empty.mkdir()
    line = assert_refused(run_in_process("main.py", ["--data-dir", empty, "--save-dir", tmp_path / "x"]),
                          "holds no data of a kind this trainer reads")
    assert "--dataset store: a folder made by python -m data.build_store" in line


def test_a_folder_of_recordings_trains_as_the_converter_cuts_it(tmp_path):
    folder = tmp_path / "recordings"
    folder.mkdir()
    for subject in (1, 2, 3, 4, 5, 6):
        write_recording(folder, f"s{subject}.npz", subject, seed=subject)
    in_memory = load_har_data("recordings", folder, val_fraction=0.2)
    from data.build_store import main as build_store
    assert run_command(build_store, folder, "--out", tmp_path / "store", "--workers", "1",
                       "--dtype", "float32")[0] == 0
    stored = load_har_data("store", tmp_path / "store", val_fraction=0.2)
    assert in_memory.channel_names == stored.channel_names and in_memory.class_names == stored.class_names
    assert sorted(np.unique(in_memory.test.subjects)) == sorted(np.unique(stored.test.subjects))
    memory_rows = in_memory.test.signals[np.argsort(in_memory.test.subjects, kind="stable")]
    store_rows = np.asarray(stored.test.signals[np.arange(len(stored.test))])
    assert np.allclose(memory_rows, store_rows[np.argsort(stored.test.subjects, kind="stable")], atol=1e-6)


def test_each_kind_refuses_what_it_cannot_take_in_its_own_words(tmp_path):
    with pytest.raises(DataError, match="--data-dir is not read with --dataset synthetic"):
        sources.SOURCES["synthetic"].check(DataOptions(dataset="synthetic", data_dir="x"))
    with pytest.raises(DataError, match="--dataset store needs --data-dir pointing at a folder made by"):
        load_har_data("store", None)
    with pytest.raises(DataError, match="--dataset uci-har takes none"):
        load_har_data("uci-har", tmp_path, description=tmp_path / "d.json")
    with pytest.raises(DataError, match="unknown --dataset 'mnist'; choose auto, synthetic"):
        load_har_data("mnist")
