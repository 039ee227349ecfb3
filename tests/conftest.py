"""Helpers shared by the tests: running the real entry points in-process or as subprocesses, and which tests
start processes (marked `slow`)."""
import contextlib
import inspect
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import types
from pathlib import Path

import pytest
import torch
from torch._inductor.runtime.cache_dir_utils import cache_dir as inductor_cache_dir

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from profiling.entry_points import env_without_torchrun  # noqa: E402  (the project is importable from here on)
from training.loop.epochs import one_intra_op_thread  # noqa: E402,F401  (test_strategies takes it from here)

# 17 training subjects x 32 windows = 544 windows: 17 full batches of 32, so every variant the
# equivalence tests compare sees exactly the same samples in each optimizer step.
# The model is pinned to cnn1d, the fastest on CPU: these runs test the trainer, not the default model.
# No PNGs (about a second a run, most of it matplotlib): the tests of the figures ask for them.
TINY_DATA = ["--dataset", "synthetic", "--synthetic-windows-per-subject", "32", "--model", "cnn1d", "--no-figures"]

# The environment of a child whose result cannot depend on how many intra-op threads compute it (what is
# compared is another run with the same setting, or what the run writes, not how fast). On the 2-core
# machines the suite runs on, the two threads of a process wait for each other at every operation
# whenever other work holds a core: a main.py run of 5 s took 20 to 35 s. torchrun gives its workers one.
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


@pytest.fixture
def one_thread():
    """ONE_THREAD for the runs made in this process during the test."""
    with one_intra_op_thread():
        yield


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
    from training.entry_point import run_entry_point
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


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    """A 30 s recording CSV of the synthetic stream (inference_fixtures), for predict.py's tests."""
    from inference_fixtures import synthetic_stream, write_csv
    return write_csv(tmp_path_factory.mktemp("recording") / "walk.csv", *synthetic_stream(30.0))


@pytest.fixture(scope="module")
def minirocket(tmp_path_factory):
    """A small random MiniRocket checkpoint with the keys predict.py reads (inference_fixtures)."""
    from inference_fixtures import make_checkpoint
    return make_checkpoint(tmp_path_factory.mktemp("ckpt") / "minirocket.pt", model="minirocket")


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


# What starts a process: the subprocess helpers, torchrun, the GPU check's step runner, the profiler's
# neighbour processes and --compile (whose compiler works in a pool of processes). A test that does, itself,
# through a fixture or through a helper of the tests (of its own module or imported from another), is marked
# `slow`; `make test-fast` (-m "not slow") leaves it out.
STARTS_A_PROCESS = re.compile(r"\brun_subprocess\(|\bsubprocess\.(?:run|Popen)\(|torch\.distributed\.run|"
                              r"\brun_step\(|\bNeighbours\(|\"--compile\"")
TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items):
    for item in items:
        module = item.module
        uses = [item.function, *(getattr(module, name, None) for name in item.fixturenames)]
        if any(starts_a_process(use, set()) for use in uses):
            item.add_marker(pytest.mark.slow)


def starts_a_process(function, seen):
    """Whether `function` (a test, a fixture, a helper), or a helper of the tests it names, starts a process."""
    function = getattr(function, "__wrapped__", function)  # a fixture's own function
    if not isinstance(function, types.FunctionType) or function in seen:
        return False
    seen.add(function)
    if STARTS_A_PROCESS.search(inspect.getsource(function)):
        return True
    helpers = (function.__globals__.get(name) for name in names_used(function.__code__))
    return any(starts_a_process(helper, seen) for helper in helpers if is_a_test_helper(helper))


def is_a_test_helper(function):
    """A function written in one of the tests' files (a test module, conftest.py, inference_fixtures.py)."""
    code = getattr(function, "__code__", None)
    return code is not None and Path(code.co_filename).resolve().parent == TESTS


def names_used(code):
    """The global names a function's code (its inner functions included) reads."""
    names = set(code.co_names)
    for inner in code.co_consts:
        if isinstance(inner, types.CodeType):
            names |= names_used(inner)
    return names


def pytest_addoption(parser):
    parser.addini("test_time_limit_s", "seconds each phase of a test (setup, call, teardown) may take before it "
                  "fails with its name; 0: no limit", default="0")


class TimeLimitExceeded(Exception):
    """A test, or one of its fixtures, ran past test_time_limit_s."""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    return (yield from within_time_limit(item, "setup"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    return (yield from within_time_limit(item, "call"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item):
    return (yield from within_time_limit(item, "teardown"))


def within_time_limit(item, phase):
    """Runs one phase of `item` under an alarm, so that a hung test fails with its name rather than stalling
    the suite. A subprocess the test waits on is killed by subprocess.run as the exception unwinds."""
    limit_s = float(item.config.getini("test_time_limit_s"))
    if not limit_s or not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        return (yield)

    def stop(signal_number, frame):
        raise TimeLimitExceeded(f"{item.nodeid} ({phase}) ran past {limit_s:g} s (test_time_limit_s, pyproject.toml)")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, limit_s)
    try:
        return (yield)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
