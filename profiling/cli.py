"""The profiler's command line: the training flags plus a profiler group, and their checks."""
import math

from outputs.safety import check_output_folder
from profiling.entry_points import comma_counts
from profiling.report import DEFAULT_ROOT
from profiling.topology import DEFAULT_LINKS, INTER_NODE, INTRA_NODE, LINK_PRESETS, plan_flag
from training.config.checks import check_at_least
from training.config.cli import build_parser, parse_with_config
from training.config.settings import SHARDED_OR_DDP, RunConfig
from training.distributed.strategy import distributed_env
from training.errors import UsageError


def build_profiler_parser():
    parser = build_parser(multi_gpu=True)
    parser.prog = "profiler.py"
    parser.description = ("Time the training step of a HAR model (warm-up, measured steps, repeats), break it "
                          "into phases, benchmark the gradient all-reduce and predict multi-GPU scaling. "
                          "Takes the training flags; --epochs and the checkpoint flags are accepted but unused.")
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
    add_topology_flags(parser.add_argument_group(
        "scaling advisor", "the cluster the predictions are for; each link is a bus bandwidth and a latency per "
        "ring step, from a flag, else measured by a run of 2+ ranks (inside their node), else a preset (assumed): "
        + "; ".join(f"{name} {p.bandwidth_gbps:g} GB/s, {p.latency_us:g} us ({p.what})"
                    for name, p in LINK_PRESETS.items())))
    return parser


def add_topology_flags(group):
    group.add_argument("--plan", type=plan_flag, default=None, metavar="NODESxGPUS",
                       help="the cluster you plan to train on, e.g. 2x8: 2 nodes of 8 GPUs (or CPU processes); "
                            "sets --gpus-per-node and the count the advice is for")
    group.add_argument("--gpus-per-node", type=int, default=None,
                       help="ranks that share a node (and its fast link); if unset: this machine's visible GPUs, "
                            "or for CPU processes its cores / the threads of one process")
    group.add_argument("--predict-gpus", type=comma_counts, default=None,
                       help="comma-separated world sizes (GPUs, or CPU processes on CPU) to predict; 1 is always "
                            "shown; if unset: --plan's count, else this run's world size, else one full node")
    defaults = {side: ", ".join(f"{links[i]} on {device}" for device, links in DEFAULT_LINKS.items())
                for i, side in enumerate(("intra", "inter"))}
    group.add_argument("--intra-node", choices=INTRA_NODE, default=None,
                       help=f"the preset link between ranks of one node; if unset: {defaults['intra']}")
    group.add_argument("--inter-node", choices=INTER_NODE, default=None,
                       help=f"the preset link between nodes (a node's NICs together); if unset: {defaults['inter']}")
    group.add_argument("--intra-node-gbps", "--assumed-bandwidth-gbps", type=float, default=None,
                       help="bus bandwidth inside a node in GB/s (gigaBYTES, 1e9 bytes/s), over the preset and "
                            "over what a run of 2+ ranks measures")
    group.add_argument("--inter-node-gbps", type=float, default=None,
                       help="bus bandwidth between nodes in GB/s, all of a node's NICs together (8 NICs of "
                            "InfiniBand NDR: 400)")
    group.add_argument("--intra-node-latency-us", "--assumed-latency-us", type=float, default=None,
                       help="latency per ring step inside a node, in microseconds")
    group.add_argument("--inter-node-latency-us", type=float, default=None,
                       help="latency per ring step between nodes, in microseconds")


def parse_profiler_args(argv):
    args = parse_with_config(build_profiler_parser(), argv)
    args.run = RunConfig.from_flags(vars(args)).validate()  # the training settings, typed as the trainer takes them
    vars(args).update(args.run.flags())  # in their canonical form where the profiler reads them as flags
    check_at_least(("--steps", args.steps, 1), ("--repeats", args.repeats, 1), ("--warmup-steps", args.warmup_steps, 0),
                   ("--phase-steps", args.phase_steps, 0), ("--allreduce-iters", args.allreduce_iters, 1),
                   ("--predict-gpus", args.predict_gpus or [], 1),
                   ("--gpus-per-node", [] if args.gpus_per_node is None else args.gpus_per_node, 1))
    check_topology_flags(args)
    if args.multi_gpu == "dp":
        raise UsageError("the profiler measures one device, DDP or FSDP; DataParallel has no exchange to "
                         "separate (use --multi-gpu ddp)")
    if args.multi_gpu not in SHARDED_OR_DDP and distributed_env()[2] > 1:
        raise UsageError("under torchrun the profiler needs --multi-gpu ddp or fsdp")
    if args.output_dir is not None and not args.output_dir.strip():  # Path('') would be this folder
        raise UsageError("--output-dir is empty; name a folder, or leave the flag out for profiles/<run>")
    if args.output_dir:  # refused now rather than after the whole measurement
        check_output_folder(args.output_dir, "--output-dir")
    args.command_line = list(argv)  # what the host-sharing neighbours run
    return args


def check_topology_flags(args):
    for scope in ("intra", "inter"):
        bandwidth, latency = getattr(args, f"{scope}_node_gbps"), getattr(args, f"{scope}_node_latency_us")
        if bandwidth is not None and not 0 < bandwidth < math.inf:  # NaN fails too
            raise UsageError(f"--{scope}-node-gbps must be a positive number, got {bandwidth}")
        if latency is not None and not 0 <= latency < math.inf:
            raise UsageError(f"--{scope}-node-latency-us must be zero or more, got {latency}")
    if args.plan and args.gpus_per_node and args.gpus_per_node != args.plan[1]:
        raise UsageError(f"--plan {args.plan[0]}x{args.plan[1]} puts {args.plan[1]} on a node but --gpus-per-node says "
                         f"{args.gpus_per_node}; drop one of them")
