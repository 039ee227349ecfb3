"""The command line of the GPU check: parse, run the plan, write the JSON and the page."""
import argparse
import datetime
import json
import shlex
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks import entry_parser
from benchmarks import gpu_check as package
from benchmarks.gpu_check.machine import probe_machine, slug
from benchmarks.gpu_check.page import markdown_report
from benchmarks.gpu_check.plan import GROUP_BUDGET_S, build_plan
from benchmarks.gpu_check.runner import Budget, run_plan
from profiling.cli import comma_choices
from profiling.report import json_ready


def parse(argv):
    parser = entry_parser("benchmarks.gpu_check", package.__doc__)
    parser.add_argument("--out", default=None, help="output folder (default gpu_check/<gpu>-<date>)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: few steps and rounds, smaller epochs")
    parser.add_argument("--only", type=comma_choices(GROUP_BUDGET_S), default=list(GROUP_BUDGET_S),
                        help="comma-separated groups")
    parser.add_argument("--budget-s", type=float, default=sum(GROUP_BUDGET_S.values()),
                        help="seconds for all steps together")
    parser.add_argument("--dry-run", action="store_true", help="print the commands and exit")
    parser.add_argument("--allow-cpu", action="store_true", help=argparse.SUPPRESS)  # tests run the plan on CPU
    return parser.parse_args(argv)


def main(argv=None):
    opts = parse(argv)
    has_gpu = torch.cuda.is_available()
    if not (has_gpu or opts.allow_cpu or opts.dry_run):
        print(f"no CUDA GPU: torch {torch.__version__} sees none (torch.cuda.is_available() is False); run this "
              "on a machine with an NVIDIA GPU and a CUDA build of torch", file=sys.stderr)
        return 2
    device = "cpu" if opts.allow_cpu and not has_gpu else "cuda"  # a dry run shows the GPU plan anywhere
    started = datetime.datetime.now(datetime.timezone.utc)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch:
        plan = [step for step in build_plan(Path(scratch), device, opts.quick) if step.group in opts.only]
        if opts.dry_run:
            print("\n".join(shlex.join(step.command) for step in plan))
            return 0
        budget = Budget(GROUP_BUDGET_S, opts.budget_s)  # from here: the probe counts against the deadline too
        machine = probe_machine()
        print(f"gpu check on {machine.get('gpu') or device}: {len(plan)} steps in at most {opts.budget_s:.0f} s",
              flush=True)
        records = run_plan(plan, budget, device)
    result = {"machine": machine, "started": started.isoformat(timespec="seconds"), "quick": opts.quick,
              "device": device, "wall_s": (datetime.datetime.now(datetime.timezone.utc) - started).total_seconds(),
              "budget_s": opts.budget_s, "steps": records}
    out_dir = Path(opts.out or Path("gpu_check") / f"{slug(machine.get('gpu') or device)}-{started:%Y%m%d-%H%M}")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "gpu_check.json").write_text(json.dumps(json_ready(result), indent=2, allow_nan=False) + "\n")
    (out_dir / "gpu_check.md").write_text(markdown_report(result))
    print(f"wrote {out_dir / 'gpu_check.json'} and {out_dir / 'gpu_check.md'}")
    return 1 if any(record["status"] in ("failed", "timeout") for record in records) else 0


if __name__ == "__main__":
    sys.exit(main())
