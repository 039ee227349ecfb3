"""The check's plan: which commands run, in which order, in which time budget, with their figures where."""
import importlib.util
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

# The throughput matrix, measured in one process by benchmarks.gpu_check.throughput.
BATCH_SIZES = (32, 256, 1024)
PRECISIONS = {"fp32": ["--no-amp"], "bf16": ["--amp", "--amp-dtype", "bf16"], "fp16": ["--amp", "--amp-dtype", "fp16"]}
OVERHEAD_BATCHES = (32,)  # the step-rate targets' batch (8 as well took 100 s more)
COMPILE_VARIANTS = {"eager": [], "whole-step graphs": ["--cuda-graphs"], "compile": ["--compile"],
                    "reduce-overhead": ["--compile-mode", "reduce-overhead"]}
GRAPH_VARIANTS = ("reduce-overhead", "whole-step graphs")  # CUDA only
# Seconds per group, in running order; what a group leaves unused passes to the next. Each is what
# the group took in the first run on an NVIDIA H200 (torch 2.11, 2026-11-26) with some room (the
# overhead group none, to keep the default groups within 510 s then): the matrix's 36 configurations in
# one process 87 s, the data path 19, the one-rank DDP profile 21, the epoch 16, the overhead
# benchmarks 239 (each compiled variant compiles the model twice, trainer and minimal loop, before
# its rounds). The second run took 62, 13, 14, 9 and 184 s for those, and 6 s for MiniRocket's
# transform, 16 for the two gloo ranks and 9 for the trace: 317 s in all. The default groups fit
# 505 s, so that one check measures every target of the GPU issue in about 9 minutes with start-up
# and writing: the cold start (main.py with its defaults, first of all, after only the machine
# probe) and the overhead at batch 32 alone, with 30 s more for its whole-step graph variant (no
# compilation: about an eager variant's time). The cold start runs main.py three times (COLD_STARTS;
# 46.0 s for the three on the nested fold by hand on an H200, 2026-11-27). MiniRocket's group has 20 s
# more for --block-shapes (each of its 8 kernel-and-shape pairs compiles up to four block sizes), taken
# from the trace (9 s in the second run) and the DDP profiles (30 s for both there).
GROUP_BUDGET_S = {"tests": 420, "cold_start": 75, "profile": 100, "minirocket": 60, "data_path": 25,
                  "ddp_profile": 40, "epoch": 25, "trace": 20, "overhead": 160}
# The CUDA tests ran past 190 s one at a time (stopped after 19 of 34) and took 105 s four at a time,
# so they are a group of their own, asked for by name (--only tests): the rest fits one ten-minute
# command with start-up to spare.
DEFAULT_GROUPS = tuple(group for group in GROUP_BUDGET_S if group != "tests")
# pytest-xdist, where installed, runs the CUDA tests four at a time: each spends most of its
# seconds starting a process or a CUDA context, not on the GPU.
PARALLEL_TESTS = ["-n", "4"] if importlib.util.find_spec("xdist") else []
# No single step of these may eat its whole group: a hung one would skip every later one.
STEP_LIMIT_S = {"overhead": 150}


@dataclass(frozen=True)
class Effort:
    profile: tuple  # (warm-up steps, measured steps, repeats) of each throughput configuration and the DDP profile
    rounds: int  # benchmark rounds per side
    passes: int  # data_path's bare-iteration passes per round
    windows: tuple = ()  # data flags: () keeps the synthetic default, UCI HAR's size


FULL = Effort(profile=(10, 30, 2), rounds=3, passes=5)
QUICK = Effort(profile=(2, 5, 1), rounds=1, passes=1, windows=("--synthetic-windows-per-subject", "64"))


@dataclass
class Step:
    name: str
    group: str
    command: list
    params: dict = field(default_factory=dict)
    output: Path = None  # the file it writes its figures to (None: they come on stdout)
    env: dict = field(default_factory=dict)  # variables set for its process; None removes one
    cuda_only: bool = False  # refused on CPU by design; skipped there, not failed
    partial: bool = False  # writes its figures as it goes: read them even after a failure or time-out

    def shell_command(self):
        """The command as a shell would run it, the variables it sets or removes (env) first."""
        changes = [part for name, value in self.env.items()
                   for part in (["-u", name] if value is None else [f"{name}={value}"])]
        return shlex.join((["env", *changes] if changes else []) + [str(part) for part in self.command])


# How the cold start's main.py finds Python's bytecode. An image may ship torch without it and set
# PYTHONDONTWRITEBYTECODE, so that every process compiles the source of each module it imports; pip
# writes the bytecode when it installs torch. So: the machine as it is; then a run that writes it (as
# pip would have); then a run with it and Triton's kernel cache empty, a pip-installed machine's first.
COLD_STARTS = ("as found", "writing", "written")


def cold_start_env(bytecode, scratch):
    """The variables of one cold start's process (None: removed)."""
    if bytecode == "as found":
        return {}
    env = {"PYTHONDONTWRITEBYTECODE": None}
    if bytecode == "written":
        env["TRITON_CACHE_DIR"] = str(scratch / "fresh-triton-cache")
    return env


def build_plan(scratch, device="cuda", quick=False, cold_data=None):
    """Every step of the check, in running order; figures go under `scratch`. `cold_data`: an .npz of
    windows the cold start trains on (main.py --dataset npz), else the built-in synthetic data."""
    effort, python = (QUICK if quick else FULL), sys.executable
    warmup, measured, repeats = effort.profile
    timing = ["--warmup-steps", str(warmup), "--steps", str(measured), "--repeats", str(repeats), "--phase-steps", "0"]
    steps = [Step("pytest -m cuda", "tests", [python, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider",
                                                       *PARALLEL_TESTS])]
    data = ["--dataset", "npz", "--data-dir", str(cold_data)] if cold_data else list(effort.windows)
    for bytecode in COLD_STARTS:
        steps.append(Step("cold main.py, defaults" + ("" if bytecode == "as found" else f", bytecode {bytecode}"),
                          "cold_start", [python, "main.py", "--device", device, "--no-resume", *data,
                                         *(["--epochs", "1"] if quick else []),
                                         "--save-dir", str(scratch / f"cold-run-{bytecode.replace(' ', '-')}")],
                          {"bytecode": bytecode}, env=cold_start_env(bytecode, scratch)))
    matrix = scratch / "throughput.json"
    steps.append(Step("throughput matrix", "profile", [
        python, "-m", "benchmarks.gpu_check.throughput", "--device", device, *(["--quick"] if quick else []),
        *effort.windows, "--json", str(matrix)], output=matrix, partial=True))
    steps.append(Step("minirocket transform", "minirocket", [
        python, "-m", "benchmarks.gpu_check.minirocket", "--device", device, "--rounds", str(effort.rounds + 2),
        *(["--windows", "1024", "--batch-sizes", "256,1024"] if quick else ["--block-shapes"]),
        "--json", str(scratch / "minirocket.json")],
        output=scratch / "minirocket.json"))
    steps.append(Step("data path", "data_path", [
        python, "-m", "benchmarks.data_path", "--device", device, "--rounds", str(effort.rounds),
        "--iteration-passes", str(effort.passes), *effort.windows, "--json", str(scratch / "data_path.json")],
        output=scratch / "data_path.json"))
    steps.append(Step("ddp profile, 1 rank", "ddp_profile", [
        python, "profiler.py", "--multi-gpu", "ddp", "--nproc-per-node", "1", "--device", device,
        *timing, "--output-dir", str(scratch / "ddp-profile")],
        output=scratch / "ddp-profile" / "profile.json"))
    # Two ranks sharing the one GPU over gloo (NCCL refuses that): what multi-rank code costs there.
    steps.append(Step("ddp profile, 2 gloo ranks on one GPU", "ddp_profile", [
        python, "profiler.py", "--multi-gpu", "ddp", "--nproc-per-node", "2", "--backend", "gloo", "--gpu-ids", "0",
        "--device", device, *timing, "--output-dir", str(scratch / "ddp-gloo-profile")],
        output=scratch / "ddp-gloo-profile" / "profile.json", cuda_only=True))
    steps.append(Step("one epoch, main.py", "epoch", [
        python, "main.py", "--device", device, "--epochs", "1", "--no-resume", *effort.windows,
        "--save-dir", str(scratch / "epoch-run")], output=scratch / "epoch-run" / "metrics.jsonl"))
    # Where the time of one small eager step goes (the launch-bound regime the step-rate targets are in).
    steps.append(Step("trace cnn1d bs32", "trace", [
        python, "profiler.py", "--model", "cnn1d", "--batch-size", "32", "--device", device, "--trace", *timing,
        *effort.windows, "--output-dir", str(scratch / "trace-profile")],
        output=scratch / "trace-profile" / "profile.json"))
    for variant, flags in COMPILE_VARIANTS.items():  # the compiled ones last: they are the slow ones
        for batch in OVERHEAD_BATCHES:
            # In a folder that exists: the benchmark makes none.
            path = scratch / f"overhead-bs{batch}-{variant.replace(' ', '-')}.json"
            steps.append(Step(f"overhead bs{batch} {variant}", "overhead", [
                python, "-m", "benchmarks.overhead", "--device", device, "--batch-size", str(batch), "--rounds",
                str(effort.rounds), *effort.windows, *flags, "--json", str(path)],
                {"batch_size": batch, "compile": variant}, path, cuda_only=variant in GRAPH_VARIANTS))
    return steps
