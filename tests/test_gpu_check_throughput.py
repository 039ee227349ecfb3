"""benchmarks/gpu_check/throughput.py, the whole throughput matrix in one process: its grid and the profiler
flags it builds, a failure per configuration, the refusal of bad flags, one tiny CPU run through the runner,
and its single load of the data."""
import itertools
import json
import sys

import torch

from benchmarks.gpu_check import throughput
from benchmarks.gpu_check.page import markdown_report
from benchmarks.gpu_check.plan import BATCH_SIZES, FULL, GROUP_BUDGET_S, PRECISIONS, QUICK, Step
from benchmarks.gpu_check.runner import Budget, parse_throughput, run_step
from models import MODELS
from test_gpu_check import sample_result
from training.entry_point import run_entry_point

TINY_MATRIX = ["--device", "cpu", "--quick", "--models", "cnn1d", "--batch-sizes", "16", "--precisions", "fp32,fp16",
               "--synthetic-windows-per-subject", "8"]


def test_the_matrix_covers_every_model_batch_and_precision_with_the_profilers_flags():
    configurations = throughput.matrix()
    wanted = set(itertools.product(MODELS, BATCH_SIZES, PRECISIONS))
    assert {(c.model, c.batch_size, c.precision) for c in configurations} == wanted
    assert len(configurations) == len(wanted) == 36
    opts = throughput.parse(["--json", "unused.json"])
    assert (opts.device, (opts.warmup_steps, opts.steps, opts.repeats)) == ("cuda", FULL.profile)
    for config in configurations:
        args = throughput.profiler_args(config, opts)  # what profiler.py would parse from the same flags
        assert (args.model, args.batch_size, args.device) == (config.model, config.batch_size, "cuda")
        assert (args.amp, args.amp_dtype) == {"fp32": (False, None), "bf16": (True, "bf16"),
                                              "fp16": (True, "fp16")}[config.precision]
        assert args.phase_steps == 0 and args.multi_gpu == "none"


def test_the_matrix_records_each_failure_in_one_line_writes_as_it_goes_and_goes_on(tmp_path, monkeypatch):
    out = tmp_path / "matrix" / "throughput.json"
    seen_on_disk = []

    def fake_measure(args, load_data):
        seen_on_disk.append([e["status"] for e in json.loads(out.read_text())["configurations"]])
        if args.batch_size == 64 and args.amp_dtype == "bf16":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.\nGPU 0 has ...")
        return {"samples_per_s": 1000.0 * args.batch_size, "step_time_ms": 1.0, "peak_allocated_gib": 0.5}
    monkeypatch.setattr(throughput, "measure", fake_measure)
    argv = ["--json", str(out), "--device", "cpu", "--models", "cnn1d", "--batch-sizes", "32,64",
            "--precisions", "fp32,bf16"]
    assert throughput.main(argv) == 1  # a failed configuration fails the step, after the whole matrix
    matrix = json.loads(out.read_text())
    assert matrix["finished"] is True and matrix["device"] == "cpu" and matrix["steps"] == FULL.profile[1]
    assert [(e["batch_size"], e["precision"], e["status"]) for e in matrix["configurations"]] == [
        (32, "fp32", "ok"), (32, "bf16", "ok"), (64, "fp32", "ok"), (64, "bf16", "failed")]
    assert matrix["configurations"][3]["why"] == "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    assert seen_on_disk == [["not run"] * 4, ["ok"] + ["not run"] * 3, ["ok", "ok", "not run", "not run"],
                            ["ok", "ok", "ok", "not run"]]


def test_bad_matrix_flags_are_refused_in_one_line_before_anything_runs(tmp_path, capsys):
    out = tmp_path / "throughput.json"
    assert throughput.main(["--json", str(out), "--device", "cpu", "--models", "cnn1d,resnet9000"]) == 2
    assert capsys.readouterr().err.count("\n") == 1 and not out.exists()
    assert run_entry_point(throughput.main, ["--json", str(out), "--precisions", "fp8"]) == 2
    assert capsys.readouterr().err.count("\n") == 1 and not out.exists()


def test_a_tiny_matrix_on_cpu_measures_and_skips_fp16(tmp_path):
    """The real module in its own process, through the runner: what the check does on a GPU."""
    out = tmp_path / "throughput.json"
    step = Step("throughput matrix", "profile",
                [sys.executable, "-m", "benchmarks.gpu_check.throughput", *TINY_MATRIX, "--json", str(out)],
                output=out, partial=True)
    record = run_step(step, Budget(GROUP_BUDGET_S, 120), "cpu")
    assert record["status"] == "ok", record.get("tail")
    written = json.loads(out.read_text())
    assert written["finished"] is True and (written["steps"], written["repeats"]) == QUICK.profile[1:]
    fp32, fp16 = written["configurations"]
    assert (fp32["model"], fp32["batch_size"], fp32["precision"], fp32["status"]) == ("cnn1d", 16, "fp32", "ok")
    assert fp32["samples_per_s"] > 0 and fp32["step_time_ms"] > 0 and fp32["peak_allocated_gib"] is None
    assert fp32["timed_peak_allocated_gib"] is None
    assert fp16["status"] == "skipped" and "fp16 needs CUDA" in fp16["why"]
    assert record["figures"] == parse_throughput(out.read_text())
    page = markdown_report({**sample_result(), "steps": [record]})
    assert f"| cnn1d | 16 | {fp32['samples_per_s']:,.0f} (n/a) | not run | skipped |" in page
    assert "- cnn1d bs16 fp16: skipped: UsageError: --amp-dtype fp16 needs CUDA" in page


def test_the_matrix_loads_its_data_once_and_hands_it_to_every_configuration(monkeypatch):
    from data.sources import load_har_data
    loads = []

    def counted_load(**options):
        loads.append(options)
        return load_har_data(**options)
    monkeypatch.setattr(throughput, "load_har_data", counted_load)
    opts = throughput.parse(["--json", "unused.json", *TINY_MATRIX])
    entries = throughput.run_matrix(throughput.matrix(["cnn1d"], [16, 8], ["fp32"]), opts, lambda *_: None)
    assert [entry["status"] for entry in entries] == ["ok", "ok"]
    assert len(loads) == 1 and loads[0]["synthetic_windows_per_subject"] == 8
