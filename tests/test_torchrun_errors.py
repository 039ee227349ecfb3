"""Bad input under a real torchrun reads as under python: one error line (from local rank 0),
while torchrun's own failure summary names the same message and exit code 2."""
import json
import sys

import pytest

from conftest import TINY_DATA, run_subprocess
from training import entry_point
from training.entry_point import run_entry_point
from training.errors import EXIT_USAGE, UsageError

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]


def error_lines(text):
    return [line for line in text.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("script, flags, message", [
    ("main_multi_gpu.py", ["--batch-size", "0"], "error: --batch-size must be at least 1, got 0"),
    ("main_multi_gpu.py", ["--val-fraction", "1.5"], "error: --val-fraction must be at least 0 and below 1"),
    ("profiler.py", ["--steps", "0"], "error: --steps must be at least 1, got 0"),
], ids=["trainer-flag", "trainer-data", "profiler"])
def test_bad_flag_under_torchrun_prints_one_error_line(script, flags, message, tmp_path):
    result = run_subprocess([*TORCHRUN, script, "--multi-gpu", "ddp", "--device", "cpu", *TINY_DATA,
                             "--save-dir", tmp_path / "run", *flags], timeout=120)
    output = result.stdout + result.stderr
    lines = error_lines(output)
    assert len(lines) == 1 and lines[0].startswith(message), output[-3000:]
    assert "usage:" not in output  # no argparse usage block, from any rank
    # torchrun's own summary: local rank 0 is the root cause, with exit code 2 and the message.
    root_cause = output[output.index("Root Cause"):]
    assert "local_rank: 0" in root_cause and "exitcode  : 2" in root_cause, output[-3000:]
    assert message.replace("error: ", "") in root_cause
    assert not (tmp_path / "run").exists() or not list((tmp_path / "run").glob("*.pt"))


def test_self_launch_prints_only_the_error_line(tmp_path):
    result = run_subprocess([sys.executable, "main_multi_gpu.py", "--multi-gpu", "ddp", "--device", "cpu",
                             "--nproc-per-node", "2", *TINY_DATA, "--dropout", "1", "--save-dir", tmp_path],
                            timeout=120)
    assert result.returncode == EXIT_USAGE
    assert result.stderr.strip().splitlines() == ["error: --dropout must be in [0, 1), got 1.0"]


def failing_main(argv):
    raise UsageError("--lr must be positive, got 0")


@pytest.mark.parametrize("local_rank, prints", [("0", True), ("1", False)])
def test_only_local_rank_zero_prints_and_every_rank_records(local_rank, prints, tmp_path, monkeypatch, capsys):
    error_file = tmp_path / "error.json"
    monkeypatch.setenv("LOCAL_RANK", local_rank)
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    monkeypatch.setattr(entry_point, "QUIET_RANK_EXIT_DELAY_S", 0.0)
    assert run_entry_point(failing_main, []) == EXIT_USAGE
    printed = capsys.readouterr().err
    assert printed == ("error: --lr must be positive, got 0\n" if prints else "")
    recorded = json.loads(error_file.read_text())["message"]
    assert recorded["message"] == "UsageError: --lr must be positive, got 0"
    assert int(recorded["extraInfo"]["timestamp"]) > 0
