"""A stand-in for another rank on the same host: trains the profiled step, alone, until stopped.

`python -m profiling.neighbour <profiler flags>` builds the workload the profiler measures, warms
it up, prints READY and then takes optimizer steps until it is terminated. It joins no process
group: it only occupies the cores (and memory bandwidth) another rank would.
"""
import signal
import sys

from profiling.cli import parse_profiler_args
from profiling.workload import build_workload, optimizer_step
from training.distributed.strategy import make_strategy

READY = "READY"


def main(argv):
    # Neighbours are stopped by SIGTERM; leaving through Python removes the workload's scratch --save-dir.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    args = parse_profiler_args(argv)
    work = build_workload(args, make_strategy(args.run))
    for _ in range(args.warmup_steps):
        optimizer_step(work, sync_gradients=True)
    print(READY, flush=True)
    while True:
        optimizer_step(work, sync_gradients=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
