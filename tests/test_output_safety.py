"""outputs/safety.py: the one check of where a command may write, shared by every command that writes,
and its refusal, which every kind of entry point prints as one line, exit 2."""
import pytest

from data.errors import exit_from_command
from outputs.safety import OutputRefused, check_output_folder, write_atomic
from training.entry_point import run_entry_point


def listing(folder):
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*"))


@pytest.mark.parametrize("make, says", [
    (lambda out: (out / "report.json").mkdir(parents=True),
     "its report.json is a folder, where the tool writes a file"),
    (lambda out: (out.mkdir(), (out / "fold-0").write_text("mine")),
     "its fold-0 is a file, where the tool keeps a folder"),
    (lambda out: out.write_text("mine"), "is a file; point it at a folder"),
])
def test_what_holds_an_outputs_name_is_refused_and_left_as_it_was(tmp_path, make, says):
    out = tmp_path / "out"
    make(out)
    before = listing(tmp_path)
    with pytest.raises(OutputRefused, match=says):
        check_output_folder(out, "--out", files=("report.json",), folders=("fold-0",), writer="the tool")
    assert listing(tmp_path) == before


def test_an_output_never_takes_the_name_of_an_input_and_a_new_folder_is_not_made_by_the_check(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "windows.npz").write_text("the data")
    with pytest.raises(OutputRefused, match="would be written over a file this command reads"):
        check_output_folder(tmp_path / "out", "--out", files=("windows.npz",), reads=(tmp_path / "out/windows.npz",))
    assert check_output_folder(tmp_path / "new" / "deeper", "--out") == tmp_path / "new" / "deeper"
    assert listing(tmp_path) == ["out", "out/windows.npz"]


def test_a_write_cut_short_leaves_the_old_file_whole(tmp_path):
    path = tmp_path / "scores.json"
    path.write_text("old")

    def fails(partial):
        partial.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError):
        write_atomic(path, fails)
    assert path.read_text() == "old" and listing(tmp_path) == ["scores.json"]


def refused():
    raise OutputRefused("--out x is a file; point it at a folder")


def test_a_data_command_and_a_training_entry_point_print_a_refusal_as_one_line_exit_2(capsys):
    with pytest.raises(SystemExit) as exited:
        exit_from_command(lambda: refused())
    assert exited.value.code == 2
    assert capsys.readouterr().err == "error: --out x is a file; point it at a folder\n"
    assert run_entry_point(lambda argv: refused(), []) == 2
    assert capsys.readouterr().err.strip().splitlines() == ["error: --out x is a file; point it at a folder"]
