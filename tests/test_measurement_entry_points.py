"""The measurement entry points (benchmarks/, studies/) refuse bad input as the product does: one
`error:` line, exit 2, no traceback, before any measurement starts."""
import sys

import pytest

from conftest import run_subprocess
from test_bad_input import assert_refused

CASES = [
    ("benchmarks.overhead", ["--rounds", "0"], "--rounds: must be at least 1, got 0"),
    ("benchmarks.overhead", ["--epochs-per-round", "0"], "--epochs-per-round: must be at least 1"),
    # --json is checked before the measurement, not refused with a traceback after it
    ("benchmarks.overhead", ["--json", "no-such-folder/figures.json"], "folder no-such-folder does not exist"),
    ("studies.layouts", ["--recordings", "no-such.npz"], "--recordings no-such.npz does not exist"),
    ("studies.layouts", ["--layouts", "20hz,30hz"], "--layouts: unknown '30hz'"),
]


@pytest.mark.parametrize("module, flags, says", CASES, ids=[f"{m}:{' '.join(f)}" for m, f, _ in CASES])
def test_bad_input_is_one_line(module, flags, says):
    result = run_subprocess([sys.executable, "-m", module, *flags], timeout=120)
    assert_refused((result.returncode, result.stdout, result.stderr), says)
    assert result.stderr.count("\n") == 1, result.stderr  # nothing printed beside it


@pytest.mark.parametrize("module, reads", [("studies.layouts", "--recordings"),
                                           ("studies.minirocket_baseline", "--data-dir")])
def test_figures_are_never_written_over_the_data_a_study_reads(module, reads, tmp_path):
    data = tmp_path / "data.npz"
    data.write_bytes(b"the user's data")
    flags = [reads, data, "--json", data] + (["--dataset", "npz"] if reads == "--data-dir" else [])
    result = run_subprocess([sys.executable, "-m", module, *flags], timeout=120)
    assert_refused((result.returncode, result.stdout, result.stderr), "--json", "a file this command reads")
    assert data.read_bytes() == b"the user's data"
