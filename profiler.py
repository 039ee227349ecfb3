"""Profile the training step: timing, phases, memory, all-reduce cost and multi-GPU predictions. See README.md."""

from profiling.cli import parse_profiler_args
from profiling.measure import PerformanceProfiler
from profiling.report import format_summary, write_profile
from training.config.settings import SHARDED_OR_DDP
from training.distributed.launch import launch_arguments, run_torchrun
from training.entry_point import exit_process, launched_by_torchrun, run_entry_point
from training.run_inputs import check_data

__all__ = ["PerformanceProfiler", "main"]


def main(argv):
    args = parse_profiler_args(argv)
    check_data(args.run)  # before any process group, so a data error fails alike on every rank
    if args.multi_gpu in SHARDED_OR_DDP and not launched_by_torchrun():
        # Re-run this command under torchrun on this machine; the first failed worker's exit code.
        return run_torchrun(launch_arguments(args.run, __file__, argv))
    profiler = PerformanceProfiler(args)
    profile = profiler.run()
    if profiler.is_main:
        paths = write_profile(profile, profiler.output_dir)
        print(format_summary(profile))
        print("wrote " + ", ".join(str(path) for path in paths), flush=True)
    return 0


if __name__ == "__main__":
    exit_process(run_entry_point(main))
