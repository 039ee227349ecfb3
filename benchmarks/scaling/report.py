"""Run profiler.py for every model x per-GPU batch x world size, then write the scaling table, report and figures.

Run from the repository root: python -m benchmarks.scaling.report
"""
import itertools
import json
import shlex
import sys
import time
from pathlib import Path

from benchmarks.scaling.figures import write_figures
from benchmarks.scaling.tables import write_csv, write_latex, write_text_report
from models import MODELS
from profiling.entry_points import (
    at_least,
    comma_choices,
    comma_counts,
    entry_parser,
    env_without_torchrun,
    run_in_repo,
)
from profiling.report import PROFILE_JSON
from profiling.scaling import scaling_rows
from training.config.settings import check_at_least
from training.entry_point import run_entry_point


def build_parser():
    parser = entry_parser("benchmarks.scaling.report", __doc__)
    parser.add_argument("--out", default="profiles/scaling", help="report, table, figures and runs/")
    parser.add_argument("--models", type=comma_choices(MODELS), default=["cnn1d", "transformer"])
    parser.add_argument("--batch-sizes", type=comma_counts, default=[32, 128], help="per GPU / process")
    parser.add_argument("--world-sizes", type=comma_counts, default=[1, 2],
                        help="processes (GPUs); above 1 they run under torchrun with --multi-gpu ddp")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--threads-per-rank", type=int, default=1,
                        help="CPU only: OMP_NUM_THREADS of every run, the 1-process baseline included, so "
                             "N processes use N times the cores of one (as N GPUs would)")
    parser.add_argument("--warmup-steps", type=int, default=10)
    parser.add_argument("--steps", type=at_least(1), default=40)
    parser.add_argument("--repeats", type=at_least(1), default=3)
    parser.add_argument("--phase-steps", type=int, default=10)
    parser.add_argument("--predict-gpus", type=comma_counts, default=[1, 2, 4, 8],
                        help="GPU counts for the extrapolation figure")
    parser.add_argument("--profiler-args", default="",
                        help="more profiler.py flags for every run, as one quoted string, e.g. '--norm group'")
    parser.add_argument("--reuse", action="store_true",
                        help="keep the profile.json of configurations already under <out>/runs")
    return parser


def main(argv):
    args = build_parser().parse_args(argv)
    check_at_least(("--batch-sizes", args.batch_sizes, 1), ("--world-sizes", args.world_sizes, 1),
                   ("--threads-per-rank", args.threads_per_rank, 1))
    output_dir = Path(args.out)
    configurations = list(itertools.product(args.models, args.batch_sizes, args.world_sizes))
    profiles, started = [], time.perf_counter()
    for index, (model, batch_size, world_size) in enumerate(configurations, start=1):
        run_dir = output_dir / "runs" / f"{model}_bs{batch_size}_{world_size}proc"
        print(f"[{index}/{len(configurations)}] {model}, batch {batch_size}, {world_size} process(es) "
              f"({time.perf_counter() - started:.0f} s so far)", flush=True)
        profiles.append(profile_of(args, ["--model", model, "--batch-size", str(batch_size)], world_size, run_dir))
    rows = scaling_rows(profiles)
    written = [write_csv(rows, output_dir / "scaling_summary.csv"),
               write_latex(rows, output_dir / "scaling_table.tex"),
               write_text_report(rows, profiles, args, output_dir / "performance_report.txt"),
               *write_figures(rows, profiles, args.predict_gpus, output_dir)]
    print((output_dir / "performance_report.txt").read_text())
    print(f"done in {time.perf_counter() - started:.0f} s; wrote " + ", ".join(map(str, written)))
    return 0


def profile_of(args, configuration, world_size, run_dir, parallel=("--multi-gpu", "ddp")):
    """The profile of profiler.py for one configuration (its flags), under torchrun with the `parallel`
    flags when world_size > 1, or the one under run_dir with --reuse."""
    if args.reuse and (run_dir / PROFILE_JSON).is_file():
        return json.loads((run_dir / PROFILE_JSON).read_text())
    flags = [*configuration, "--device", args.device,
             "--warmup-steps", str(args.warmup_steps), "--steps", str(args.steps), "--repeats", str(args.repeats),
             "--phase-steps", str(args.phase_steps), "--output-dir", str(run_dir),
             *shlex.split(args.profiler_args)]
    if world_size == 1:
        command = [sys.executable, "profiler.py", *flags]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world_size}",
                   "profiler.py", *parallel, *flags]
    env = env_without_torchrun(OMP_NUM_THREADS=str(args.threads_per_rank))  # ignored by CUDA kernels, decisive on CPU
    run_in_repo(command, env)
    return json.loads((run_dir / PROFILE_JSON).read_text())


if __name__ == "__main__":
    sys.exit(run_entry_point(main))
