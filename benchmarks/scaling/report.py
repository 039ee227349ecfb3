"""Run profiler.py for every model x per-GPU batch x world size, then write the scaling table, report and figures.

With --rounds K each configuration's world sizes are profiled K times in turn (A B, B A, ...), each
round with its own profiles: the tables and figures are the first round's, and the advisor check
sets every round's measured speedup beside the 1-process profile's own prediction (from its assumed
links, what the profiler tells a user who ran nothing else) and beside the prediction with the
N-rank run's measured link.

Run from the repository root: python -m benchmarks.scaling.report
"""
import itertools
import json
import shlex
import sys
import time
from pathlib import Path

from benchmarks.scaling.figures import write_figures
from benchmarks.scaling.tables import advisor_check, write_csv, write_latex, write_text_report
from models import MODELS
from profiling.entry_points import (
    at_least,
    comma_choices,
    comma_counts,
    entry_parser,
    env_without_torchrun,
    run_in_repo,
)
from profiling.interleave import interleave
from profiling.report import PROFILE_JSON
from profiling.scaling import scaling_rows
from training.config.checks import check_at_least
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
    parser.add_argument("--rounds", type=at_least(1), default=1,
                        help="profile each configuration's world sizes this many times, in turn (A B, B A, ...)")
    parser.add_argument("--reuse", action="store_true",
                        help="keep the profile.json of configurations already under <out>/runs")
    return parser


def main(argv):
    args = build_parser().parse_args(argv)
    check_at_least(("--batch-sizes", args.batch_sizes, 1), ("--world-sizes", args.world_sizes, 1),
                   ("--threads-per-rank", args.threads_per_rank, 1))
    output_dir = Path(args.out)
    configurations = list(itertools.product(args.models, args.batch_sizes))
    rounds, started = [[] for _ in range(args.rounds)], time.perf_counter()

    def side(model, batch_size, world_size):
        def profile(round_index):
            print(f"round {round_index + 1} of {args.rounds}: {model}, batch {batch_size}, {world_size} process(es) "
                  f"({time.perf_counter() - started:.0f} s so far)", flush=True)
            run_dir = output_dir / "runs" / f"round{round_index + 1}" / f"{model}_bs{batch_size}_{world_size}proc"
            return profile_of(args, ["--model", model, "--batch-size", str(batch_size)], world_size, run_dir)
        return profile

    for model, batch_size in configurations:
        sides = {n: side(model, batch_size, n) for n in args.world_sizes}
        for round_index, (results, _) in enumerate(interleave(sides, args.rounds)):
            rounds[round_index] += [results[n] for n in args.world_sizes]
    profiles = rounds[0]
    rows = scaling_rows(profiles)
    written = [write_csv(rows, output_dir / "scaling_summary.csv"),
               write_latex(rows, output_dir / "scaling_table.tex"),
               write_text_report(rows, profiles, args, output_dir / "performance_report.txt"),
               *write_figures(rows, profiles, args.predict_gpus, output_dir)]
    check = advisor_check([scaling_rows(each) for each in rounds])
    with open(output_dir / "performance_report.txt", "a") as handle:
        handle.write(check + "\n")
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
             "--predict-gpus", ",".join(map(str, sorted({*args.predict_gpus, *args.world_sizes}))),
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
