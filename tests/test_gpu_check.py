"""benchmarks.gpu_check without a GPU: its plan, budgets, the recording of failed and hung steps, the
figures it reads from each step's output, the markdown page and the command line."""
import importlib.util
import itertools
import json
import os
import subprocess
import sys
import time
from argparse import Namespace
from pathlib import Path

import pytest
import torch

from benchmarks.gpu_check import __main__ as cli
from benchmarks.gpu_check import runner, throughput
from benchmarks.gpu_check.minirocket import FUSED, FUSED_SHARED_SUMS
from benchmarks.gpu_check.page import markdown_report
from benchmarks.gpu_check.plan import (
    COMPILE_VARIANTS,
    DEFAULT_GROUPS,
    FULL,
    GROUP_BUDGET_S,
    OVERHEAD_BATCHES,
    QUICK,
    Step,
    build_plan,
)
from benchmarks.gpu_check.runner import (
    REPO,
    TAIL_CHARS,
    Budget,
    parse_data_path,
    parse_epoch,
    parse_overhead,
    parse_profile,
    parse_pytest,
    parse_throughput,
    run_command,
    run_step,
)
from benchmarks.gpu_check.targets import target_rows
from training.entry_point import run_entry_point
from training.reporting.logger import INPUTS_LAP, SET_UP_LAP, PhaseClock


def flag(command, name):
    """The value after `name` in an argv list."""
    return command[command.index(name) + 1]


def python_step(tmp_path, code, group="epoch", name="fake", **extra):
    return Step(name, group, [sys.executable, "-c", code], output=tmp_path / "figures.json", **extra)


# ---------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------

def test_the_plan_runs_every_group_in_budget_order_with_the_documented_commands(tmp_path):
    plan = build_plan(tmp_path)
    assert list(dict.fromkeys(step.group for step in plan)) == list(GROUP_BUDGET_S)
    # The default groups measure every target in about 9 minutes, with 35 s for start-up and writing.
    assert "tests" not in DEFAULT_GROUPS and sum(GROUP_BUDGET_S[group] for group in DEFAULT_GROUPS) <= 505
    by_group = {group: [step for step in plan if step.group == group] for group in GROUP_BUDGET_S}
    (tests,) = by_group["tests"]
    # The first processes after the probe: main.py with its defaults, as the machine is found, then
    # writing Python's bytecode, then with it and Triton's kernel cache empty.
    cold = by_group["cold_start"]
    assert [step.group for step in plan if step.group in DEFAULT_GROUPS][0] == "cold_start"
    assert [step.params["bytecode"] for step in cold] == ["as found", "writing", "written"]
    for step in cold:
        assert step.command[1] == "main.py" and "--epochs" not in step.command and "--no-resume" in step.command
        assert "--dataset" not in step.command  # the built-in synthetic data
    assert [step.env for step in cold[:2]] == [{}, {"PYTHONDONTWRITEBYTECODE": None}]
    assert cold[2].env["PYTHONDONTWRITEBYTECODE"] is None
    assert Path(cold[2].env["TRITON_CACHE_DIR"]).is_relative_to(tmp_path)
    assert cold[2].shell_command().startswith(
        f"env -u PYTHONDONTWRITEBYTECODE TRITON_CACHE_DIR={cold[2].env['TRITON_CACHE_DIR']} {sys.executable} main.py")
    assert tests.command[1:8] == ["-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider"]
    assert tests.command[8:] == (["-n", "4"] if importlib.util.find_spec("xdist") else [])
    (matrix,) = by_group["profile"]  # the whole matrix in one process
    assert matrix.command[1:3] == ["-m", "benchmarks.gpu_check.throughput"]
    assert flag(matrix.command, "--device") == "cuda" and "--quick" not in matrix.command
    assert Path(flag(matrix.command, "--json")) == matrix.output and matrix.output.is_relative_to(tmp_path)
    assert matrix.partial and not matrix.cuda_only
    (minirocket,) = by_group["minirocket"]
    assert minirocket.command[1:3] == ["-m", "benchmarks.gpu_check.minirocket"]
    assert flag(minirocket.command, "--json") == str(minirocket.output) and "--block-shapes" in minirocket.command
    (trace,) = by_group["trace"]
    assert trace.command[1] == "profiler.py" and "--trace" in trace.command
    assert (flag(trace.command, "--model"), flag(trace.command, "--batch-size")) == ("cnn1d", "32")
    assert trace.output == Path(flag(trace.command, "--output-dir")) / "profile.json"
    (data_path,) = by_group["data_path"]
    assert data_path.command[1:3] == ["-m", "benchmarks.data_path"] and flag(data_path.command, "--device") == "cuda"
    assert flag(data_path.command, "--json") == str(data_path.output)
    nccl, gloo = by_group["ddp_profile"]
    assert flag(nccl.command, "--multi-gpu") == "ddp" and flag(nccl.command, "--nproc-per-node") == "1"
    assert (flag(gloo.command, "--nproc-per-node"), flag(gloo.command, "--backend"),
            flag(gloo.command, "--gpu-ids")) == ("2", "gloo", "0")
    for ddp in (nccl, gloo):
        assert ddp.output == Path(flag(ddp.command, "--output-dir")) / "profile.json"
    assert nccl.output != gloo.output
    (epoch,) = by_group["epoch"]
    assert epoch.command[1] == "main.py" and flag(epoch.command, "--epochs") == "1"
    assert "--synthetic-windows-per-subject" not in epoch.command  # the default has UCI HAR's size
    overhead = by_group["overhead"]
    assert {(s.params["batch_size"], s.params["compile"]) for s in overhead} == set(
        itertools.product(OVERHEAD_BATCHES, COMPILE_VARIANTS))
    for step in overhead:
        assert step.command[1:3] == ["-m", "benchmarks.overhead"]
        assert flag(step.command, "--json") == str(step.output)
        assert " ".join(COMPILE_VARIANTS[step.params["compile"]]) in " ".join(step.command)
    assert overhead[0].params["compile"] == "eager"  # the slow compiled ones last


def test_quick_shrinks_steps_rounds_and_data_but_keeps_the_grid(tmp_path):
    full, quick = build_plan(tmp_path), build_plan(tmp_path, quick=True)
    assert [step.name for step in full] == [step.name for step in quick]
    matrix = next(step for step in quick if step.group == "profile")
    assert "--quick" in matrix.command and flag(matrix.command, "--synthetic-windows-per-subject") == "64"
    opts = throughput.parse(["--json", "unused.json", "--quick"])
    assert (opts.warmup_steps, opts.steps, opts.repeats) == QUICK.profile and QUICK.profile < FULL.profile
    assert throughput.matrix() == throughput.matrix(opts.models, opts.batch_sizes, opts.precisions)
    overhead = next(step for step in quick if step.group == "overhead")
    assert flag(overhead.command, "--rounds") == "1"


def test_on_cpu_what_needs_cuda_is_skipped_not_failed(tmp_path):
    plan = build_plan(tmp_path, device="cpu")
    assert {step.name for step in plan if step.cuda_only} == {step.name for step in plan
                                                              if "reduce-overhead" in step.name or "gloo" in step.name
                                                              or "whole-step graphs" in step.name}
    step = next(step for step in plan if step.cuda_only)
    record = run_step(step, Budget(GROUP_BUDGET_S, 100), "cpu")
    assert record["status"] == "skipped" and record["why"] == "needs CUDA" and "wall_s" not in record


def test_the_minirocket_and_trace_steps_leave_their_figures_and_the_trace_is_kept(tmp_path):
    plan = {step.group: step for step in build_plan(tmp_path / "scratch", device="cpu", quick=True)}
    (tmp_path / "scratch").mkdir()
    # The groups' shares are a GPU's; on a CPU that other work keeps busy the trace outgrew its 20 s, so
    # each step here has the whole 300 s: what is tested is what the steps leave, not how fast.
    budget = dict.fromkeys(GROUP_BUDGET_S, 300)
    records = [run_step(plan[group], Budget(budget, 300), "cpu") for group in ("minirocket", "trace")]
    assert [record["status"] for record in records] == ["ok", "ok"], [record.get("tail") for record in records]
    minirocket, trace = (record["figures"] for record in records)
    assert set(minirocket["windows_per_s"]) == {"256", "1024"} and minirocket["fit_s"] > 0
    assert all(rate > 0 for ways in minirocket["windows_per_s"].values() for rate in ways.values())
    assert trace["steps"] == 3 and trace["step_ms"] > 0
    assert trace["kernels"] == 0 and trace["device_busy_ms"] == 0  # a CPU trace has no device work
    cli.keep_traces(records, tmp_path / "out")
    kept = tmp_path / "out" / trace["trace_file"]
    assert trace["trace_file"].startswith("trace/") and kept.is_file()
    assert "traceEvents" in json.loads(kept.read_text())
    page = markdown_report({**sample_result(), "steps": records})
    assert "| batch | fused kernel | fused kernel, shared sums | one bias at a time | all biases at once |" in page
    # The fused kernel runs on CUDA only: on a CPU its column says so, and nothing is compared.
    assert "| 1024 | not run |" in page and minirocket["fused_agreement"] is None
    assert minirocket["block_shapes"] == [] and "by block shape" not in page
    assert f"| {trace['step_ms']:.2f} | 0.00 | 0 |" in page


def test_the_page_lists_each_fused_kernels_block_shapes_fastest_first():
    shapes = [{"way": FUSED, "outputs_per_program": 2048, "warps": 4, "windows_per_s": 600_000.0, "same_counts": True},
              {"way": FUSED, "outputs_per_program": 4096, "warps": 8, "windows_per_s": 650_000.0, "same_counts": False},
              {"way": FUSED_SHARED_SUMS, "outputs_per_program": 1024, "warps": 4, "windows_per_s": 900_000.0,
               "same_counts": True}]
    step = record("minirocket transform", "minirocket", figures={
        "windows_per_s": {"8192": {FUSED: 614_000.0}}, "fit_s": 0.2, "features": 9996, "block_shapes": shapes})
    page = markdown_report({**sample_result(), "steps": [step]})
    assert (f"{FUSED} alone, by block shape (outputs a program x warps): 4096 x 8: 650,000 (counts differ), "
            "2048 x 4: 600,000.") in page
    assert f"{FUSED_SHARED_SUMS} alone, by block shape (outputs a program x warps): 1024 x 4: 900,000." in page


def test_trace_figures_count_device_work_and_runtime_calls_per_step(tmp_path):
    events = [{"name": "ProfilerStep#3", "dur": 4000.0}, {"name": "ProfilerStep#4", "dur": 2000.0},
              *({"cat": "kernel", "name": "k", "dur": 10.0} for _ in range(6)),
              {"cat": "gpu_memcpy", "name": "copy", "dur": 40.0},
              *({"cat": "cuda_runtime", "name": "cudaLaunchKernel", "dur": 5.0} for _ in range(8)),
              {"cat": "cpu_op", "name": "aten::mm", "dur": 900.0}]
    (tmp_path / "t.json").write_text(json.dumps({"traceEvents": events}))
    figures = runner.parse_trace(json.dumps({"trace_files": [str(tmp_path / "t.json")]}))
    assert figures == {"step_ms": 3.0, "device_busy_ms": 0.05, "kernels": 3.0, "runtime_calls": 4.0, "steps": 2,
                       "trace_file": str(tmp_path / "t.json")}


# ---------------------------------------------------------------------------
# Budgets, failures and hangs
# ---------------------------------------------------------------------------

class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_a_group_passes_its_unused_time_on_and_the_deadline_caps_all():
    clock = FakeClock()
    budget = Budget({"a": 10, "b": 5, "c": 100}, total_s=30, clock=clock)
    assert budget.limit_for("a") == 10
    clock.now = 4  # group a finished early: its 6 s go to b
    assert budget.limit_for("b") == 11
    clock.now = 6
    assert budget.limit_for("b") == 9  # the same group keeps its end
    clock.now = 15
    assert budget.limit_for("c") == 15  # 100 s asked, 15 s left of the 30


def test_a_step_with_no_time_left_is_skipped_without_running(tmp_path):
    marker = tmp_path / "ran"
    step = python_step(tmp_path, f"open({str(marker)!r}, 'w')")
    record = run_step(step, Budget({"epoch": 1.0}, 100), "cpu")
    assert record["status"] == "skipped" and record["why"] == "time budget spent"
    assert not marker.exists()


def test_a_failing_step_is_recorded_with_its_exit_code_and_stderr_tail(tmp_path):
    step = python_step(tmp_path, "import sys; print('half done'); sys.stderr.write('x' * 5000 + 'boom'); sys.exit(3)")
    record = run_step(step, Budget(GROUP_BUDGET_S, 100), "cpu")
    assert record["status"] == "failed" and record["returncode"] == 3
    assert record["tail"].endswith("boom") and len(record["tail"]) == TAIL_CHARS
    assert "figures" not in record and record["command"].endswith("sys.exit(3)'")


def test_a_step_that_exits_0_without_its_figures_counts_as_failed(tmp_path):
    record = run_step(python_step(tmp_path, "pass"), Budget(GROUP_BUDGET_S, 100), "cpu")
    assert record["status"] == "failed" and record["tail"].startswith("no figures: FileNotFoundError")


def test_a_failed_matrix_keeps_the_figures_it_wrote_before_failing(tmp_path):
    written = {"finished": False, "configurations": [
        {"model": "cnn1d", "batch_size": 32, "precision": "fp32", "status": "ok", "samples_per_s": 10.0},
        {"model": "cnn1d", "batch_size": 32, "precision": "bf16", "status": "not run"}]}
    code = (f"import json, sys; json.dump({written!r}, open({str(tmp_path / 'figures.json')!r}, 'w')); "
            "sys.exit('killed part-way')")
    record = run_step(python_step(tmp_path, code, group="profile", partial=True), Budget(GROUP_BUDGET_S, 100), "cpu")
    assert record["status"] == "failed" and "killed part-way" in record["tail"]
    assert [e["status"] for e in record["figures"]["configurations"]] == ["ok", "not run"]
    assert record["figures"]["finished"] is False


def test_a_hung_step_is_stopped_with_everything_it_started(tmp_path, monkeypatch):
    """The command ignores SIGTERM and starts a grandchild in a session of its own, as torchrun
    starts its workers; the timeout still ends both."""
    monkeypatch.setattr(runner, "GRACE_S", 0.5)
    pid_file = tmp_path / "grandchild.pid"
    code = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True); "
            f"open({str(pid_file)!r}, 'w').write(str(child.pid)); time.sleep(60)")
    started = time.monotonic()
    outcome, _ = run_command([sys.executable, "-c", code], timeout_s=3)
    assert outcome["status"] == "timeout" and outcome["returncode"] is None
    assert time.monotonic() - started < 20
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and alive(grandchild):
        time.sleep(0.05)
    assert not alive(grandchild)


def alive(pid):
    """True while `pid` runs (a zombie awaiting its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# ---------------------------------------------------------------------------
# Figures read from each step's output
# ---------------------------------------------------------------------------

PYTEST_OUTPUT = """\
..F.s
=========================== short test summary info ============================
SKIPPED [1] tests/test_cuda.py:40: needs two GPUs
FAILED tests/test_cuda.py::test_bf16 - assert 1 == 2
ERROR tests/test_cuda.py::test_ddp - RuntimeError: boom
1 failed, 3 passed, 1 skipped, 480 deselected, 1 error in 12.34s
"""


def test_pytest_counts_and_failures():
    figures = parse_pytest(PYTEST_OUTPUT)
    assert figures["counts"] == {"failed": 1, "passed": 3, "skipped": 1, "deselected": 480, "errors": 1}
    assert figures["failures"] == ["FAILED tests/test_cuda.py::test_bf16 - assert 1 == 2",
                                   "ERROR tests/test_cuda.py::test_ddp - RuntimeError: boom"]
    assert "short test summary" in figures["tail"]
    assert parse_pytest("27 passed in 80.00s\n") == {"counts": {"passed": 27}, "failures": [], "tail": ""}


def test_matrix_figures_from_what_the_throughput_module_writes(tmp_path):
    opts = throughput.parse(["--json", str(tmp_path / "t.json"), "--device", "cpu"])
    entries = [{"model": "cnn1d", "batch_size": 32, "precision": "fp32", "status": "ok", "samples_per_s": 1.5e4,
                "step_time_ms": 2.1, "peak_allocated_gib": float("nan"), "wall_s": 3.0},
               {"model": "cnn1d", "batch_size": 32, "precision": "bf16", "status": "not run"}]
    throughput.json_writer(opts.json, opts)(entries, False)
    figures = parse_throughput(Path(opts.json).read_text())
    assert figures["finished"] is False
    first, second = figures["configurations"]
    assert first["samples_per_s"] == 1.5e4 and first["peak_allocated_gib"] is None  # NaN is null in the file
    assert second["status"] == "not run" and second["samples_per_s"] is None


def profile_json(samples_per_s=1234.5, memory=None, backend=None):
    """The parts of profiler.py's profile.json the check reads (profiling/assemble.py, measure.py)."""
    memory = memory or [{"rank": 0, "peak_allocated_gib": 0.25, "peak_reserved_gib": 0.5}]
    summary = {"mean": 0.02, "std": 0.001}
    return json.dumps({"timing": {"samples_per_s": {"mean": samples_per_s, "std": 10.0}, "step_time_s": summary,
                                  "data_wait_share": {"mean": 0.01, "std": 0.0}},
                       "config": {"model": "cnn1d", "batch_size": 32, "precision": "bf16", "world_size": 1,
                                  "backend": backend},
                       "memory": {"what": "CUDA allocator peaks", "per_rank": memory}})


def test_ddp_profile_figures_match_what_the_profiler_writes():
    from profiling.assemble import RUN_KEYS
    assert {"samples_per_s", "step_time_s", "data_wait_share"} <= set(RUN_KEYS)
    figures = parse_profile(profile_json(backend="nccl"))
    assert figures["samples_per_s"] == 1234.5 and figures["step_time_ms"] == pytest.approx(20.0)
    assert figures["peak_memory_gib"] == 0.25 and figures["peak_reserved_gib"] == 0.5
    assert figures["memory_kind"] == "allocated" and figures["backend"] == "nccl"
    cpu = parse_profile(profile_json(memory=[{"rank": 0, "peak_rss_gib": 0.4}], backend="gloo"))
    assert cpu["peak_memory_gib"] == 0.4 and cpu["memory_kind"] == "rss" and cpu["backend"] == "gloo"
    assert parse_profile(profile_json(samples_per_s=None))["samples_per_s"] is None  # inf is null in the file
    page = markdown_report({**sample_result(), "steps": [record("ddp profile, 1 rank", "ddp_profile",
                                                                figures=figures)]})
    assert "| model | backend | ranks | samples/s | step ms | peak allocated GiB |" in page
    assert "| cnn1d | nccl | 1 | 1,234 | 20.00 | 0.250 |" in page


def test_overhead_figures_from_its_json_interface():
    text = json.dumps({"ratio": 0.97, "paired_ratio": 0.96, "rates": {"trainer": [90.0, 100.0, 95.0],
                                                                      "minimal": [100.0, 110.0, 99.0]},
                       "mode": "single", "target": 0.97})
    assert parse_overhead(text) == {"ratio": 0.97, "paired_ratio": 0.96, "rounds": 3,
                                    "trainer_samples_per_s": 95.0, "minimal_samples_per_s": 100.0}


def test_data_path_figures_from_what_benchmarks_data_path_writes():
    from benchmarks.data_path import figures
    opts = Namespace(model="cnn1d", batch_size=32, rounds=2, epochs_per_round=1, iteration_passes=5)
    written = figures(opts, torch.device("cpu"), {"device": [400.0, 600.0], "dataloader": [100.0, 100.0]},
                      {"device": [2000.0, 2200.0], "dataloader": [1000.0, 1000.0]})
    read = parse_data_path(json.dumps(written))
    assert read["device_samples_per_s"] == 2100.0 and read["dataloader_samples_per_s"] == 1000.0
    assert read["training_ratio"] == pytest.approx(2.1) and read["training_paired_ratio"] == pytest.approx(2.1)
    assert read["device_batches_per_s"] == 500.0 and read["iteration_ratio"] == pytest.approx(5.0)


def test_epoch_and_cold_start_figures_from_the_last_metrics_line_and_the_time_line():
    lines = [{"epoch": 1, "samples_per_s": 5000.0, "train_time_s": 1.5, "epoch_time_s": 2.0, "val_macro_f1": 0.8}]
    clock = PhaseClock()
    clock.laps = [(INPUTS_LAP, 0.25), (SET_UP_LAP, 3.0), ("training", 2.0), ("evaluation", 0.5)]
    clock.started_at_s = 1.25
    output = f"epoch 1/1 | ...\n{clock.line()}\nsaved\n"
    figures = parse_epoch("\n".join(map(json.dumps, lines)) + "\n", output)
    assert {key: figures[key] for key in ("samples_per_s", "train_time_s", "epoch_time_s", "val_macro_f1")} == {
        "samples_per_s": 5000.0, "train_time_s": 1.5, "epoch_time_s": 2.0, "val_macro_f1": 0.8}
    # As the line prints them, to a tenth of a second.
    assert (figures["start_up_s"], figures["inputs_s"], figures["set_up_s"]) == (1.2, 0.2, 3.0)
    cold = run_step(Step("cold", "cold_start", [sys.executable, "-c", f"print({clock.line()!r})"]),
                    Budget(GROUP_BUDGET_S, 100), "cpu")
    assert cold["status"] == "ok" and cold["figures"]["laps"] == {INPUTS_LAP: 0.2, SET_UP_LAP: 3.0, "training": 2.0,
                                                                  "evaluation": 0.5, "start-up": 1.2}
    bare = parse_epoch("\n".join(map(json.dumps, lines)) + "\n")  # a run from before the time line
    assert bare["start_up_s"] is None and bare["inputs_s"] is None and bare["set_up_s"] is None
    page = markdown_report({**sample_result(), "steps": [record("one epoch, main.py", "epoch", figures=bare,
                                                                wall_s=9.0)]})
    assert "| 9.0 | n/a | n/a | n/a | 2.0 | 5,000 | 0.800 |" in page and "closing time line" not in page


# ---------------------------------------------------------------------------
# The markdown page and the command line
# ---------------------------------------------------------------------------

def record(name, group, status="ok", params=None, figures=None, **extra):
    return {"name": name, "group": group, "params": params or {}, "command": "python x", "status": status,
            "figures": figures, **extra}


def configuration(precision, status="ok", **figures):
    return {"model": "cnn1d", "batch_size": 32, "precision": precision, "status": status, **figures}


def sample_result():
    matrix = record("throughput matrix", "profile", "failed", returncode=1, tail="cnn1d bs32 fp16: failed: ...",
                    figures={"finished": True, "configurations": [
                        configuration("fp32", samples_per_s=12345.6, peak_allocated_gib=0.05,
                                      timed_peak_allocated_gib=0.04),
                        configuration("bf16", samples_per_s=12345.6, peak_allocated_gib=0.05),  # a file from before
                        configuration("fp16", "failed", why="OutOfMemoryError: CUDA out of memory.")]})
    tests = record("pytest -m cuda", "tests", "failed", figures={"counts": {"passed": 20, "failed": 1},
                                                                 "failures": ["FAILED tests/test_cuda.py::test_x"]})
    overhead = record("overhead bs8 eager", "overhead", params={"batch_size": 8, "compile": "eager"},
                      figures={"trainer_samples_per_s": 900.0, "minimal_samples_per_s": 1000.0, "ratio": 0.9,
                               "paired_ratio": 0.91})
    return {"machine": {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.13.0+cu130", "cuda": "13.0", "gpu_count": 1,
                        "cpu": "Example CPU 9000", "cpu_cores": 16},
            "started": "2026-11-23T14:00:00+00:00", "quick": False, "device": "cuda", "wall_s": 512.3,
            "steps": [tests, matrix, overhead]}


def test_markdown_page_has_a_table_per_group_and_the_failures():
    page = markdown_report(sample_result())
    assert page.startswith("# GPU check: NVIDIA H100 80GB HBM3, 2026-11-23")
    assert "16 CPU cores (Example CPU 9000)" in page  # host-bound steps move with the host: name it
    assert "20 passed, 1 failed" in page and "- `FAILED tests/test_cuda.py::test_x`" in page
    assert "| model | batch | fp32 | bf16 | fp16 |" in page
    assert "| cnn1d | 32 | 12,346 (0.050 / 0.040) | 12,346 (0.050) | failed |" in page
    assert "- cnn1d bs32 fp16: failed: OutOfMemoryError: CUDA out of memory." in page
    assert "| 8 | eager | 900 | 1,000 | 0.900 | 0.910 |" in page
    assert "Data path" not in page  # groups that did not run leave no empty table
    assert "| throughput matrix | failed | 1 |" in page and "cnn1d bs32 fp16: failed: ..." in page


def test_a_matrix_that_left_no_figures_has_no_table_only_its_failure():
    result = sample_result()
    result["steps"][1] = record("throughput matrix", "profile", "timeout", tail="CUDA init hung")
    page = markdown_report(result)
    assert "Training-step throughput" not in page and "| throughput matrix | timeout | None |" in page


def test_the_machine_probe_names_the_host_cpu(tmp_path, monkeypatch):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: Example\nmodel name\t: Example CPU 9000 @ 2.0GHz\n\n"
                       "processor\t: 1\nmodel name\t: Example CPU 9000 @ 2.0GHz\n")
    assert cli.cpu_model(cpuinfo) == "Example CPU 9000 @ 2.0GHz"
    monkeypatch.setattr(cli.platform, "processor", lambda: "aarch64")
    cpuinfo.write_text("processor\t: 0\nBogoMIPS\t: 50.00\n")  # an ARM host's file names no model
    assert cli.cpu_model(cpuinfo) == "aarch64"
    assert cli.cpu_model(tmp_path / "absent") == "aarch64"
    info = cli.machine_info()
    assert info["cpu_cores"] == os.cpu_count() and "cpu" in info


def test_no_gpu_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["--out", str(tmp_path / "out")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("no CUDA GPU: ") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_a_dry_run_prints_the_plan_without_a_gpu(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["--dry-run", "--only", "overhead"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(OVERHEAD_BATCHES) * len(COMPILE_VARIANTS)
    assert all("-m benchmarks.overhead --device cuda" in line for line in lines)


def test_the_default_check_leaves_the_cuda_tests_to_a_command_of_their_own(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["--dry-run"]) == 0
    plan = capsys.readouterr().out
    assert "-m pytest" not in plan and "-m benchmarks.gpu_check.throughput" in plan
    assert cli.main(["--dry-run", "--only", "tests"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert " -m pytest -q -m cuda " in line


def test_the_shell_wrapper_runs_the_package_from_any_folder(tmp_path):
    result = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh"), "--dry-run", "--only", "profile"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHON": sys.executable})
    assert result.returncode == 0, result.stderr
    (line,) = result.stdout.splitlines()
    assert " -m benchmarks.gpu_check.throughput --device cuda --json " in line


def test_an_unknown_group_is_refused(capsys):
    assert run_entry_point(cli.main, ["--only", "profile,warp-drive"]) == 2
    assert capsys.readouterr().err.startswith("error: argument --only: unknown 'warp-drive'")


def test_the_whole_run_writes_one_json_and_one_page_and_records_a_failure(tmp_path, monkeypatch, capsys):
    figures = {"ratio": 1.0, "paired_ratio": 1.0, "rates": {"trainer": [1.0], "minimal": [1.0]}}
    writes = f"import json, sys; json.dump({figures!r}, open(sys.argv[1], 'w'))"

    def fake_plan(scratch, device, quick, cold_data):
        return [Step("overhead bs8 eager", "overhead", [sys.executable, "-c", writes, str(scratch / "o.json")],
                     {"batch_size": 8, "compile": "eager"}, scratch / "o.json"),
                Step("overhead bs32 eager", "overhead", [sys.executable, "-c", "raise SystemExit('no GPU here')"],
                     {"batch_size": 32, "compile": "eager"}, scratch / "never.json")]
    monkeypatch.setattr(cli, "build_plan", fake_plan)
    monkeypatch.setattr(cli, "probe_machine", lambda: {"gpu": None, "torch": torch.__version__})
    assert cli.main(["--allow-cpu", "--out", str(tmp_path)]) == 1
    assert sorted(os.listdir(tmp_path)) == ["gpu_check.json", "gpu_check.md"]
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert [step["status"] for step in result["steps"]] == ["ok", "failed"]
    assert result["steps"][0]["figures"]["trainer_samples_per_s"] == 1.0
    assert "no GPU here" in result["steps"][1]["tail"]
    assert "| overhead bs32 eager | failed | 1 |" in (tmp_path / "gpu_check.md").read_text()
    assert f"wrote {tmp_path / 'gpu_check.json'}" in capsys.readouterr().out


def test_the_cold_start_trains_on_the_windows_it_is_given(tmp_path):
    fold = tmp_path / "outer-fold.npz"
    for step in [step for step in build_plan(tmp_path, cold_data=fold) if step.group == "cold_start"]:
        assert flag(step.command, "--dataset") == "npz" and flag(step.command, "--data-dir") == str(fold)
    assert all("--data-dir" not in step.command for step in build_plan(tmp_path, cold_data=fold)
               if step.group != "cold_start")


def test_cold_data_that_is_not_there_is_refused_before_anything_runs(tmp_path, capsys):
    assert run_entry_point(cli.main, ["--cold-data", str(tmp_path / "missing.npz"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --cold-data") and err.count("\n") == 1 and "no such file" in err


def test_a_step_sets_and_removes_its_own_variables(tmp_path, monkeypatch):
    monkeypatch.setenv("HAR_CHECK_REMOVED", "1")
    monkeypatch.setenv("HAR_CHECK_KEPT", "2")
    code = ("import os; print(os.environ.get('HAR_CHECK_REMOVED'), os.environ.get('HAR_CHECK_KEPT'), "
            "os.environ['HAR_CHECK_SET'])")
    step = Step("variables", "cold_start", [sys.executable, "-c", code],
                env={"HAR_CHECK_REMOVED": None, "HAR_CHECK_SET": "3"})
    outcome, stdout = run_command(step.command, 30, runner.step_env(step))
    assert outcome["status"] == "ok" and stdout.split() == ["None", "2", "3"]
    assert step.shell_command().startswith("env -u HAR_CHECK_REMOVED HAR_CHECK_SET=3 ")


def test_each_target_stands_beside_its_figure_and_says_whether_it_is_met():
    ways = {"256": {FUSED: 9e6, "one bias at a time": 1e5},  # below batch 1,024: not the target's
            "1024": {FUSED: 1.5e6, FUSED_SHARED_SUMS: 2e6, "one bias at a time": 1.2e5, "all biases at once": 1.1e5}}
    matrix = [configuration("fp32", samples_per_s=20_000.0), configuration("bf16", samples_per_s=30_000.0),
              {**configuration("fp32", samples_per_s=160_000.0), "model": "minirocket"},
              {**configuration("fp32", samples_per_s=900_000.0), "batch_size": 256}]
    steps = [record("cold main.py, defaults", "cold_start", wall_s=9.5, params={"bytecode": "as found"},
                    figures={"laps": {INPUTS_LAP: 0.5, "training": 3.0, "start-up": 2.0}}),
             record("cold main.py, bytecode writing", "cold_start", wall_s=8.5, params={"bytecode": "writing"},
                    figures={"laps": {"start-up": 1.5}}),
             record("cold main.py, bytecode written", "cold_start", wall_s=7.5, params={"bytecode": "written"},
                    figures={"laps": {"start-up": 1.0}}),
             record("throughput matrix", "profile", figures={"configurations": matrix}),
             record("minirocket transform", "minirocket", figures={
                 "windows_per_s": ways,
                 "fused_agreement": {"windows_equal_share": 0.999, "features_differing_share": 2e-5},
                 "shared_sums_agreement": {"windows_equal_share": 0.998, "features_differing_share": 3e-5}}),
             record("overhead bs32 eager", "overhead", params={"batch_size": 32, "compile": "eager"},
                    figures={"trainer_samples_per_s": 14_000.0, "ratio": 0.933}),
             record("overhead bs32 reduce-overhead", "overhead", "skipped",
                    params={"batch_size": 32, "compile": "reduce-overhead"})]
    assert target_rows(steps) == [
        ["MiniRocket transform, fused kernel, batch >= 1,024 (windows/s)",
         "2,000,000 (fused kernel, shared sums; reference 120,000; 99.80% of windows with features equal to the "
         "reference's)", ">= 1,000,000", "yes"],
        ["cnn1d training step, batch 32 (samples/s)", "30,000 (best: eager bf16)", ">= 100,000", "no"],
        ["minirocket training step, batch 32 (samples/s)", "160,000 (best: eager fp32)", ">= 150,000", "yes"],
        ["trainer / minimal loop, batch 32, both eager", "0.933", ">= 0.970", "no"],
        ["trainer / minimal loop, batch 32, both reduce-overhead", "skipped", ">= 0.970", "-"],
        ["cold `python main.py`, its defaults, first run of the check (s)",
         f"9.5 ({INPUTS_LAP} 0.5, training 3.0, start-up 2.0)", "<= 8.0", "no"],
        ["the same with Python's bytecode written, as pip installs torch, and Triton's cache empty (s)",
         "7.5 (start-up 1.0)", "<= 8.0", "yes"]]
    page = markdown_report({**sample_result(), "steps": steps})
    assert "| trainer / minimal loop, batch 32, both eager | 0.933 | >= 0.970 | no |" in page
    assert f"| 9.5 ({INPUTS_LAP} 0.5, training 3.0, start-up 2.0) | <= 8.0 | no |" in page
    assert "99.90% of windows with every feature equal, 0.0020% of features differing" in page
    # A check where nothing ran still names every target, without a figure.
    assert [row[1:] for row in target_rows([])] == [
        ["no fused figure (not run)", ">= 1,000,000", "-"], ["not measured (not run)", ">= 100,000", "-"],
        ["not measured (not run)", ">= 150,000", "-"], ["not run", "<= 8.0", "-"], ["not run", "<= 8.0", "-"]]
