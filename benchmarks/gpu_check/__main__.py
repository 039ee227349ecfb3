"""One command for a lent GPU: a cold `python main.py` with its defaults, the training-step throughput
of every model x batch x precision, MiniRocket's transform (fused and reference), the two data paths,
DDP profiles (one NCCL rank, two gloo ranks sharing the GPU), one UCI-sized epoch end to end, a
torch.profiler trace of one small eager step and the trainer's overhead (eager, compiled, CUDA
graphs), each step in its own time budget so that the whole check fits in about nine minutes; one JSON
and one markdown table out, the trace under trace/, and each target of the GPU work printed beside
its figure (benchmarks/gpu_check/targets.py). The CUDA tests are a group of their own
(`--only tests`; 105 s on an H200 four at a time): run them as a command of their own.

    python -m benchmarks.gpu_check [--out DIR] [--quick] [--only GROUP,...] [--budget-s S] [--cold-data NPZ]
                                   [--dry-run]

A step that fails, hangs or leaves no figures is recorded with the tail of its output and the check
goes on. Exit code: 0 no step failed, 1 some step failed or timed out (both write the files), 2 no GPU.
"""
import argparse
import datetime
import json
import os
import platform
import re
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks.gpu_check.page import markdown_report
from benchmarks.gpu_check.plan import DEFAULT_GROUPS, GROUP_BUDGET_S, build_plan
from benchmarks.gpu_check.runner import Budget, run_command, run_plan
from benchmarks.gpu_check.targets import target_lines
from profiling.entry_points import comma_choices, entry_parser, env_without_torchrun
from profiling.report import json_ready
from training.entry_point import run_entry_point


def main(argv=None):
    parser = entry_parser("benchmarks.gpu_check", __doc__)
    parser.add_argument("--out", default=None, help="output folder (default gpu_check/<gpu>-<date>)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: few steps and rounds, smaller epochs")
    parser.add_argument("--only", type=comma_choices(GROUP_BUDGET_S), default=list(DEFAULT_GROUPS),
                        help=f"comma-separated groups of {', '.join(GROUP_BUDGET_S)} (default: all but tests)")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="seconds for all steps together (default: the sum of the chosen groups' shares)")
    parser.add_argument("--cold-data", default=None, metavar="NPZ",
                        help="an .npz of windows for the cold start's main.py (--dataset npz; default: the built-in "
                             "synthetic data), e.g. a nested outer fold of your recordings")
    parser.add_argument("--dry-run", action="store_true", help="print the commands and exit")
    parser.add_argument("--allow-cpu", action="store_true", help=argparse.SUPPRESS)  # tests run the plan on CPU
    opts = parser.parse_args(argv)
    if opts.cold_data is not None and not Path(opts.cold_data).is_file():
        parser.error(f"--cold-data {opts.cold_data}: no such file; give the .npz of windows main.py should train on")
    if opts.budget_s is None:
        opts.budget_s = float(sum(GROUP_BUDGET_S[group] for group in opts.only))
    has_gpu = torch.cuda.is_available()
    if not (has_gpu or opts.allow_cpu or opts.dry_run):
        print(f"no CUDA GPU: torch {torch.__version__} sees none (torch.cuda.is_available() is False); run this "
              "on a machine with an NVIDIA GPU and a CUDA build of torch", file=sys.stderr)
        return 2
    device = "cpu" if opts.allow_cpu and not has_gpu else "cuda"  # a dry run shows the GPU plan anywhere
    started = datetime.datetime.now(datetime.timezone.utc)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch:
        cold_data = Path(opts.cold_data).resolve() if opts.cold_data else None  # the steps run from the repository
        plan = [step for step in build_plan(Path(scratch), device, opts.quick, cold_data) if step.group in opts.only]
        if opts.dry_run:
            print("\n".join(step.shell_command() for step in plan))
            return 0
        budget = Budget(GROUP_BUDGET_S, opts.budget_s)  # from here: the probe counts against the deadline too
        machine = probe_machine()
        print(f"gpu check on {machine.get('gpu') or device}: {len(plan)} steps in at most {opts.budget_s:.0f} s",
              flush=True)
        records = run_plan(plan, budget, device)
        out_dir = Path(opts.out or Path("gpu_check") / f"{slug(machine.get('gpu') or device)}-{started:%Y%m%d-%H%M}")
        out_dir.mkdir(parents=True, exist_ok=True)
        keep_traces(records, out_dir)
    result = {"machine": machine, "started": started.isoformat(timespec="seconds"), "quick": opts.quick,
              "device": device, "wall_s": (datetime.datetime.now(datetime.timezone.utc) - started).total_seconds(),
              "budget_s": opts.budget_s, "steps": records}
    (out_dir / "gpu_check.json").write_text(json.dumps(json_ready(result), indent=2, allow_nan=False) + "\n")
    (out_dir / "gpu_check.md").write_text(markdown_report(result))
    print("\n".join(target_lines(records)))
    print(f"wrote {out_dir / 'gpu_check.json'} and {out_dir / 'gpu_check.md'}")
    return 1 if any(record["status"] in ("failed", "timeout") for record in records) else 0


def keep_traces(records, out_dir):
    """Trace files move from the scratch folder to out_dir/trace/; their records name them from out_dir."""
    for record in records:
        figures = record.get("figures") or {}
        if figures.get("trace_file"):
            kept = out_dir / "trace" / Path(figures["trace_file"]).name
            kept.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(figures["trace_file"], kept)
            figures["trace_file"] = str(kept.relative_to(out_dir))


def machine_info():
    """Versions and the GPU. Run in a child process, so the check itself never holds a CUDA context."""
    info = {"host": platform.node(), "python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "cpu": cpu_model(), "cpu_cores": os.cpu_count(), "gpu": None}
    if torch.cuda.is_available():
        properties = torch.cuda.get_device_properties(0)
        info.update(gpu=torch.cuda.get_device_name(0), gpu_count=torch.cuda.device_count(),
                    gpu_memory_gib=round(properties.total_memory / 2**30, 1),
                    compute_capability=f"{properties.major}.{properties.minor}", cudnn=torch.backends.cudnn.version())
        try:
            info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except (AttributeError, RuntimeError):
            info["nccl"] = None
    return info


def cpu_model(cpuinfo=Path("/proc/cpuinfo")):
    """The host CPU's model name where Linux says it, else whatever platform knows: small GPU steps
    are bound by the host, so two runs on the same GPU differ with it."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def probe_machine():
    probe = "import json; from benchmarks.gpu_check.__main__ import machine_info; print(json.dumps(machine_info()))"
    outcome, stdout = run_command([sys.executable, "-c", probe], 60, env_without_torchrun())
    info = json.loads(stdout) if outcome["status"] == "ok" else {"error": outcome.get("tail", outcome["status"])}
    outcome, commit = run_command(["git", "rev-parse", "--short", "HEAD"], 10)
    info["commit"] = commit.strip() if outcome["status"] == "ok" else None
    return info


def slug(text):
    return re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-") or "unknown"


if __name__ == "__main__":
    sys.exit(run_entry_point(main))
