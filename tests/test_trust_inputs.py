"""A command destroys only what it made, reads inputs within the bounds their format allows, and
refuses bad input in one line: the download, learnt transitions, config files and the studies."""
import contextlib
import dataclasses
import io
import zipfile

import numpy as np
import pytest

from conftest import run_in_process
from data import download
from inference.transitions import main as transitions_command
from outputs.safety import OutputRefused, check_out_dir
from studies import nested_cv
from test_bad_input import assert_refused, snapshot
from test_download import OUTER_NAME, run_download, server, sha256, source  # noqa: F401 (fixtures)
from training.entry_point import run_entry_point


def run_command(main, *argv):
    """(exit code, stdout, stderr) of an entry point's main, through the command line's wrapper."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run_entry_point(main, [str(arg) for arg in argv])
    return code, out.getvalue(), err.getvalue()


def walk_then_sit(samples=640):
    return np.r_[np.full(samples, 1), np.full(samples, 4)].astype(np.int8)


@pytest.fixture
def recordings(tmp_path):
    path = tmp_path / "recordings.npz"
    np.savez(path, u01_s0_label=walk_then_sit(), u01_s0_acc=np.zeros((1280, 3), np.float32),
             u01_s0_gyro=np.zeros((1280, 3), np.float32))
    return path


# ---------------------------------------------------------------------------
# 1. Only what the command made is overwritten or deleted
# ---------------------------------------------------------------------------

def test_a_users_file_with_the_archives_name_is_checked_and_kept(server, source, tmp_path):  # noqa: F811
    url = server.serve(f"/{OUTER_NAME}", source["outer"])
    (tmp_path / OUTER_NAME).write_bytes(b"my own notes, saved under an unlucky name")
    before = snapshot(tmp_path)
    line = assert_refused(run_download("--dest", tmp_path, "--url", url), OUTER_NAME, "left as it is")
    assert "removed" not in line
    assert snapshot(tmp_path) == before
    assert server.requests == []


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_transitions_never_write_over_the_recordings_they_read(recordings, overwrite):
    before = snapshot(recordings)
    assert_refused(run_command(transitions_command, "--recordings", recordings, "--subjects", "1",
                               "--out", recordings, *overwrite), "a file this command reads")
    assert snapshot(recordings) == before


def test_an_output_folder_never_takes_an_input_s_name(tmp_path):
    recording = tmp_path / "windows.csv"  # predict.py --recording windows.csv --out . --overwrite
    recording.write_text("time_s,acc_x\n")
    with pytest.raises(OutputRefused, match="a file this command reads"):
        check_out_dir(tmp_path, ("windows.csv", "timeline.csv"), overwrite=True, reads=[recording])


# ---------------------------------------------------------------------------
# 4. Inputs bounded by what their format can be
# ---------------------------------------------------------------------------

def small_known_archive(monkeypatch, size_bytes, **bounds):
    """The dataset with one recorded archive of `size_bytes` (and the unpacking bounds given)."""
    dataset = download.DATASETS["uci-har"]
    known = (download.KnownArchive("0" * 64, size_bytes, "a small archive"),)
    monkeypatch.setitem(download.DATASETS, "uci-har", dataclasses.replace(dataset, known=known, **bounds))


@pytest.mark.parametrize("length", [True, False], ids=["too-long", "no-length"])
def test_a_download_stops_at_the_largest_archive_that_could_pass(server, source, tmp_path, monkeypatch, length):  # noqa: F811
    small_known_archive(monkeypatch, 1000)
    url = server.serve(f"/{OUTER_NAME}", source["outer"] * 40, length=length)
    assert_refused(run_download("--dest", tmp_path, "--url", url, "--retries", "0"), "more than", "1,000")
    assert list(tmp_path.iterdir()) == []  # the bytes it took were its own: removed


@pytest.mark.parametrize("url", ["notaurl", "http://[::1", "file:///no-such-folder/a.zip"])
def test_a_url_that_is_no_web_address_is_refused_before_any_request(tmp_path, url):
    code, _, err = run_download("--dest", tmp_path, "--url", url)
    assert code == 2 and "Traceback" not in err and "is not an http:// or https:// address" in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("bound", ["max_file_bytes", "max_unpacked_bytes"])
def test_zip_members_declaring_more_than_the_dataset_are_not_unpacked(source, tmp_path, monkeypatch, bound):  # noqa: F811
    small_known_archive(monkeypatch, 10**9, **{bound: 2000})
    archive = tmp_path / "by-hand.zip"
    archive.write_bytes(source["outer"])
    dest = tmp_path / "data"
    line = assert_refused(run_download("--dest", dest, "--archive", archive, "--sha256", sha256(source["outer"])),
                          "declares", "2,000")
    assert "nothing was unpacked" in line
    assert list(dest.iterdir()) == []


def test_a_config_of_nested_aliases_is_refused_before_it_expands(tmp_path):
    # 9 ** 4 values from 27 aliases; a real bomb takes a few more lines for billions.
    nine = ", ".join
    lines = [f"a: &a [{nine(['x'] * 9)}]", f"b: &b [{nine(['*a'] * 9)}]", f"c: &c [{nine(['*b'] * 9)}]",
             f"epochs: [{nine(['*c'] * 9)}]"]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n")
    assert_refused(run_in_process("main.py", ["--config", bomb]), "--config", "aliases")


@pytest.mark.parametrize("name, text", [("deep.yaml", "epochs: " + "[" * 5000 + "]" * 5000 + "\n"),
                                        ("deep.json", '{"epochs": ' + "[" * 100_000 + "]" * 100_000 + "}")])
def test_a_config_nested_beyond_reading_is_one_line(tmp_path, name, text):
    config = tmp_path / name
    config.write_text(text)
    assert_refused(run_in_process("main.py", ["--config", config]), "--config", "deeper")


def test_a_config_file_larger_than_any_file_of_flags_is_refused_unread(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("epochs: 1\n" + "# padding\n" * 120_000)
    # --epochs 0 would be refused too: the file's size must be what stops it, first.
    assert_refused(run_in_process("main.py", ["--config", config, "--epochs", "0"]), "--config", "bytes")


# ---------------------------------------------------------------------------
# 5. A transition matrix learnt from nothing is not written
# ---------------------------------------------------------------------------

def test_transitions_learnt_from_no_window_pair_are_refused(tmp_path):
    archive, out = tmp_path / "short.npz", tmp_path / "transitions.json"
    np.savez(archive, u01_s0_label=np.full(100, 1, np.int8), u02_s0_label=np.zeros(1000, np.int8))
    assert_refused(run_command(transitions_command, "--recordings", archive, "--subjects", "1,2", "--out", out),
                   "no two consecutive windows", "not written")
    assert not out.exists()


# ---------------------------------------------------------------------------
# 6. One line, not a traceback
# ---------------------------------------------------------------------------

def bad_recordings(tmp_path, case):
    path = tmp_path / "recordings.npz"
    if case == "text file":
        path.write_text("time_s,acc_x\n0,1\n")
    elif case == "labels as text":
        np.savez(path, u01_s0_label=np.array(["walk"] * 1280))
    elif case == "no subject number":
        np.savez(path, walk_label=walk_then_sit())
    elif case == "label not an array":
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("u01_s0_label", "1,1,4,4")
    return path


TRANSITIONS_CASES = {"text file": "not a readable .npz", "labels as text": "holds <U4",
                     "no subject number": "names no person", "label not an array": "is not an array"}


@pytest.mark.parametrize("case", sorted(TRANSITIONS_CASES))
def test_transitions_refuse_recordings_they_cannot_read(tmp_path, case):
    archive = bad_recordings(tmp_path, case)
    assert_refused(run_command(transitions_command, "--recordings", archive, "--subjects", "1",
                               "--out", tmp_path / "t.json"), TRANSITIONS_CASES[case])


@pytest.mark.parametrize("where, says", [("folder", "is a folder"), ("missing/t.json", "does not exist")])
def test_transitions_refuse_an_out_they_cannot_write(recordings, where, says):
    (recordings.parent / "folder").mkdir()
    assert_refused(run_command(transitions_command, "--recordings", recordings, "--subjects", "1",
                               "--out", recordings.parent / where), "--out", says)


@pytest.mark.parametrize("text", ["[1, 2]: 3\n", "? {epochs: 1}\n: 3\n"], ids=["list", "mapping"])
def test_a_config_key_that_is_not_a_name_is_refused(tmp_path, text):
    config = tmp_path / "config.yaml"
    config.write_text(text)
    assert_refused(run_in_process("main.py", ["--config", config]), "--config", "a key must be a flag name")


@pytest.mark.parametrize("text", ["{not json", "[]", '{"folds": 3}', '{"folds": [], "worst_person": {}}'])
def test_nested_cv_summary_refuses_a_damaged_report(tmp_path, text):
    (tmp_path / "default").mkdir()
    (tmp_path / "default" / nested_cv.REPORT).write_text(text)
    assert_refused(run_command(nested_cv.main, "--out", tmp_path, "--summary"), nested_cv.REPORT, "damaged",
                   "--name default")
