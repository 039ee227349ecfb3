"""The profiler's command line: the training flags plus a profiler group, and their checks."""
import math

from profiling.entry_points import comma_counts
from profiling.report import DEFAULT_ROOT
from training.config.cli import build_parser, parse_with_config
from training.config.settings import SHARDED_OR_DDP, RunConfig, check_at_least
from training.distributed.strategy import distributed_env
from training.errors import UsageError
from training.output_folders import check_folder_can_be_made

# Links assumed when one process has no process group to measure (bus bandwidth, latency per ring
# step). CUDA: PCIe 4.0 x16 without NVLink, which NCCL drives at roughly 20 GB/s bus bandwidth
# (NVLink parts reach hundreds: pass --assumed-bandwidth-gbps). CPU: gloo between two processes
# on one machine over loopback TCP; the 2-core development machine measured 0.1 to 1.5 GB/s and
# 0.5 to 1.4 ms per ring step for 0.35 to 14 MB buffers, each call after 20 ms of busy time as a
# step makes it (profiling/allreduce_bench.py; back to back the median call gave 65 to 70 us).
ASSUMED_LINKS = {"cuda": {"bandwidth_gbps": 20.0, "latency_us": 5.0},
                 "cpu": {"bandwidth_gbps": 0.5, "latency_us": 800.0}}


def build_profiler_parser():
    parser = build_parser(multi_gpu=True)
    parser.prog = "profiler.py"
    parser.description = ("Time the training step of a HAR model (warm-up, measured steps, repeats), break it "
                          "into phases, benchmark the gradient all-reduce and predict multi-GPU scaling. "
                          "Takes the training flags; --epochs and the checkpoint flags are accepted but unused.")
    assumed = {key: ", ".join(f"{d} {v[key]:g}" for d, v in ASSUMED_LINKS.items()) for key in ASSUMED_LINKS["cpu"]}
    group = parser.add_argument_group("profiler")
    group.add_argument("--warmup-steps", type=int, default=20, help="optimizer steps run once before the first "
                       "repeat and not counted (with DDP as many again under no_sync)")
    group.add_argument("--steps", type=int, default=100, help="measured optimizer steps per repeat")
    group.add_argument("--repeats", type=int, default=3, help="measured runs; figures are mean +- std over them")
    group.add_argument("--phase-steps", type=int, default=20, help="steps of the separate phase-breakdown pass "
                       "(forward/backward/optimizer/all-reduce); 0 skips it")
    group.add_argument("--allreduce-iters", type=int, default=50,
                       help="timed calls of each collective and size (after 5 untimed; the mean counts; on "
                            "CPU each after the step's busy time between two collectives), with 2+ processes")
    group.add_argument("--assumed-bandwidth-gbps", type=float, default=None,
                       help="all-reduce bus bandwidth in GB/s (gigaBYTES, 1e9 bytes/s) for the predictions; "
                            f"if unset: measured with 2+ processes, else {assumed['bandwidth_gbps']}")
    group.add_argument("--assumed-latency-us", type=float, default=None,
                       help="all-reduce latency per ring step in microseconds; if unset: measured with 2+ "
                            f"processes, else {assumed['latency_us']}")
    group.add_argument("--predict-gpus", type=comma_counts, default=[1, 2, 4, 8],
                       help="comma-separated GPU counts to predict the step time and speedup for")
    group.add_argument("--output-dir", default=None,
                       help=f"where profile.json and the CSV files go; if unset: {DEFAULT_ROOT}/<configuration>")
    group.add_argument("--bare-step", action="store_true",
                       help="time the step without augmentation, weight average, label smoothing and loss "
                            "tally; by default the profiler times the step the training flags describe, as "
                            "main.py runs it")
    group.add_argument("--trace", action="store_true",
                       help="also write a short torch.profiler trace per rank to <output-dir>/trace: "
                            "tensorboard --logdir there (needs the torch-tb-profiler plugin), or open the "
                            "*.pt.trace.json in ui.perfetto.dev or chrome://tracing")
    return parser


def parse_profiler_args(argv):
    args = parse_with_config(build_profiler_parser(), argv)
    args.run = RunConfig.from_flags(vars(args)).validate()  # the training settings, typed as the trainer takes them
    vars(args).update(args.run.flags())  # in their canonical form where the profiler reads them as flags
    check_at_least(("--steps", args.steps, 1), ("--repeats", args.repeats, 1), ("--warmup-steps", args.warmup_steps, 0),
                   ("--phase-steps", args.phase_steps, 0), ("--allreduce-iters", args.allreduce_iters, 1),
                   ("--predict-gpus", args.predict_gpus, 1))
    bandwidth, latency = args.assumed_bandwidth_gbps, args.assumed_latency_us
    if bandwidth is not None and not 0 < bandwidth < math.inf:  # NaN fails too
        raise UsageError(f"--assumed-bandwidth-gbps must be a positive number, got {bandwidth}")
    if latency is not None and not 0 <= latency < math.inf:
        raise UsageError(f"--assumed-latency-us must be zero or more, got {latency}")
    if args.multi_gpu == "dp":
        raise UsageError("the profiler measures one device, DDP or FSDP; DataParallel has no exchange to "
                         "separate (use --multi-gpu ddp)")
    if args.multi_gpu not in SHARDED_OR_DDP and distributed_env()[2] > 1:
        raise UsageError("under torchrun the profiler needs --multi-gpu ddp or fsdp")
    if args.output_dir is not None and not args.output_dir.strip():  # Path('') would be this folder
        raise UsageError("--output-dir is empty; name a folder, or leave the flag out for profiles/<run>")
    if args.output_dir:  # refused now rather than after the whole measurement
        check_folder_can_be_made(args.output_dir, "--output-dir")
    args.command_line = list(argv)  # what the host-sharing neighbours run
    return args
