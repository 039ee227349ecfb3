"""How long a collective takes when it follows busy host time, as in a training step, against back to back.

Run under torchrun with 2+ ranks on one machine (gloo on CPU):
    torchrun --standalone --nproc_per_node=2 -m benchmarks.collective_gap
For each busy time before the call and each buffer, prints the median and the mean of the calls (each
as the rank that arrived last saw it) and the share of calls over --slow-ms. The profiler times its
collectives after the step's busy time and takes the mean (profiling/allreduce_bench.py); this shows
why on the machine at hand.
"""
import statistics

import torch

from benchmarks import entry_parser
from profiling.allreduce_bench import all_reduce_call, timed_calls_s
from training.config.settings import distributed_env
from training.distributed.ddp import DistributedStrategy
from training.errors import UsageError, exit_process, run_entry_point


def main(argv=None):
    parser = entry_parser("benchmarks.collective_gap", __doc__)
    parser.add_argument("--gaps-ms", default="0,1,5,15,50", help="busy host time before each call")
    parser.add_argument("--elements", default="1,86982",
                        help="fp32 elements per all-reduce; 86,982 is the default transformer's gradients")
    parser.add_argument("--iterations", type=int, default=100, help="timed calls of each gap and buffer")
    parser.add_argument("--slow-ms", type=float, default=1.5, help="a call over this counts as slow")
    opts = parser.parse_args(argv)
    gaps_s = [float(part) / 1e3 for part in opts.gaps_ms.split(",")]
    sizes = [int(part) for part in opts.elements.split(",")]
    if distributed_env()[2] < 2:
        raise UsageError("run it under torchrun with 2+ processes: torchrun --standalone --nproc_per_node=2 "
                         "-m benchmarks.collective_gap")
    strategy = DistributedStrategy("cpu", "gloo", None, False, 120)
    try:
        for gap_s in gaps_s:
            for elements in sizes:
                calls_s = timed_calls_s(strategy, all_reduce_call(elements, torch.float32, strategy),
                                        opts.iterations, gap_s)
                if strategy.is_main:
                    slow = sum(call_s * 1e3 > opts.slow_ms for call_s in calls_s) / len(calls_s)
                    print(f"after {gap_s * 1e3:4g} ms busy, {elements * 4 / 1e6:6.3f} MB: median "
                          f"{statistics.median(calls_s) * 1e3:5.2f} ms, mean {statistics.fmean(calls_s) * 1e3:5.2f} "
                          f"ms, {slow:4.0%} of calls over {opts.slow_ms:g} ms", flush=True)
    finally:
        strategy.close()
    return 0


if __name__ == "__main__":
    exit_process(run_entry_point(main))
