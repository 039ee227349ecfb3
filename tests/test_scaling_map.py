"""benchmarks.scaling.map: bad arguments are one line before any profile runs; a profile that measured
nothing gives no ratio instead of a division by zero."""
import contextlib
import io

import pytest

from benchmarks.scaling import map as scaling_map
from test_bad_input import assert_refused
from training.entry_point import run_entry_point

# Valid for a short sweep, so that a check that is missing would start profiling instead of refusing.
SHORT = ["--sizes", "0.1M", "--batch-sizes", "16", "--strategies", "ddp", "--device", "cpu", "--steps", "1",
         "--warmup-steps", "0", "--repeats", "1"]


@pytest.mark.parametrize("argv, names", [
    (["--predict-gpus", "0,2"], ["--predict-gpus must be at least 1, got 0"]),
    (["--predict-gpus", "-4"], ["--predict-gpus must be at least 1, got -4"]),
    (["--batch-sizes", "0"], ["--batch-sizes must be at least 1, got 0"]),
    (["--threads-per-rank", "0"], ["--threads-per-rank must be at least 1, got 0"]),
    (["--steps", "0"], ["--steps must be at least 1, got 0"]),
    (["--repeats", "-1"], ["--repeats must be at least 1, got -1"]),
    (["--warmup-steps", "-1"], ["--warmup-steps must be at least 0, got -1"]),
    (["--rounds", "0"], ["--rounds must be at least 1, got 0"]),
    (["--sizes", "99M"], ["unknown '99M'; choose from 0.1M"]),
    (["--strategies", "ddp,zero3"], ["unknown 'zero3'; choose from ddp"]),
    (["--predict-gpus", "two"], ["expected comma-separated integers"]),
    (["--device", "tpu"], ["invalid choice: 'tpu'"]),
    (["--bogus"], ["unrecognized arguments: --bogus"]),
])
def test_bad_arguments_are_one_line_before_any_profile(tmp_path, argv, names):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run_entry_point(scaling_map.main, ["--out", str(tmp_path / "map"), *SHORT, *argv])
    assert_refused((code, out.getvalue(), err.getvalue()), *names)
    assert not (tmp_path / "map").exists()


def test_a_round_that_measured_no_speedup_has_no_prediction_error():
    row = {"size": "0.1M", "strategy": "ddp", "ranks": 2, "measured_samples_per_s": 0.0, "measured_speedup": 0.0,
           "predicted_samples_per_s": 900.0, "predicted_speedup": 1.5, "prediction_error": 0.2}
    combined = scaling_map.combine_rounds([[row], [dict(row)]])
    assert combined[0]["prediction_error"] is None and combined[0]["predicted_speedup"] == 1.5
    assert "largest error" not in scaling_map.format_errors(combined)
