"""Helpers shared by the tests: running the real entry points in-process or as subprocesses."""
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from torch._inductor.runtime.cache_dir_utils import cache_dir as inductor_cache_dir

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from profiling.entry_points import env_without_torchrun  # noqa: E402  (the project is importable from here on)

# 17 training subjects x 32 windows = 544 windows: 17 full batches of 32, so every variant the
# equivalence tests compare sees exactly the same samples in each optimizer step.
# The model is pinned to cnn1d, the fastest on CPU: these runs test the trainer, not the default model.
# No PNGs (about a second a run, most of it matplotlib): the tests of the figures ask for them.
TINY_DATA = ["--dataset", "synthetic", "--synthetic-windows-per-subject", "32", "--model", "cnn1d", "--no-figures"]


@pytest.fixture(autouse=True, scope="session")
def session_temp_dir(tmp_path_factory):
    """The temporary directory of this process and of every child, removed when the session ends.

    torchrun's agent makes a torchelastic_* log folder for each launch and never removes it; one
    folder here catches those of every launch (in this process or a child's) without each test
    passing a --log-dir."""
    tmp_path_factory.getbasetemp()  # pytest's tmp_path folders stay where pytest keeps and rotates them
    inductor_cache_dir()  # pins the compile cache (and its env variable) where it was: warm across sessions
    previous = os.environ.get("TMPDIR"), tempfile.tempdir
    folder = tempfile.mkdtemp(prefix="har-tests-")
    os.environ["TMPDIR"] = tempfile.tempdir = folder
    yield Path(folder)
    tempfile.tempdir = previous[1]
    if previous[0] is None:
        os.environ.pop("TMPDIR")
    else:
        os.environ["TMPDIR"] = previous[0]
    shutil.rmtree(folder, ignore_errors=True)


def run_in_process(script, argv):
    """Call main.py / main_multi_gpu.py's main through the same wrapper as the command line.

    Returns (exit code, stdout, stderr)."""
    import main as single_entry
    import main_multi_gpu as multi_entry
    from training.errors import run_entry_point
    module = {"main.py": single_entry, "main_multi_gpu.py": multi_entry}[script]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = run_entry_point(module.main, list(map(str, argv)))
        except SystemExit as exc:  # argparse errors
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def run_subprocess(command, timeout=300, env=None):
    """Run a command from the repository root with a clean environment for torchrun."""
    full_env = env_without_torchrun(**(env or {}))
    return subprocess.run([str(part) for part in command], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=full_env)


def load_checkpoint(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def read_metrics(save_dir):
    return [json.loads(line) for line in (Path(save_dir) / "metrics.jsonl").read_text().splitlines()]


def max_abs_difference(state_a, state_b):
    assert state_a.keys() == state_b.keys()
    return max((state_a[k].double() - state_b[k].double()).abs().max().item()
               for k in state_a if state_a[k].is_floating_point())


# Marked as well as skipped, so that `pytest -m cuda` on a GPU machine selects every CUDA test.
CUDA_MARKS = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def requires_cuda(test):
    for mark in CUDA_MARKS:
        test = mark(test)
    return test


class CudaFailuresAtOnce:
    """Prints a CUDA test's failure the moment it happens. A GPU is lent for minutes: a run stopped
    at its time limit never reaches pytest's closing summary, and its log would say only 'F'."""

    def __init__(self, terminal):
        self.terminal = terminal

    def pytest_runtest_logreport(self, report):
        if report.failed and "cuda" in report.keywords:
            self.terminal.write_line(f"\nFAILED {report.nodeid} ({report.when}):\n{report.longreprtext}")


@pytest.hookimpl(trylast=True)  # after pytest has made its terminal reporter
def pytest_configure(config):
    terminal = config.pluginmanager.get_plugin("terminalreporter")
    if terminal is not None:
        config.pluginmanager.register(CudaFailuresAtOnce(terminal))
